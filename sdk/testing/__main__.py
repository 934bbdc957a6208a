"""``python -m sdk.testing``: serve the scripted server in the foreground (see :func:`sdk.testing.main`)."""

from sdk.testing._server import main

if __name__ == "__main__":
    raise SystemExit(main())
