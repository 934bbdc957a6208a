"""The main job's output filter, shared by its lock-step and asynchronous smoke tests."""

from __future__ import annotations

import re

__all__ = ["OURS"]

# What the main job itself prints: its header lines, the loop's table (header and one row per round), where
# the results went, the final line, and tracerl's own one-line notices. Anything else (a transformers bar,
# TRL's per-step dicts, a library's warning) is not ours.
OURS = re.compile(
    r"^(policy: |agent: |round  validation pass@1  malformed val/train  train reward|\s+\d+\s+(\d+\.\d%|-)\s|results: |validation pass@1: |held-out success: "
    r"|resuming after round \d+ |all \d+ rounds are done "
    r"|tracerl: )"
)
