"""Silence third-party progress bars, logs and warnings through those libraries' own switches.

The main job and the loop print their own lines (a table row per round); transformers' "Loading weights" /
"Writing model shards" bars, TRL's per-step log dicts and the libraries' deprecation notices would land
between them. tracerl's own progress bars (``sdk.rollout``, the exporter) are not touched.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings

__all__ = ["quiet_libraries"]

# Warnings raised from inside these packages are theirs to fix, not the user's.
_THIRD_PARTY = r"(transformers|trl|accelerate|datasets|peft|torch|huggingface_hub)(\..*)?$"


def quiet_libraries() -> None:
    """Turn off transformers', datasets' and huggingface_hub's progress bars and their info/warning logs.

    Only what is installed is touched; errors still print. Process-wide and idempotent.

    Example:
        >>> quiet_libraries()
    """
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with contextlib.suppress(ImportError):
        import transformers.utils.logging as transformers_logging

        transformers_logging.set_verbosity_error()
        transformers_logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        import datasets

        datasets.disable_progress_bars()
        datasets.utils.logging.set_verbosity_error()
    with contextlib.suppress(ImportError):
        import huggingface_hub.utils

        huggingface_hub.utils.disable_progress_bars()
    for name in ("trl", "accelerate", "peft"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=_THIRD_PARTY)
