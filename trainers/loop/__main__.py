"""``python -m trainers.loop CONFIG.yaml``: see :mod:`trainers.loop.cli`."""

from trainers.loop.cli import main

raise SystemExit(main())
