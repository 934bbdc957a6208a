"""``python -m trainers.serve --model PATH``: see :mod:`trainers.serve.app`."""

from trainers.serve.app import main

main()
