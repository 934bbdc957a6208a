"""The job lifecycle every remote backend shares: :class:`RemoteTrainer`, the job file and the helpers.

A remote backend sends episodes somewhere that trains and follows the job there. :class:`RemoteTrainer` runs
the lifecycle the same way for every backend; a backend fills in its steps (see the class):

- **submit**: episodes are validated locally first (:func:`episodes_to_send`); invalid data is rejected
  *before* upload, with reasons (:class:`~trainers.errors.InvalidDataError`); the job id and everything
  needed to find the job again is written to ``OUTPUT_DIR/job.json`` (:class:`RemoteJob`) as soon as the
  service accepts it;
- **poll** with progress lines on stderr; rate limits and transient failures are retried with exponential
  backoff and a progress message (:func:`with_retries`); authentication failures stop with one clear line
  (:class:`~trainers.errors.AuthError`);
- **re-attach** after the client restarts: ``python -m sdk.train --resume OUTPUT_DIR`` (:func:`reattach`);
- **cancel**: ``python -m sdk.train --resume OUTPUT_DIR --cancel`` (:func:`reattach` with ``cancel=True``);
- **result**: the backend's :class:`~trainers.base.TrainResult`, from ``job.json`` and the downloaded files.

This module imports only the standard library, ``sdk.episodes``, ``trainers.base`` and ``trainers.data``.

Example:
    >>> job = RemoteJob(backend="ray", job_id="job-1", status="running")
    >>> job.terminal
    False
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from sdk.episodes import ValidationPolicy
from trainers.base import TrainerConfig, TrainResult
from trainers.data import PreparedData, check_task_sizes, load_episodes, refuse_invalid
from trainers.errors import RateLimitError, RemoteError, TransientError, UserError

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

#: File in the output directory that holds the persisted job state.
JOB_FILE = "job.json"
#: Job statuses after which nothing changes any more.
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})

T = TypeVar("T")


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
        backend: registered backend name (``ray``, ``openai``, ``tinker``).
        job_id: the service's job id.
        endpoint: where the job lives (Ray dashboard address or API base URL).
        status: last known status (``queued``, ``running``, ``succeeded``, ``failed``, ``cancelled``, or
            the service's own word).
        result_model: the trained model id / checkpoint path once known.
        cursor: where event streaming stopped (event sequence number or id), so re-attaching does not
            repeat events.
        info: backend-specific state needed to re-attach (file ids, method, config, ...).
        error: failure message from the service.

    Example:
        >>> job = RemoteJob(backend="ray", job_id="job-1", endpoint="http://127.0.0.1:8265")
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
            >>> RemoteJob("ray", "job-1").save("runs/x")  # doctest: +SKIP
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


# --------------------------------------------------------------------------------------------- lifecycle


class RemoteTrainer(ABC):
    """The lifecycle every remote backend shares: submit, poll, re-attach, cancel, result.

    The public methods string the steps together the same way for every backend:

    - :meth:`train`: :meth:`check_config`, :meth:`refuse_unfinished` (the output directory must not follow a
      running job), :meth:`check_credentials` (before any work), :meth:`submit`, then, unless ``detach``,
      :meth:`follow`;
    - :meth:`follow`: :meth:`connect`, then :meth:`poll` until the job is final, saving ``job.json`` after
      every poll and sleeping ``poll_interval`` when nothing new came; Ctrl-C goes to :meth:`on_interrupt`
      (cancel the job or leave it running); a failed or cancelled job raises
      :class:`~trainers.errors.RemoteError`; a succeeded one goes to :meth:`on_success` (downloads), then
      :meth:`result`;
    - :meth:`attach` (``--resume OUTPUT_DIR``): ``job.json``, then :meth:`follow`;
    - :meth:`cancel` (``--resume OUTPUT_DIR --cancel``): ``job.json``, :meth:`cancel_job` unless the job is
      final, then :meth:`result`.

    A backend sets ``name``, ``config_class`` and ``noun`` and implements :meth:`prepare`,
    :meth:`check_config`, :meth:`check_credentials`, :meth:`submit`, :meth:`connect`, :meth:`poll`,
    :meth:`cancel_job` and :meth:`result`.

    Example:
        >>> from trainers.remote.openai_ft import OpenAIFineTuneTrainer
        >>> issubclass(OpenAIFineTuneTrainer, RemoteTrainer)
        True
        >>> OpenAIFineTuneTrainer().attach("runs/ft")  # after a client restart  # doctest: +SKIP
    """

    name: ClassVar[str]
    config_class: ClassVar[type[TrainerConfig]]
    #: How progress lines and errors name a job ("job job-1", "fine-tuning job ftjob-1").
    noun: ClassVar[str] = "job"
    #: Whether ``detach`` returns after submitting (not where the training loop runs in this process).
    detachable: ClassVar[bool] = True

    # ------------------------------------------------------------------------------------------- lifecycle

    def train(self, data: Any, config: TrainerConfig, **kw: Any) -> TrainResult:
        """Submit a job, persist ``job.json`` and (unless ``detach``) follow it to the end.

        Args:
            data: Episodes (Parquet file/directory, store, DataFrame or episode dicts).
            config: The backend's ``config_class``.
            **kw: Ignored (``extra_config`` from the CLI and other local-backend options).

        Raises:
            InvalidDataError: Invalid episodes (nothing is uploaded).
            AuthError: Missing credentials, or the service refused them.
            RemoteError: The job failed or was cancelled.

        Example:
            >>> from trainers.remote.openai_ft import OpenAIFineTuneConfig, OpenAIFineTuneTrainer
            >>> cfg = OpenAIFineTuneConfig(model="gpt-4.1-mini-2025-04-14")
            >>> OpenAIFineTuneTrainer().train("e.parquet", cfg).metrics["status"]  # doctest: +SKIP
            'succeeded'
        """
        cfg = self.check_config(config)
        out = Path(cfg.output_dir)
        self.refuse_unfinished(out)
        self.check_credentials(cfg)  # fail before any work when the key or token is missing
        job = self.submit(data, cfg, out)
        if cfg.detach and self.detachable:
            progress(f"detached; re-attach with: tracerl train --resume {out}")
            return self.result(out, job)
        return self.follow(job, out)

    def attach(self, output_dir: str | os.PathLike[str]) -> TrainResult:
        """Re-attach to the job in ``output_dir/job.json`` and follow it to the end.

        Example:
            >>> from trainers.remote.ray_jobs import RayTrainer
            >>> RayTrainer().attach("runs/remote").global_step  # doctest: +SKIP
            10
        """
        out = Path(output_dir)
        job = RemoteJob.load(out)
        where = f" on {job.endpoint}" if job.endpoint else ""
        return self.follow(job, out, note=f"re-attached to {self.describe(job)}{where}")

    def cancel(self, output_dir: str | os.PathLike[str]) -> TrainResult:
        """Cancel the job in ``output_dir/job.json`` (a final job stays as it is).

        Example:
            >>> from trainers.remote.ray_jobs import RayTrainer
            >>> RayTrainer().cancel("runs/remote").metrics["status"]  # doctest: +SKIP
            'cancelled'
        """
        out = Path(output_dir)
        job = RemoteJob.load(out)
        if not job.terminal:
            self.cancel_job(job)
        job.save(out)
        progress(f"{self.describe(job)}: {job.status}")
        return self.result(out, job)

    def follow(self, job: RemoteJob, out: Path, *, note: str | None = None) -> TrainResult:
        """Poll the job until it is final, then return its result (downloaded where the backend does).

        Args:
            job: The job (``job.json`` is rewritten after every poll).
            out: The output directory.
            note: A progress line printed once connected.

        Raises:
            RemoteError: The job failed or was cancelled.

        Example:
            >>> trainer.follow(RemoteJob.load("runs/ft"), Path("runs/ft"))  # doctest: +SKIP
        """
        interval = float(job.info.get("poll_interval", 5.0))
        with self.connect(job, out) as conn:
            if note:
                progress(note)
            try:
                while True:
                    more = self.poll(conn, job, out)
                    job.save(out)
                    if job.terminal and not more:
                        break
                    if not more:
                        time.sleep(interval)
            except KeyboardInterrupt:
                job.save(out)
                self.on_interrupt(job, out)
                raise
            if job.status == "failed":
                raise RemoteError(self.failure(job))
            if job.status == "cancelled":
                raise RemoteError(f"{self.describe(job)} was cancelled")
            self.on_success(conn, job, out)
        return self.result(out, job)

    # ------------------------------------------------------------------------------- backend steps

    @abstractmethod
    def prepare(self, data: Any, config: TrainerConfig) -> PreparedData:
        """Load, validate and group the data without sending anything (``--dry-run``)."""

    @abstractmethod
    def check_config(self, config: TrainerConfig) -> Any:
        """Return ``config`` when it is this backend's config and complete; raise ``UserError`` if not."""

    @abstractmethod
    def check_credentials(self, config: Any) -> None:
        """Raise :class:`~trainers.errors.AuthError` when the key or token is missing."""

    @abstractmethod
    def submit(self, data: Any, config: Any, out: Path) -> RemoteJob:
        """Validate and send the data, create the job and save ``job.json`` once the service accepted it."""

    @abstractmethod
    def connect(self, job: RemoteJob, out: Path) -> contextlib.AbstractContextManager[Any]:
        """A context manager yielding the connection :meth:`poll` and :meth:`on_success` use."""

    @abstractmethod
    def poll(self, conn: Any, job: RemoteJob, out: Path) -> bool:
        """Report new events and refresh ``job`` (status, result); return whether more events wait."""

    @abstractmethod
    def cancel_job(self, job: RemoteJob) -> None:
        """Ask the service to cancel the job; update ``job.status`` (and ``job.error``)."""

    @abstractmethod
    def result(self, out: Path, job: RemoteJob) -> TrainResult:
        """The :class:`~trainers.base.TrainResult` of the job as far as it is known."""

    # --------------------------------------------------------------------------- overridable defaults

    def describe(self, job: RemoteJob) -> str:
        """How progress lines name the job: ``"<noun> <job id>"``."""
        return f"{self.noun} {job.job_id}"

    def failure(self, job: RemoteJob) -> str:
        """The one-line error for a failed job."""
        return f"{self.describe(job)} failed: {job.error or 'no reason given'}"

    def refuse_unfinished(self, out: Path) -> None:
        """Raise ``UserError`` if ``out`` already follows a job that has not finished.

        Example:
            >>> import tempfile
            >>> from trainers.remote.openai_ft import OpenAIFineTuneTrainer
            >>> OpenAIFineTuneTrainer().refuse_unfinished(Path(tempfile.mkdtemp()))
        """
        if not (out / JOB_FILE).is_file():
            return
        try:
            job = RemoteJob.load(out)
        except UserError:
            return
        if not job.terminal:
            raise UserError(
                f"{out} already follows job {job.job_id} ({job.status}); re-attach with "
                f"tracerl train --resume {out}, cancel it with --resume {out} --cancel, "
                "or choose another --output"
            )

    def on_interrupt(self, job: RemoteJob, out: Path) -> None:
        """Ctrl-C while following: cancel the job (``cancel_on_interrupt``) or leave it running."""
        if job.info.get("cancel_on_interrupt"):
            self.cancel_job(job)
            job.save(out)
            progress(f"{self.describe(job)} cancelled")
        else:
            progress(
                f"detached from {self.describe(job)} (it keeps running); re-attach with: "
                f"tracerl train --resume {out}"
            )

    def on_success(self, conn: Any, job: RemoteJob, out: Path) -> None:  # noqa: B027 - optional step
        """Called once the job succeeded, before :meth:`result` (downloads, a last progress line)."""


# ------------------------------------------------------------------------------------------ the CLI side


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
    from trainers import get_trainer

    job = RemoteJob.load(output_dir)
    trainer = get_trainer(job.backend)()
    if not isinstance(trainer, RemoteTrainer):
        raise UserError(f"{output_dir}/{JOB_FILE} names backend {job.backend!r}, which runs no remote jobs")
    if cancel:
        return trainer.cancel(output_dir)
    return trainer.attach(output_dir)


def episodes_to_send(data: Any) -> list[dict[str, Any]]:
    """The episodes of ``data``, checked before anything is sent: all valid, and some task with two.

    Raises:
        InvalidDataError: Invalid episodes (``ValidationPolicy.UPLOAD``), with one reason per problem code.
        UserError: No task has two rewarded episodes.

    Example:
        >>> episodes_to_send([{"episode_id": "e", "task_id": "t", "messages": [], "reward": 1.0}])
        Traceback (most recent call last):
        ...
        trainers.errors.InvalidDataError: 1 of 1 episodes are invalid: empty_episode: 1 (e.g. e)
    """
    episodes = refuse_invalid(load_episodes(data), ValidationPolicy.UPLOAD)
    check_task_sizes(episodes)
    return episodes
