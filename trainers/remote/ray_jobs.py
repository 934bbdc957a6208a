"""The ``ray`` backend: train with the ``trl`` backend as a job on a Ray cluster (Ray Jobs API).

``python -m sdk.train --backend ray --address http://head:8265 --data episodes.parquet --model M ...``
validates the episodes locally, submits ``python -m sdk.train`` with the same settings as a Ray job
(:class:`ray.job_submission.JobSubmissionClient`), writes ``OUTPUT_DIR/job.json`` (the job's submission id),
streams the job's log (the same progress lines and metrics as local training) and, once the job succeeded,
copies its artifacts (``final/``, ``metrics.jsonl``, plots, ``config.yaml``) into ``OUTPUT_DIR``.

Where things live:

- **code**: the client's ``sdk`` and ``trainers`` packages go with the job (``runtime_env`` ``py_modules``),
  so the cluster runs the same tracerl; the cluster's Python needs the ``[train]`` dependencies (in its image,
  or ``pip`` in the config: ``pip: ["tracerl[train]"]``).
- **data**: a local Parquet file or store is uploaded with the job (``runtime_env`` ``working_dir``; Ray's
  limit for it is 500 MiB); an object-store URI (``s3://bucket/episodes.parquet`` or an ``s3://`` store) is
  read by the job itself.
- **artifacts**: the job writes its output to ``artifacts/<job id>/`` (``artifacts``: a path on a filesystem
  both sides see, or an fsspec URI such as ``s3://bucket/runs``); the client copies it from there. On a
  cluster on this machine (a loopback address) it defaults to ``OUTPUT_DIR/.ray-artifacts``.
- **model**: ``model`` (and ``tokenizer``, ``chat_template``) are paths or hub ids as the cluster sees them.

GPUs: ``num_gpus`` is reserved for the job's entrypoint (``entrypoint_num_gpus``); with more than one the job
runs ``accelerate launch --num_processes N -m sdk.train ...``. Authentication is Ray's: a cluster with token
authentication (``RAY_AUTH_MODE=token``) takes the token from ``RAY_AUTH_TOKEN``; a dashboard behind an
authenticating proxy gets its headers from ``RAY_JOB_HEADERS`` (JSON), as with ``ray job submit``.
``env_vars`` (``--env-vars AWS_ENDPOINT_URL,AWS_REGION``) sets variables of this shell in the job, which
Ray's dashboard shows: keep secrets in the cluster's configuration. A GPU box of your own becomes a one-node
cluster with ``ray start --head --dashboard-host 0.0.0.0`` (token authentication is Ray's default; the token
is ``ray get-auth-token`` on the head).

Getting a cluster: KubeRay (the operator's Helm chart, a ``RayCluster`` with a GPU worker group on an image
with ``tracerl[train,ray,s3]``, ``kubectl port-forward svc/<cluster>-head-svc 8265:8265``; a ``RayJob`` can
run ``python -m sdk.train`` directly), SkyPilot (``sky launch --gpus H100:8`` with ``ray start --head`` in
``run:``, the dashboard over ``ssh -L 8265:localhost:8265``), or Slurm (Ray's "Deploying on Slurm" guide),
then ``RAY_ADDRESS=http://HEAD:8265``.

Tested (CI, one 2-CPU machine, markers ``ray`` and ``s3``): a local Ray head with token authentication: a TRL
job on the tiny model submitted and followed, the client killed and re-attached with ``--resume``, artifacts
copied back; a job detached and cancelled; invalid data refused before submitting; a failing job reported
with its error line; a wrong token in one line; rollouts on Ray equal to a local run. Not tested: GPUs in a
job, multi-node clusters, KubeRay, SkyPilot, Slurm, real S3 (moto's S3 server stands in).

Example:
    >>> from trainers.remote.ray_jobs import RayConfig, RayTrainer
    >>> cfg = RayConfig(address="http://127.0.0.1:8265", model="/models/tiny", output_dir="runs/ray",
    ...                 grpo={"max_steps": 10})
    >>> result = RayTrainer().train("episodes.parquet", cfg)  # doctest: +SKIP
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlparse

from sdk._host import is_loopback
from sdk.store._remote import is_store_uri
from trainers.base import TrainerConfig, TrainResult
from trainers.data import PreparedData, prepare_data
from trainers.errors import AuthError, RemoteError, TransientError, UserError
from trainers.remote.base import (
    RemoteConfig,
    RemoteJob,
    RemoteTrainer,
    episodes_to_send,
    progress,
    with_retries,
)
from trainers.trl import TRLGRPOConfig

__all__ = ["RayConfig", "RayTrainer", "run_job"]

# TRLGRPOConfig fields the job owns (its own paths) and never takes from the client's config.
_NOT_SENT = frozenset({"output_dir", "resume", "eval_data"})
_METADATA_FILES = ("metrics.jsonl", "config.yaml", "data_report.json", "result.json")
_JOB_CONFIG = "tracerl_job.yaml"
_STATUS = {
    "PENDING": "queued",
    "RUNNING": "running",
    "SUCCEEDED": "succeeded",
    "FAILED": "failed",
    "STOPPED": "cancelled",
}


@dataclass
class RayConfig(RemoteConfig, TRLGRPOConfig):
    """Configuration of the ``ray`` backend: the TRL settings plus where and how the job runs.

    Every :class:`~trainers.trl.TRLGRPOConfig` field is passed to the job, which runs the ``trl``
    backend with it. ``eval_data`` is not supported (use ``eval_fraction``).

    Parameters:
        address: the Ray dashboard (Jobs API) address, e.g. ``http://head:8265``; default ``$RAY_ADDRESS``.
        artifacts: where the job writes its output, as a path both sides see or an fsspec URI
            (``s3://bucket/runs``); default on a loopback cluster: ``OUTPUT_DIR/.ray-artifacts``.
        download: artifacts copied into ``OUTPUT_DIR``: ``final`` (all but ``checkpoint-*``), ``all``, or
            ``metrics`` (metrics, plots and config only).
        num_gpus: GPUs reserved for the job; more than 1 runs it under ``accelerate launch``.
        num_cpus: CPUs reserved for the job's entrypoint.
        pip: packages Ray installs for the job (``runtime_env`` ``pip``), e.g. ``["tracerl[train]"]``.
        upload_data: send a local ``--data`` with the job; ``False`` passes ``--data`` as a path the cluster
            reads (then it is not validated here).
        env_vars: names of environment variables of this process to set in the job (``runtime_env``
            ``env_vars``), e.g. an object store's ``AWS_ENDPOINT_URL``. Their values are visible in Ray's
            dashboard: keep secrets in the cluster's own configuration where you can.

    Example:
        >>> RayConfig(address="http://127.0.0.1:8265", model="/models/tiny").download
        'final'
    """

    address: str = field(
        default="", metadata={"help": "Ray dashboard address, e.g. http://head:8265 (default: $RAY_ADDRESS)."}
    )
    artifacts: str = field(
        default="",
        metadata={
            "help": "Path or fsspec URI (s3://bucket/runs) the job writes its output to; default on a "
            "loopback cluster: OUTPUT_DIR/.ray-artifacts."
        },
    )
    download: Literal["final", "all", "metrics"] = field(
        default="final",
        metadata={"help": "Artifacts to download: final (all but checkpoint-*), all, or metrics only."},
    )
    num_gpus: float = field(default=0, metadata={"help": "GPUs for the job (>1: accelerate launch)."})
    num_cpus: float = field(default=1, metadata={"help": "CPUs reserved for the job's entrypoint."})
    pip: list[str] = field(
        default_factory=list,
        metadata={"help": "Packages Ray installs for the job (runtime_env pip; comma-separated)."},
    )
    upload_data: bool = field(
        default=True,
        metadata={"help": "Upload a local --data with the job (--no-upload-data: a path on the cluster)."},
    )
    env_vars: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Names of this process's environment variables to set in the job (comma-separated), "
            "e.g. AWS_ENDPOINT_URL for an S3-compatible store; Ray's dashboard shows their values."
        },
    )


# ----------------------------------------------------------------------------------------------- client


def _headers() -> dict[str, Any] | None:
    raw = os.environ.get("RAY_JOB_HEADERS")
    if not raw:
        return None
    try:
        headers = json.loads(raw)
    except ValueError as exc:
        raise UserError(f"RAY_JOB_HEADERS is not a JSON object: {exc}") from exc
    if not isinstance(headers, dict):
        raise UserError("RAY_JOB_HEADERS must be a JSON object of HTTP headers")
    return headers


def _client(address: str) -> Any:
    """A ``JobSubmissionClient`` for ``address``; connection failures are retried, then one clear line."""
    try:
        from ray.exceptions import AuthenticationError
        from ray.job_submission import JobSubmissionClient
    except ImportError as exc:
        raise UserError(
            f"the ray backend needs Ray's job client: pip install 'tracerl[ray]' ({exc})"
        ) from None

    def once() -> Any:
        try:
            return JobSubmissionClient(address, headers=_headers())
        except AuthenticationError as exc:
            raise AuthError(f"the Ray cluster at {address} refused the request: {_first_line(exc)}") from exc
        except ConnectionError as exc:
            raise TransientError(f"cannot reach the Ray dashboard at {address}: {_first_line(exc)}") from exc

    try:
        return with_retries(once, what="connect to Ray", attempts=3, base_delay=0.5)
    except TransientError as exc:
        raise UserError(str(exc)) from exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def _call(what: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """One Jobs API request; connection errors and 5xx answers are retried (:func:`with_retries`)."""
    from ray.exceptions import AuthenticationError

    def once() -> Any:
        try:
            return fn(*args, **kw)
        except AuthenticationError as exc:
            raise AuthError(f"the Ray cluster refused the request: {_first_line(exc)}") from exc
        except (ConnectionError, OSError) as exc:
            raise TransientError(str(exc)[:300]) from exc
        except RuntimeError as exc:  # the SDK's "Request failed with status code 5xx: ..."
            text = str(exc)
            if "status code 5" in text:
                raise TransientError(text[:300]) from exc
            if "status code 401" in text or "status code 403" in text:
                raise AuthError(f"the Ray cluster refused the request: {text[:200]}") from exc
            raise RemoteError(f"{what}: {text[:300]}") from exc

    return with_retries(once, what=what, attempts=4, base_delay=0.5)


def _fs(location: str) -> tuple[Any, str]:
    """An fsspec filesystem and the path inside it (local paths: the local filesystem)."""
    import fsspec

    if not is_store_uri(location):
        location = str(Path(location.removeprefix("file://")).expanduser().resolve())
    fs, path = fsspec.core.url_to_fs(location)
    return fs, path


# ------------------------------------------------------------------------------------------------ trainer


class RayTrainer(RemoteTrainer):
    """The ``ray`` backend: submit, follow, download, re-attach and cancel a TRL job on a Ray cluster.

    Example:
        >>> from trainers.remote.ray_jobs import RayConfig, RayTrainer
        >>> cfg = RayConfig(address="http://127.0.0.1:8265", model="/models/tiny", output_dir="runs/r")
        >>> RayTrainer().train("episodes.parquet", cfg).metrics["status"]  # doctest: +SKIP
        'succeeded'
        >>> RayTrainer().attach("runs/r")  # after a client restart  # doctest: +SKIP
    """

    name: ClassVar[str] = "ray"
    config_class: ClassVar[type[TrainerConfig]] = RayConfig
    noun: ClassVar[str] = "Ray job"

    def prepare(self, data: Any, config: TrainerConfig) -> PreparedData:
        """Validate and group locally (``--dry-run``); needs the tokenizer locally (``--tokenizer``).

        Example:
            >>> RayTrainer().prepare("episodes.parquet", RayConfig(model="./tiny"))  # doctest: +SKIP
        """
        episodes_to_send(data)
        return prepare_data(data, config)

    # ------------------------------------------------------------------------------ lifecycle steps

    def check_config(self, config: TrainerConfig) -> RayConfig:
        """The config, with ``address`` (or ``$RAY_ADDRESS``) and ``artifacts`` resolved."""
        if not isinstance(config, RayConfig):
            raise UserError(f"the ray backend needs a RayConfig, got {type(config).__name__}")
        address = config.address or os.environ.get("RAY_ADDRESS", "")
        if not address:
            raise UserError("no Ray cluster given: pass --address http://HEAD:8265 or set RAY_ADDRESS")
        if config.eval_data:
            raise UserError("eval_data is not supported by the ray backend; use eval_fraction")
        if config.num_gpus < 0 or config.num_cpus < 0:
            raise UserError("num_gpus and num_cpus must not be negative")
        artifacts = config.artifacts
        if not artifacts:
            host = urlparse(address if "://" in address else f"http://{address}").hostname or ""
            if not is_loopback(host):
                raise UserError(
                    "set --artifacts to a path the cluster and this machine share, or an object-store URI "
                    "(s3://bucket/runs): the job writes its output there and this client copies it back"
                )
            artifacts = str(Path(config.output_dir).expanduser().resolve() / ".ray-artifacts")
        elif not is_store_uri(artifacts):
            artifacts = str(Path(artifacts).expanduser().resolve())
        pip, env_vars = config.pip, config.env_vars
        if isinstance(pip, str):  # from the command line: --pip "tracerl[train],vllm"
            pip = [p.strip() for p in pip.split(",") if p.strip()]
        if isinstance(env_vars, str):  # --env-vars AWS_ENDPOINT_URL,AWS_REGION
            env_vars = [v.strip() for v in env_vars.split(",") if v.strip()]
        return dataclasses.replace(
            config, address=address, artifacts=artifacts, pip=list(pip), env_vars=list(env_vars)
        )

    def check_credentials(self, config: RayConfig) -> None:
        """Nothing to check before connecting: Ray's token or proxy headers are read from the environment."""

    def submit(self, data: Any, config: RayConfig, out: Path) -> RemoteJob:
        """Validate the episodes, stage them with the job config and submit the job; save ``job.json``."""
        data_arg, episodes = self._data(data, config)
        job_id = f"tracerl-{secrets.token_hex(6)}"
        stage = out / ".ray-upload"
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        if episodes is not None:
            from sdk.episodes import write_parquet

            write_parquet(episodes, stage / "episodes.parquet", rejects=False)
            data_arg = "episodes.parquet"
        names = {f.name for f in dataclasses.fields(TRLGRPOConfig)} - _NOT_SENT
        settings = {k: v for k, v in dataclasses.asdict(config).items() if k in names}
        settings.update(backend="trl", data=data_arg)
        import yaml

        (stage / _JOB_CONFIG).write_text(yaml.safe_dump(settings, sort_keys=False))
        entrypoint = (
            f"python -m trainers.remote.ray_jobs --artifacts {_quote(config.artifacts)}/{job_id} "
            f"--num-gpus {config.num_gpus:g} -- --config {_JOB_CONFIG}"
        )
        client = _client(config.address)
        progress(
            f"submitting {len(episodes) if episodes is not None else 'the'} episodes to the Ray cluster at "
            f"{config.address} (job {job_id})"
        )
        _call(
            "submit the Ray job",
            client.submit_job,
            entrypoint=entrypoint,
            submission_id=job_id,
            runtime_env=self._runtime_env(stage, config),
            entrypoint_num_cpus=config.num_cpus or None,
            entrypoint_num_gpus=config.num_gpus or None,
            metadata={"tracerl": "sdk.train", "model": str(config.model)[:200]},
        )
        job = RemoteJob(
            backend=self.name,
            job_id=job_id,
            endpoint=config.address,
            status="queued",
            cursor=0,
            info={
                "artifacts": f"{config.artifacts}/{job_id}",
                "download": config.download,
                "poll_interval": config.poll_interval,
                "cancel_on_interrupt": config.cancel_on_interrupt,
                "model": config.model,
                "adapter": config.lora,
            },
        )
        job.save(out)
        shutil.rmtree(stage, ignore_errors=True)  # Ray uploaded it
        progress(f"Ray job {job_id} submitted; saved to {out / 'job.json'}")
        return job

    def _data(self, data: Any, config: RayConfig) -> tuple[str, list[dict[str, Any]] | None]:
        """``(--data for the job, episodes to upload or None)``; local data is validated here."""
        if isinstance(data, (str, os.PathLike)) and (is_store_uri(str(data)) or not config.upload_data):
            if is_store_uri(str(data)):
                episodes_to_send(data)  # readable from here too: checked before submitting
            return str(data), None
        return "", episodes_to_send(data)

    def _runtime_env(self, stage: Path, config: RayConfig) -> dict[str, Any]:
        import sdk
        import trainers

        env: dict[str, Any] = {
            "working_dir": str(stage),
            # The client's tracerl goes with the job: the cluster runs the code that validated the data.
            "py_modules": [str(Path(sdk.__file__).parent), str(Path(trainers.__file__).parent)],
            "env_vars": {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
        }
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", *config.env_vars):
            if os.environ.get(name):
                env["env_vars"][name] = os.environ[name]
        if config.pip:
            env["pip"] = list(config.pip)
        return env

    @contextlib.contextmanager
    def connect(self, job: RemoteJob, out: Path) -> Iterator[Any]:
        """A Jobs API client for the job's cluster."""
        yield _client(job.endpoint)

    def poll(self, client: Any, job: RemoteJob, out: Path) -> bool:
        """Print the job's new log text (after ``job.cursor`` characters) and refresh its status."""
        info = _call("get the Ray job", client.get_job_info, job.job_id)
        status = _STATUS.get(str(getattr(info.status, "value", info.status)), "running")
        logs = _call("get the Ray job's logs", client.get_job_logs, job.job_id)
        cursor = int(job.cursor or 0)
        if len(logs) < cursor:  # the log was rotated or the job restarted: print it from the start
            cursor = 0
        new = logs[cursor:]
        if status not in ("succeeded", "failed", "cancelled"):
            new = new[: new.rfind("\n") + 1]  # whole lines only while the job writes
        if new:
            sys.stderr.write(new)
            sys.stderr.flush()
        job.cursor = cursor + len(new)
        if status != job.status:
            progress(f"Ray job {job.job_id}: {status}")
        job.status = status
        if status == "failed":
            job.error = _failure(info, logs)
        return False

    def cancel_job(self, job: RemoteJob) -> None:
        """Stop the job on the cluster (Ray stops the entrypoint and everything it started)."""
        client = _client(job.endpoint)
        _call("stop the Ray job", client.stop_job, job.job_id)
        job.status = "cancelled"

    def on_success(self, client: Any, job: RemoteJob, out: Path) -> None:
        """Copy the artifacts ``download`` selects (files already there with the same size are kept)."""
        fs, root = _fs(job.info["artifacts"])
        try:
            found = fs.find(root, detail=True)
        except FileNotFoundError:
            found = {}
        files = {}
        for path, meta in found.items():
            rel = path[len(root) :].lstrip("/")
            if rel:
                files[rel] = int(meta.get("size") or 0)
        mode = job.info.get("download", "final")
        if mode == "final":
            files = {p: s for p, s in files.items() if not p.startswith("checkpoint-")}
        elif mode == "metrics":
            files = {
                p: s
                for p, s in files.items()
                if "/" not in p and (p in _METADATA_FILES or p.endswith(".png"))
            }
        for rel, size in files.items():
            dest = out / rel
            if out.resolve() not in dest.resolve().parents:
                continue  # never write outside the output directory
            if dest.is_file() and dest.stat().st_size == size:
                continue  # already copied before a restart
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            fs.get_file(f"{root}/{rel}", str(tmp))
            os.replace(tmp, dest)
        result = out / "result.json"
        if result.is_file():
            job.info["result"] = json.loads(result.read_text())
        progress(f"Ray job {job.job_id}: copied {len(files)} artifact file(s) to {out}")

    def result(self, out: Path, job: RemoteJob) -> TrainResult:
        """The copied model/adapter, metrics, plots and config, with the job's final metrics."""
        result = job.info.get("result") or {}
        final = out / "final"
        metrics_path = out / "metrics.jsonl"
        config_path = out / "config.yaml"
        metrics: dict[str, Any] = {"job_id": job.job_id, "status": job.status}
        metrics.update(result.get("metrics") or {})
        return TrainResult(
            output_dir=out,
            checkpoint=final if final.is_dir() else None,
            adapter=bool(result.get("adapter", job.info.get("adapter", False))),
            metrics_path=metrics_path if metrics_path.is_file() else None,
            plots=sorted(out.glob("*.png")),
            config_path=config_path if config_path.is_file() else None,
            global_step=int(result.get("global_step") or 0),
            metrics=metrics,
        )


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _failure(info: Any, logs: str) -> str:
    """The job's ``error:`` line (a user error from ``sdk.train``), else Ray's message, else the last line."""
    lines = [ln.strip() for ln in logs.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if errors:
        return errors[-1][len("error: ") :]
    message = (getattr(info, "message", None) or "").strip()
    tail = lines[-1][:300] if lines else ""
    return "; ".join(x for x in (message, tail) if x) or "no reason given"


# ---------------------------------------------------------------------------------------- the job side


def run_job(argv: list[str] | None = None) -> int:
    """The job's entrypoint: run ``sdk.train`` and put its output at ``--artifacts``; returns its exit code.

    With a local (or shared) ``--artifacts`` path the training writes there directly; with a URI it writes to
    a temporary directory, which is uploaded when training ends (succeeded or not, so metrics of a failed job
    are there too). ``result.json`` (status, global step, final metrics) is written last.

    Example:
        >>> run_job(["--artifacts", "/shared/job-1", "--", "--config", "job.yaml"])  # doctest: +SKIP
        0
    """
    p = argparse.ArgumentParser(prog="python -m trainers.remote.ray_jobs")
    p.add_argument("--artifacts", required=True)
    p.add_argument("--num-gpus", type=float, default=0)
    p.add_argument("train_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    train_args = [a for a in args.train_args if a != "--"]
    remote = is_store_uri(args.artifacts)
    local = Path(tempfile.mkdtemp(prefix="tracerl-job-")) if remote else Path(args.artifacts)
    local.mkdir(parents=True, exist_ok=True)
    train_args += ["--output", str(local)]
    gpus = int(args.num_gpus)
    # The training CLI runs as its own process, one per GPU under accelerate: the job keeps only the
    # bookkeeping (and trainers.remote never imports the CLI that imports it).
    launcher = ["accelerate", "launch", "--num_processes", str(gpus)] if gpus > 1 else [sys.executable]
    cmd = [*launcher, "-m", "sdk.train", *train_args]
    print(f"[tracerl] running: {' '.join(cmd)}", file=sys.stderr, flush=True)
    code = _run_training(cmd)
    result: dict[str, Any] = {"status": "succeeded" if code == 0 else "failed", "exit_code": code}
    rows = []
    metrics_path = local / "metrics.jsonl"
    if metrics_path.is_file():
        rows = [json.loads(x) for x in metrics_path.read_text().splitlines() if x.strip()]
    if rows:
        result["global_step"] = max(int(r.get("step") or 0) for r in rows)
        result["metrics"] = {k: v for r in rows for k, v in r.items() if isinstance(v, (int, float))}
    result["adapter"] = (local / "final" / "adapter_config.json").is_file()
    (local / "result.json").write_text(json.dumps(result, indent=2))
    if remote:
        fs, root = _fs(args.artifacts)
        fs.put(str(local) + "/", root, recursive=True)
        shutil.rmtree(local, ignore_errors=True)
    return code


def _run_training(cmd: list[str]) -> int:
    """Run ``cmd`` as this job's training process and stop it when the job is stopped; its exit code.

    ``ray job stop`` signals the processes the entrypoint has *at that moment*, then SIGKILLs them 3 s
    later. A training process started after that moment, or a SIGTERM that never reached it, was left
    running without a parent (the suite once found a cancelled job's ``sdk.train`` still training 45
    minutes later). So the stop signal is passed on to the child (one that came while it started, once it
    has), and on Linux the kernel kills the child when this process dies (``PR_SET_PDEATHSIG``
    through ``ctypes``: neither the standard library nor psutil exposes it). The stop signal does not
    always reach this process either: the suite found it (and its training child) running on, its parent
    shell gone, after a stop that came while the job started. So on Linux this process asks the kernel for
    a SIGTERM when its own parent dies, which it passes on as any stop.
    """
    import signal

    stopped: list[int] = []
    child: subprocess.Popen | None = None

    def on_stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        if child is not None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_stop)
    if sys.platform == "linux":
        parent = os.getppid()
        _on_parent_death(signal.SIGTERM)
        # Its parent is Ray's job shell, never init: init (or another) here means that shell is gone already,
        # a stop that came while this process started up.
        if parent == 1 or os.getppid() != parent:
            stopped.append(signal.SIGTERM)
    child = subprocess.Popen(cmd, preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    if stopped:  # signalled before the child existed: on_stop could not pass it on
        child.send_signal(stopped[0])
    code = child.wait()
    return 128 + stopped[0] if stopped else (128 - code if code < 0 else code)  # a shell's codes


def _on_parent_death(sig: int) -> None:
    """Ask the kernel to send this process ``sig`` when its parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, sig)


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGKILL when its parent dies."""
    import signal

    _on_parent_death(signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(run_job())
