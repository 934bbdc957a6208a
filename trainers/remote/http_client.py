"""The ``http`` backend: train on a tracerl training server on a GPU host (``trainers.remote.http_server``).

``python -m sdk.train --backend http://gpu-box:8000 --data episodes.parquet --model /models/Qwen2.5-7B ...``
validates the episodes locally, uploads them with the TRL settings, writes ``OUTPUT_DIR/job.json``, prints
the job's status and metrics as the server reports them, and downloads the artifacts (``final/`` model or
adapter, ``metrics.jsonl``, plots, ``config.yaml``) into ``OUTPUT_DIR`` when the job succeeds.

The bearer token comes from the environment variable named by ``token_env`` (default
``TRACERL_SERVER_TOKEN``); it is never written to ``job.json``. ``model`` (and ``tokenizer``,
``chat_template``) are paths or hub ids **on the server**.

Example:
    >>> from trainers.remote.http_client import HTTPConfig, HTTPTrainer
    >>> cfg = HTTPConfig(server="http://127.0.0.1:8000", model="/models/tiny", output_dir="runs/remote",
    ...                  grpo={"max_steps": 10})
    >>> result = HTTPTrainer().train("episodes.parquet", cfg)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from trainers.base import PreparedData, TrainerConfig, TrainResult, prepare_data
from trainers.errors import (
    AuthError,
    InvalidDataError,
    RateLimitError,
    RemoteError,
    TransientError,
    UserError,
)
from trainers.remote import (
    RemoteConfig,
    RemoteJob,
    RemoteTrainer,
    progress,
    validate_episodes,
    with_retries,
)
from trainers.trl_grpo import TRLGRPOConfig

__all__ = ["HTTPConfig", "HTTPTrainer", "ServerClient"]

# TRLGRPOConfig fields that are paths on the client side; the server owns them.
_NOT_SENT = frozenset({"output_dir", "resume", "eval_data"})
_METADATA_FILES = ("metrics.jsonl", "config.yaml", "data_report.json")


@dataclass
class HTTPConfig(RemoteConfig, TRLGRPOConfig):
    """Configuration of the ``http`` backend: the TRL settings plus the server connection.

    Every :class:`~trainers.trl_grpo.TRLGRPOConfig` field (``grpo``, ``lora``, ``num_generations``, ...) is
    sent to the server, which runs the ``trl`` backend with it; ``model``, ``tokenizer`` and
    ``chat_template`` are resolved on the server. ``eval_data`` is not supported (use ``eval_fraction``).

    Parameters:
        server: server URL, e.g. ``http://gpu-box:8000`` (``--backend http://gpu-box:8000`` sets it).
        token_env: environment variable holding the server's bearer token.
        download: artifacts to fetch when the job succeeds: ``final`` (everything but ``checkpoint-*``),
            ``all``, or ``metrics`` (metrics, plots and config only).
        request_timeout: seconds before one HTTP request times out.

    Example:
        >>> HTTPConfig(server="http://127.0.0.1:8000", model="/models/tiny").token_env
        'TRACERL_SERVER_TOKEN'
    """

    server: str = field(default="", metadata={"help": "Training server URL (http://host:port)."})
    token_env: str = field(
        default="TRACERL_SERVER_TOKEN", metadata={"help": "Environment variable holding the bearer token."}
    )
    download: Literal["final", "all", "metrics"] = field(
        default="final",
        metadata={"help": "Artifacts to download: final (all but checkpoint-*), all, or metrics only."},
    )
    request_timeout: float = field(
        default=120.0, metadata={"help": "Seconds before an HTTP request times out."}
    )


class ServerClient:
    """Thin HTTP client for the training server's ``/v1`` API; maps failures to tracerl errors.

    HTTP 401/403 → :class:`AuthError`; 429 → :class:`RateLimitError` (``Retry-After`` honoured); 5xx and
    connection failures → :class:`TransientError` (retried by :func:`with_retries`); 422 →
    :class:`InvalidDataError` with the server's reasons; other 4xx → :class:`RemoteError`.

    Example:
        >>> client = ServerClient("http://127.0.0.1:8000", token="s3cret")  # doctest: +SKIP
        >>> client.get_job("job-0123456789abcdef")["status"]  # doctest: +SKIP
        'running'
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 120.0,
        attempts: int = 6,
        base_delay: float = 1.0,
        token_env: str = "TRACERL_SERVER_TOKEN",
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.token_env = token_env
        self.attempts = attempts
        self.base_delay = base_delay
        self._http = httpx.Client(
            base_url=self.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, method: str, path: str, **kw: Any) -> Any:
        import httpx

        def once() -> Any:
            try:
                resp = self._http.request(method, path, **kw)
            except httpx.TimeoutException as exc:
                raise TransientError(f"timed out talking to {self.base_url}") from exc
            except httpx.TransportError as exc:
                raise TransientError(f"cannot reach {self.base_url}: {exc}") from exc
            self._raise_for(resp)
            return resp

        return with_retries(once, what=what, attempts=self.attempts, base_delay=self.base_delay)

    def _raise_for(self, resp: Any) -> None:
        if resp.status_code < 400:
            return
        try:
            detail = resp.json().get("detail")
        except ValueError:
            detail = resp.text[:300]
        message = detail.get("message") if isinstance(detail, dict) else str(detail)
        reasons = detail.get("reasons", []) if isinstance(detail, dict) else []
        code = resp.status_code
        if code in (401, 403):
            raise AuthError(
                f"the training server refused the token in ${self.token_env} (HTTP {code}: {message})"
            )
        if code == 429:
            after = resp.headers.get("retry-after")
            raise RateLimitError(f"HTTP 429: {message}", retry_after=float(after) if after else None)
        if code >= 500:
            raise TransientError(f"HTTP {code} from the training server: {message}")
        if code == 422:
            raise InvalidDataError(f"the training server rejected the job: {message}", reasons)
        raise RemoteError(f"HTTP {code} from the training server: {message}")

    def submit(self, parquet: Path, config: dict[str, Any]) -> dict[str, Any]:
        """Upload episodes and config; returns the new job."""

        def post() -> Any:
            with open(parquet, "rb") as fh:  # reopened on every retry
                files = {"file": (parquet.name, fh, "application/octet-stream")}
                return self._http.request(
                    "POST", "/v1/jobs", files=files, data={"config": json.dumps(config)}
                )

        import httpx

        def once() -> Any:
            try:
                resp = post()
            except httpx.TimeoutException as exc:
                raise TransientError(f"timed out uploading to {self.base_url}") from exc
            except httpx.TransportError as exc:
                raise TransientError(f"cannot reach {self.base_url}: {exc}") from exc
            self._raise_for(resp)
            return resp

        resp = with_retries(once, what="upload episodes", attempts=self.attempts, base_delay=self.base_delay)
        return resp.json()  # type: ignore[no-any-return]

    def get_job(self, job_id: str) -> dict[str, Any]:
        """The job's status, progress and result."""
        return self._call("get job status", "GET", f"/v1/jobs/{job_id}").json()  # type: ignore[no-any-return]

    def events(self, job_id: str, after: int = 0) -> dict[str, Any]:
        """Events with sequence number above ``after``."""
        resp = self._call("get job events", "GET", f"/v1/jobs/{job_id}/events", params={"after": after})
        return resp.json()  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel the job; returns it."""
        return self._call("cancel job", "POST", f"/v1/jobs/{job_id}/cancel").json()  # type: ignore[no-any-return]

    def artifacts(self, job_id: str) -> list[dict[str, Any]]:
        """The job's artifact files (``path``, ``bytes``)."""
        resp = self._call("list artifacts", "GET", f"/v1/jobs/{job_id}/artifacts")
        return resp.json()["data"]  # type: ignore[no-any-return]

    def download(self, job_id: str, name: str, dest: Path) -> None:
        """Download one artifact to ``dest`` (atomically)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        resp = self._call(f"download {name}", "GET", f"/v1/jobs/{job_id}/artifacts/{name}")
        tmp = dest.with_name(dest.name + ".part")
        tmp.write_bytes(resp.content)
        os.replace(tmp, dest)


def _format_metrics(ev: dict[str, Any]) -> str:
    m = ev.get("metrics") or {}
    step = f"step {ev.get('step')}" + (f"/{ev['max_steps']}" if ev.get("max_steps") else "")
    keys = ("loss", "reward", "reward_std", "learning_rate", "eval/mean_logp", "train_runtime")
    parts = [f"{k}={m[k]:.4g}" if isinstance(m[k], float) else f"{k}={m[k]}" for k in keys if k in m]
    return f"{step}: " + (", ".join(parts) if parts else "logged")


class HTTPTrainer(RemoteTrainer):
    """The ``http`` backend: upload, follow and download a TRL GRPO job on a tracerl training server.

    Example:
        >>> from trainers.remote.http_client import HTTPConfig, HTTPTrainer
        >>> cfg = HTTPConfig(server="http://127.0.0.1:8000", model="/models/tiny", output_dir="runs/r")
        >>> HTTPTrainer().train("episodes.parquet", cfg).metrics["status"]  # doctest: +SKIP
        'succeeded'
        >>> HTTPTrainer().attach("runs/r")  # after a client restart  # doctest: +SKIP
    """

    name: ClassVar[str] = "http"
    config_class: ClassVar[type[TrainerConfig]] = HTTPConfig

    def prepare(self, data: Any, config: TrainerConfig) -> PreparedData:
        """Validate and group locally (``--dry-run``); needs the tokenizer locally (``--tokenizer``).

        Example:
            >>> HTTPTrainer().prepare("episodes.parquet", HTTPConfig(model="./tiny"))  # doctest: +SKIP
        """
        from trainers._dataset import load_episodes

        validate_episodes(load_episodes(data))
        return prepare_data(data, config)

    # ------------------------------------------------------------------------------ lifecycle steps

    def check_config(self, config: TrainerConfig) -> HTTPConfig:
        """The config, when it is an :class:`HTTPConfig` with a server and without ``eval_data``."""
        if not isinstance(config, HTTPConfig):
            raise UserError(f"the http backend needs an HTTPConfig, got {type(config).__name__}")
        if not config.server:
            raise UserError(
                "no server given: pass --backend http://HOST:PORT (or set 'server' in the config)"
            )
        if config.eval_data:
            raise UserError("eval_data is not supported by the http backend; use eval_fraction")
        return config

    def check_credentials(self, config: HTTPConfig) -> None:
        """The server's bearer token must be in ``token_env``."""
        _token(config.token_env)

    def submit(self, data: Any, config: HTTPConfig, out: Path) -> RemoteJob:
        """Validate the episodes, upload them with the TRL settings and save ``job.json``."""
        from trainers._dataset import load_episodes

        episodes = validate_episodes(load_episodes(data))
        parquet = _upload_file(data, episodes, out)
        names = {f.name for f in dataclasses.fields(TRLGRPOConfig)} - _NOT_SENT
        payload = {k: v for k, v in dataclasses.asdict(config).items() if k in names}
        with _server_client(config.server, config) as client:
            progress(
                f"uploading {len(episodes)} episodes ({parquet.stat().st_size} bytes) to {config.server}"
            )
            created = client.submit(parquet, payload)
        job = RemoteJob(
            backend=self.name,
            job_id=created["id"],
            endpoint=config.server,
            status=created.get("status", "queued"),
            cursor=0,
            info={
                "token_env": config.token_env,
                "download": config.download,
                "poll_interval": config.poll_interval,
                "cancel_on_interrupt": config.cancel_on_interrupt,
                "max_retries": config.max_retries,
                "retry_base_delay": config.retry_base_delay,
                "request_timeout": config.request_timeout,
                "model": config.model,
                "adapter": config.lora,
            },
        )
        job.save(out)
        progress(f"job {job.job_id} submitted ({job.status}); saved to {out / 'job.json'}")
        return job

    def connect(self, job: RemoteJob, out: Path) -> ServerClient:
        """A client for the job's server (closed when following ends)."""
        return _server_client(job.endpoint, job.info)

    def poll(self, client: ServerClient, job: RemoteJob, out: Path) -> bool:
        """Report the events after ``job.cursor`` and refresh the job; return whether more events wait."""
        page = client.events(job.job_id, after=int(job.cursor or 0))
        for ev in page["data"]:
            if ev.get("type") == "metrics":
                progress(f"job {job.job_id}: {_format_metrics(ev)}")
            elif ev.get("type") == "status":
                progress(
                    f"job {job.job_id}: {ev['status']}" + (f" ({ev['error']})" if ev.get("error") else "")
                )
            elif ev.get("message"):
                progress(f"job {job.job_id}: {ev['message']}")
        job.cursor = int(page.get("last_seq", job.cursor or 0))
        remote = client.get_job(job.job_id)
        job.status, job.error = remote["status"], remote.get("error")
        job.info["result"] = remote.get("result")
        return bool(page.get("has_more"))

    def cancel_job(self, job: RemoteJob) -> None:
        """Cancel the job on the server."""
        with _server_client(job.endpoint, job.info) as client:
            remote = client.cancel(job.job_id)
        job.status = remote.get("status", job.status)
        job.error = remote.get("error")

    def failure(self, job: RemoteJob) -> str:
        """The one-line error for a job that failed on the server."""
        return f"job {job.job_id} failed on the server: {job.error}"

    def on_success(self, client: ServerClient, job: RemoteJob, out: Path) -> None:
        """Download the artifacts ``download`` selects (files already there with the same size are kept)."""
        mode = job.info.get("download", "final")
        files = client.artifacts(job.job_id)
        if mode == "final":
            files = [f for f in files if not f["path"].startswith("checkpoint-")]
        elif mode == "metrics":
            files = [
                f
                for f in files
                if "/" not in f["path"] and (f["path"] in _METADATA_FILES or f["path"].endswith(".png"))
            ]
        for f in files:
            dest = out / f["path"]
            if out.resolve() not in dest.resolve().parents:
                continue  # never write outside the output directory
            if dest.is_file() and dest.stat().st_size == f["bytes"]:
                continue  # already downloaded before a restart
            client.download(job.job_id, f["path"], dest)
        progress(f"job {job.job_id}: downloaded {len(files)} artifact file(s) to {out}")

    def result(self, out: Path, job: RemoteJob) -> TrainResult:
        """The downloaded model/adapter, metrics, plots and config, with the server's final metrics."""
        result = job.info.get("result") or {}
        final = out / "final"
        metrics_path = out / "metrics.jsonl"
        config_path = out / "config.yaml"
        metrics: dict[str, Any] = {"job_id": job.job_id, "status": job.status}
        metrics.update({k: v for k, v in (result.get("metrics") or {}).items()})
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


def _server_client(server: str, settings: Any) -> ServerClient:
    """A :class:`ServerClient`: the token from the environment, the retry settings of a config or job."""
    get = settings.get if isinstance(settings, dict) else lambda k, d=None: getattr(settings, k, d)
    token_env = str(get("token_env", "TRACERL_SERVER_TOKEN"))
    return ServerClient(
        server,
        _token(token_env),
        timeout=float(get("request_timeout", 120.0)),
        attempts=int(get("max_retries", 6)),
        base_delay=float(get("retry_base_delay", 1.0)),
        token_env=token_env,
    )


def _token(env: str) -> str:
    token = os.environ.get(env, "")
    if not token:
        raise AuthError(f"no token for the training server: set ${env} (the server's bearer token)")
    return token


def _upload_file(data: Any, episodes: list[dict[str, Any]], out: Path) -> Path:
    if isinstance(data, (str, os.PathLike)) and Path(data).is_file():
        return Path(data)
    from sdk.episodes import write_parquet

    out.mkdir(parents=True, exist_ok=True)
    path = out / "upload.parquet"
    write_parquet(episodes, path, rejects=False)
    return path
