"""Remote training backends: send episodes somewhere that trains and follow the job there.

Backends (registered with the others in ``trainers.TRAINERS``): ``ray`` (:mod:`trainers.remote.ray_jobs`, a
job on a Ray cluster through the Ray Jobs API; ``--backend http://head:8265`` selects it too), ``openai``
(:mod:`trainers.remote.openai_ft`) and ``tinker`` (:mod:`trainers.remote.tinker_backend`). They share one
lifecycle, :class:`RemoteTrainer` (submit, poll, re-attach, cancel, result), and one job file,
``OUTPUT_DIR/job.json`` (:class:`RemoteJob`); see :mod:`trainers.remote.base`. API keys and tokens are read
from environment variables only and never written to ``job.json`` or logs.

Example:
    >>> from trainers.remote import find_job
    >>> find_job(None) is None  # no --resume: not a remote job
    True
"""

from __future__ import annotations

from trainers.remote.base import (
    JOB_FILE,
    TERMINAL_STATUSES,
    RemoteConfig,
    RemoteJob,
    RemoteTrainer,
    episodes_to_send,
    find_job,
    progress,
    reattach,
    with_retries,
)

__all__ = [
    "JOB_FILE",
    "TERMINAL_STATUSES",
    "RemoteConfig",
    "RemoteJob",
    "RemoteTrainer",
    "episodes_to_send",
    "find_job",
    "progress",
    "reattach",
    "with_retries",
]
