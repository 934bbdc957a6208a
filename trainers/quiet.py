"""Silence third-party progress bars, logs and warnings through those libraries' own switches.

The main job and the loop print their own lines (a table row per round); transformers' "Loading weights" /
"Writing model shards" bars, TRL's per-step log dicts and the libraries' deprecation notices would land
between them. tracerl's own progress bars (``sdk.rollout``, the exporter) are not touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

__all__ = ["quiet_libraries"]

# Warnings raised from inside these packages are theirs to fix, not the user's.
_THIRD_PARTY = r"(transformers|trl|accelerate|datasets|peft|torch|huggingface_hub)(\..*)?$"


def quiet_libraries() -> None:
    """Turn off transformers', datasets' and huggingface_hub's progress bars and their info/warning logs.

    Only what is installed is touched; errors still print. Process-wide and idempotent. A library this
    process has not imported yet is not imported for this (``datasets`` and ``transformers`` cost 1.5 s
    together, paid again by every process the loop spawns to run agents): its own environment switches
    are set instead (``setdefault``: a value the user set wins), which it reads when it is imported, here
    or in a child process.

    Example:
        >>> quiet_libraries()
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if "transformers" in sys.modules:
        with contextlib.suppress(ImportError):
            import transformers.utils.logging as transformers_logging

            transformers_logging.set_verbosity_error()
            transformers_logging.disable_progress_bar()
    else:  # its bars follow huggingface_hub's switch, read when transformers is imported
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules:
        with contextlib.suppress(ImportError):
            import datasets

            datasets.disable_progress_bars()
            datasets.utils.logging.set_verbosity_error()
    else:
        os.environ.setdefault("DATASETS_VERBOSITY", "error")
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    with contextlib.suppress(ImportError):
        import huggingface_hub.utils  # a light import

        huggingface_hub.utils.disable_progress_bars()
    for name in ("trl", "accelerate", "peft"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=_THIRD_PARTY)
