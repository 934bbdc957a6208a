"""``python -m sdk.gateway``: see :func:`sdk.gateway.main`."""

from sdk.gateway._cli import main

raise SystemExit(main())
