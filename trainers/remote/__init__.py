"""Remote training backends and their common job lifecycle.

A remote backend sends episodes somewhere that trains (a tracerl training server on a GPU host, the OpenAI
fine-tuning API, Tinker) and follows the job there. Every backend shares the lifecycle implemented here:

- **submit**: episodes are validated locally first; invalid data is rejected *before* upload, with reasons
  (:class:`InvalidDataError`);
- **persist**: the job id and everything needed to find the job again is written to ``OUTPUT_DIR/job.json``
  (:class:`RemoteJob`) as soon as the service accepts it;
- **poll** with progress lines on stderr; rate limits and transient failures are retried with exponential
  backoff and a progress message (:func:`with_retries`); authentication failures stop with one clear line
  (:class:`AuthError`);
- **re-attach** after the client restarts: ``python -m sdk.train --resume OUTPUT_DIR`` (:func:`reattach`);
- **cancel**: ``python -m sdk.train --resume OUTPUT_DIR --cancel`` (:func:`reattach` with ``cancel=True``).

Backends (registered in ``trainers/__init__.py``): ``http`` (:mod:`trainers.remote.http_client`, selected by
``--backend http://host:port``), ``openai`` (:mod:`trainers.remote.openai_ft`) and ``tinker``
(:mod:`trainers.remote.tinker_backend`). API keys and tokens are read from environment variables only and
never written to ``job.json`` or logs.

This module imports only the standard library and ``trainers.base``.

Example:
    >>> resolve_backend("http://gpu-box:8000")
    ('http', {'server': 'http://gpu-box:8000'})
    >>> resolve_backend("openai")
    ('openai', {})
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from trainers.base import TrainerConfig, TrainResult
from trainers.errors import InvalidDataError, RateLimitError, TransientError, UserError

__all__ = [
    "refuse_running_job",
    "JOB_FILE",
    "REMOTE_BACKENDS",
    "TERMINAL_STATUSES",
    "RemoteConfig",
    "RemoteJob",
    "find_job",
    "progress",
    "reattach",
    "resolve_backend",
    "validate_episodes",
    "with_retries",
]

#: File in the output directory that holds the persisted job state.
JOB_FILE = "job.json"
#: Job statuses after which nothing changes any more.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})

T = TypeVar("T")

#: The remote backends (also listed in ``trainers.TRAINERS``); :func:`reattach` resolves names here first.
REMOTE_BACKENDS: dict[str, str] = {
    "http": "trainers.remote.http_client:HTTPTrainer",
    "openai": "trainers.remote.openai_ft:OpenAIFineTuneTrainer",
    "tinker": "trainers.remote.tinker_backend:TinkerTrainer",
}


# ------------------------------------------------------------------------------------------------ config


@dataclass
class RemoteConfig(TrainerConfig):
    """Settings shared by the remote backends (on top of :class:`~trainers.base.TrainerConfig`).

    Parameters:
        poll_interval: seconds between status polls while waiting for the job.
        detach: submit the job, write ``job.json`` and return without waiting (re-attach with
            ``python -m sdk.train --resume OUTPUT_DIR``).
        max_retries: attempts for a request that is rate limited or fails transiently (backoff doubles from
            ``retry_base_delay`` seconds, capped at 60 s).
        retry_base_delay: first backoff delay in seconds.
        cancel_on_interrupt: cancel the remote job on Ctrl-C instead of leaving it running.

    Example:
        >>> RemoteConfig(model="m", poll_interval=1.0).detach
        False
    """

    poll_interval: float = field(default=5.0, metadata={"help": "Seconds between status polls."})
    detach: bool = field(
        default=False,
        metadata={"help": "Submit, write job.json and return; re-attach later with --resume OUTPUT_DIR."},
    )
    max_retries: int = field(
        default=6, metadata={"help": "Attempts for rate-limited (429) or transiently failing requests."}
    )
    retry_base_delay: float = field(
        default=1.0, metadata={"help": "First retry delay in seconds (doubles each attempt, max 60 s)."}
    )
    cancel_on_interrupt: bool = field(
        default=False, metadata={"help": "Cancel the remote job on Ctrl-C (default: leave it running)."}
    )


# --------------------------------------------------------------------------------------------------- job


@dataclass
class RemoteJob:
    """The persisted state of a remote job (``OUTPUT_DIR/job.json``); never holds a secret.

    Attributes:
        backend: registered backend name (``http``, ``openai``, ``tinker``).
        job_id: the service's job id.
        endpoint: where the job lives (server URL or API base URL).
        status: last known status (``queued``, ``running``, ``succeeded``, ``failed``, ``cancelled``, or
            the service's own word).
        result_model: the trained model id / checkpoint path once known.
        cursor: where event streaming stopped (event sequence number or id), so re-attaching does not
            repeat events.
        info: backend-specific state needed to re-attach (file ids, method, config, ...).
        error: failure message from the service.

    Example:
        >>> job = RemoteJob(backend="http", job_id="job-1", endpoint="http://127.0.0.1:8000")
        >>> job.terminal
        False
    """

    backend: str
    job_id: str
    endpoint: str = ""
    status: str = "queued"
    result_model: str | None = None
    cursor: Any = None
    submitted_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def terminal(self) -> bool:
        """Whether the job has reached a final status."""
        return self.status in TERMINAL_STATUSES

    def save(self, output_dir: str | os.PathLike[str]) -> Path:
        """Write ``output_dir/job.json`` atomically.

        Example:
            >>> RemoteJob("http", "job-1").save("runs/x")  # doctest: +SKIP
            PosixPath('runs/x/job.json')
        """
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.updated_at = time.time()
        path = out / JOB_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, default=str))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, output_dir: str | os.PathLike[str]) -> RemoteJob:
        """Read ``output_dir/job.json``.

        Raises:
            UserError: No job file, or it cannot be parsed.

        Example:
            >>> RemoteJob.load("runs/x").job_id  # doctest: +SKIP
            'job-1'
        """
        path = Path(output_dir) / JOB_FILE
        if not path.is_file():
            raise UserError(f"no remote job in {output_dir} ({JOB_FILE} not found)")
        try:
            data = json.loads(path.read_text())
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in known})
        except (ValueError, TypeError) as exc:
            raise UserError(f"cannot read {path}: {exc}") from exc


# ------------------------------------------------------------------------------------------------ helpers


def progress(message: str) -> None:
    """Print one progress line on stderr (the CLI's channel for progress; stdout stays for results).

    Example:
        >>> progress("job job-1: running, step 3/10")  # doctest: +SKIP
    """
    print(f"[tracerl] {message}", file=sys.stderr, flush=True)


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    attempts: int = 6,
    base_delay: float = 1.0,
    max_delay: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
    report: Callable[[str], None] = progress,
) -> T:
    """Call ``fn``; on :class:`RateLimitError` / :class:`TransientError` wait and try again.

    The delay doubles from ``base_delay`` (with ±20 % jitter, capped at ``max_delay``); a ``retry_after``
    from the service wins when it is longer. Every retry prints a progress line; the last failure is
    re-raised with the number of attempts in its message. Other exceptions propagate at once.

    Args:
        fn: The request.
        what: Short description for messages (``"upload episodes"``).
        attempts: Total attempts (at least 1).
        base_delay: First delay in seconds.
        max_delay: Largest delay in seconds.
        sleep: Sleep function (tests pass a recorder).
        report: Where progress lines go.

    Returns:
        What ``fn`` returns.

    Raises:
        RateLimitError | TransientError: Still failing after ``attempts`` tries.

    Example:
        >>> calls = []
        >>> def flaky():
        ...     calls.append(1)
        ...     if len(calls) < 3:
        ...         raise RateLimitError("HTTP 429")
        ...     return "ok"
        >>> with_retries(flaky, what="demo", sleep=lambda s: None, report=lambda m: None)
        'ok'
    """
    attempts = max(1, int(attempts))
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except TransientError as exc:
            if attempt >= attempts:
                kind = "rate limited" if isinstance(exc, RateLimitError) else "failed"
                raise type(exc)(
                    f"{what}: {kind} after {attempts} attempts ({exc})", retry_after=exc.retry_after
                ) from exc
            delay = min(max_delay, base_delay * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)
            if exc.retry_after is not None:
                delay = max(delay, min(float(exc.retry_after), max_delay))
            kind = "rate limited" if isinstance(exc, RateLimitError) else "transient failure"
            report(f"{what}: {kind} ({exc}); retrying in {delay:.1f} s (attempt {attempt + 1}/{attempts})")
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def resolve_backend(name_or_url: str) -> tuple[str, dict[str, Any]]:
    """Map ``--backend`` to a registered backend name plus config overrides.

    ``http://host:port`` / ``https://...`` select the ``http`` backend (a tracerl training server) with
    ``server`` set to the URL; any other value is a registered name and passes through.

    Example:
        >>> resolve_backend("https://train.example.com/")
        ('http', {'server': 'https://train.example.com'})
        >>> resolve_backend("tinker")
        ('tinker', {})
    """
    value = name_or_url.strip()
    if value.startswith(("http://", "https://")):
        return "http", {"server": value.rstrip("/")}
    return value, {}


def find_job(resume: str | None, output_dir: str | None = None) -> Path | None:
    """Return the directory holding a remote ``job.json`` that ``--resume`` refers to, or ``None``.

    ``--resume DIR`` names the output directory itself; bare ``--resume`` (``"latest"``) with ``--output DIR``
    looks in the output directory. ``None`` means "not a remote job" (the local TRL backend handles it).

    Example:
        >>> find_job(None) is None
        True
    """
    if not resume:
        return None
    candidates = [Path(resume).expanduser()]
    if resume in ("latest", "true", "True") and output_dir:
        candidates = [Path(output_dir).expanduser()]
    for c in candidates:
        if (c / JOB_FILE).is_file():
            return c
    return None


def reattach(output_dir: str | os.PathLike[str], *, cancel: bool = False) -> TrainResult:
    """Re-attach to the job persisted in ``output_dir`` (after a client restart) or cancel it.

    Loads ``job.json``, imports the backend named there and calls its ``attach(output_dir)`` (wait for the
    job, stream progress, download/record the result) or ``cancel(output_dir)``.

    Args:
        output_dir: The directory the job was submitted with.
        cancel: Cancel the job instead of waiting for it.

    Returns:
        The backend's :class:`~trainers.base.TrainResult`.

    Raises:
        UserError: No job file, unknown backend, or the service's error.

    Example:
        >>> result = reattach("runs/remote")  # doctest: +SKIP
        >>> result.metrics["status"]  # doctest: +SKIP
        'succeeded'
    """
    from importlib import import_module

    from trainers import get_trainer

    job = RemoteJob.load(output_dir)
    if job.backend in REMOTE_BACKENDS:
        module, _, attr = REMOTE_BACKENDS[job.backend].partition(":")
        trainer = getattr(import_module(module), attr)()
    else:
        trainer = get_trainer(job.backend)()
    if cancel:
        return trainer.cancel(output_dir)  # type: ignore[attr-defined,no-any-return]
    return trainer.attach(output_dir)  # type: ignore[attr-defined,no-any-return]


def validate_episodes(
    episodes: list[dict[str, Any]], *, require_reward: bool = True, require_groups: bool = True
) -> list[dict[str, Any]]:
    """Check episodes before upload; raise with reasons when any is invalid.

    Uses the episode validator of :mod:`sdk.episodes` (message order, tool calls, rewards, ...) and, with
    ``require_groups``, that some task has at least two rewarded episodes.

    Args:
        episodes: Episode dicts (``trainers._dataset.load_episodes``).
        require_reward: Episodes must carry a finite reward.
        require_groups: Some task must have ≥ 2 rewarded episodes (GRPO, best/worst pairs).

    Returns:
        ``episodes`` unchanged.

    Raises:
        InvalidDataError: One reason per problem code with a count and example episode ids.

    Example:
        >>> validate_episodes([{"schema_version": 1, "episode_id": "e", "messages": [], "reward": 1.0}],
        ...                   require_groups=False)
        Traceback (most recent call last):
        ...
        trainers.errors.InvalidDataError: 1 of 1 episodes are invalid: empty_episode: 1 (e.g. e)
    """
    from sdk.episodes import validate_episode

    by_code: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    bad = 0
    seen: set[int] = set()
    for ep in episodes:
        problems = [p for p in validate_episode(dict(ep), require_reward=require_reward, seen_ids=seen)]
        errors = [p for p in problems if p.is_error]
        if errors:
            bad += 1
        for p in errors:
            by_code[p.code] += 1
            examples.setdefault(p.code, [])
            if len(examples[p.code]) < 3:
                examples[p.code].append(str(ep.get("episode_id")))
    if bad:
        reasons = [f"{code}: {n} (e.g. {', '.join(examples[code])})" for code, n in by_code.most_common()]
        raise InvalidDataError(f"{bad} of {len(episodes)} episodes are invalid", reasons)
    if require_groups:
        from trainers._dataset import check_task_sizes

        check_task_sizes(episodes)
    return episodes


def group_by_task(episodes: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Episodes with a task id and a reward, grouped by task id (insertion order kept).

    Example:
        >>> sorted(group_by_task([{"task_id": "a", "reward": 1.0}, {"task_id": "b", "reward": None}]))
        ['a']
    """
    out: dict[str, list[Mapping[str, Any]]] = {}
    for ep in episodes:
        if ep.get("task_id") is None or ep.get("reward") is None:
            continue
        out.setdefault(str(ep["task_id"]), []).append(ep)
    return out


def refuse_running_job(out: Path) -> None:
    """Raise ``UserError`` if ``out`` already follows a job that has not finished.

    Example:
        >>> import tempfile
        >>> refuse_running_job(Path(tempfile.mkdtemp()))
    """
    if (out / "job.json").is_file():
        try:
            job = RemoteJob.load(out)
        except UserError:
            return
        if not job.terminal:
            raise UserError(
                f"{out} already follows job {job.job_id} ({job.status}); re-attach with "
                f"python -m sdk.train --resume {out}, cancel it with --resume {out} --cancel, "
                "or choose another --output"
            )
