"""``python -m trainers.remote.http_server``: a tracerl training server for a GPU host.

Clients without GPUs send episodes here (``python -m sdk.train --backend http://host:port ...``); the server
runs the local TRL GRPO backend (:mod:`trainers.trl_grpo`) as a job in a worker subprocess, records status and
metrics as events, and serves the artifacts (final model/adapter, ``metrics.jsonl``, plots, config).

Usage::

    export TRACERL_SERVER_TOKEN=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    python -m trainers.remote.http_server --host 0.0.0.0 --port 8000 --workdir /data/tracerl-jobs

Every ``/v1`` request needs ``Authorization: Bearer $TRACERL_SERVER_TOKEN``; requests without it (or with a
wrong token) get 401. The token is read from the environment variable named by ``--token-env`` only; the
worker processes do not inherit it. Use TLS (a reverse proxy) when the server is reachable beyond a trusted
network.

Endpoints:

- ``POST /v1/jobs``: multipart form with ``file`` (episode Parquet) and ``config`` (JSON object of
  :class:`~trainers.trl_grpo.TRLGRPOConfig` fields; ``output_dir`` and ``resume`` are the server's). Invalid
  config or data: 422 with ``{"detail": {"message", "reasons"}}``. Returns the job (201).
- ``GET /v1/jobs`` / ``GET /v1/jobs/{id}``: status (``queued``, ``running``, ``succeeded``, ``failed``,
  ``cancelled``), progress (``step``/``max_steps``), error, final metrics.
- ``GET /v1/jobs/{id}/events?after=N&limit=M``: status changes and logged metrics with sequence numbers
  ``seq`` > N (poll with the last ``seq`` seen).
- ``POST /v1/jobs/{id}/cancel``: stop the worker; the job becomes ``cancelled``.
- ``GET /v1/jobs/{id}/artifacts`` (list) and ``GET /v1/jobs/{id}/artifacts/{path}`` (download).
- ``GET /healthz``: liveness, no token needed.

Job state lives in ``WORKDIR/jobs/<id>/`` (``job.json``, ``episodes.parquet``, ``config.json``,
``events.jsonl``, ``worker.log``, ``output/``) and survives a server restart. Stopping (or killing) the server
stops its workers; their jobs become ``failed`` ("the training server stopped while the job was running"),
queued jobs are started when the server comes back.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from trainers.errors import UserError

try:  # Module-level names: FastAPI resolves the (string) annotations of the routes from these globals.
    from fastapi import FastAPI, File, Form, HTTPException, Request, UploadFile
    from fastapi.responses import FileResponse, JSONResponse
except ImportError:  # pragma: no cover - reported by main() with the extra to install
    FastAPI = None  # type: ignore[assignment,misc]

__all__ = ["JobManager", "create_app", "main"]

_TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
# Fields of TRLGRPOConfig the server owns (paths on the server) and never takes from a client.
_SERVER_OWNED = frozenset({"output_dir", "resume", "eval_data"})
_CHUNK = 1 << 20


def _now() -> float:
    return time.time()


def _append_event(path: Path, event: dict[str, Any]) -> None:
    # One small O_APPEND write per event: the server and the worker both append, lines never interleave.
    line = json.dumps({"time": _now(), **event}, default=str) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    out = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines, start=1):
        try:
            out.append({"seq": i, **json.loads(line)})
        except ValueError:
            if i < len(lines):  # a torn last line is being written; anything else is skipped
                out.append({"seq": i, "type": "log", "message": "unreadable event line"})
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JobManager:
    """Jobs on disk plus the worker processes running them (at most ``max_jobs`` at once).

    Example:
        >>> jobs = JobManager("/tmp/tracerl-jobs")  # doctest: +SKIP
        >>> jobs.get("job-0123456789ab")["status"]  # doctest: +SKIP
        'running'
    """

    def __init__(
        self, workdir: str | os.PathLike[str], *, max_jobs: int = 1, secret_env: tuple[str, ...] = ()
    ) -> None:
        self.secret_env = frozenset(secret_env)  # never passed on to the workers
        self.root = Path(workdir).expanduser().resolve() / "jobs"
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_jobs = max(1, max_jobs)
        self._lock = threading.RLock()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._recover()

    # ----------------------------------------------------------------------------------------- storage

    def _dir(self, job_id: str) -> Path:
        if not job_id.startswith("job-") or not job_id[4:].isalnum():
            raise KeyError(job_id)
        return self.root / job_id

    def _load(self, job_id: str) -> dict[str, Any]:
        path = self._dir(job_id) / "job.json"
        if not path.is_file():
            raise KeyError(job_id)
        return json.loads(path.read_text())  # type: ignore[no-any-return]

    def _save(self, job: dict[str, Any]) -> None:
        path = self._dir(job["id"]) / "job.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(job, indent=2, default=str))
        os.replace(tmp, path)

    def _set_status(self, job_id: str, status: str, **changes: Any) -> dict[str, Any]:
        with self._lock:
            job = self._load(job_id)
            if job["status"] in _TERMINAL:
                return job
            job.update(status=status, **changes)
            if status == "running":
                job["started_at"] = _now()
            if status in _TERMINAL:
                job["finished_at"] = _now()
            self._save(job)
        event: dict[str, Any] = {"type": "status", "status": status}
        if changes.get("error"):
            event["error"] = changes["error"]
        _append_event(self._dir(job_id) / "events.jsonl", event)
        return job

    # ------------------------------------------------------------------------------------------ public

    def create(self, config: dict[str, Any], upload: Path) -> dict[str, Any]:
        """Register a job whose episodes are at ``upload`` (moved into the job directory) and schedule it."""
        job_id = "job-" + uuid.uuid4().hex[:16]
        d = self._dir(job_id)
        d.mkdir(parents=True)
        os.replace(upload, d / "episodes.parquet")
        (d / "config.json").write_text(json.dumps(config, indent=2))
        job = {
            "id": job_id,
            "object": "training.job",
            "status": "queued",
            "created_at": _now(),
            "started_at": None,
            "finished_at": None,
            "error": None,
            "model": config.get("model"),
            "pid": None,
            "result": None,
        }
        with self._lock:
            self._save(job)
        _append_event(d / "events.jsonl", {"type": "status", "status": "queued"})
        self._schedule()
        return self.get(job_id)

    def get(self, job_id: str) -> dict[str, Any]:
        """The job with its progress (last logged step) and final metrics."""
        job = self._load(job_id)
        step, max_steps = 0, None
        for ev in _read_events(self._dir(job_id) / "events.jsonl"):
            if ev.get("type") == "metrics":
                step = int(ev.get("step") or step)
                max_steps = ev.get("max_steps") or max_steps
        job["progress"] = {"step": step, "max_steps": max_steps}
        job.pop("pid", None)
        return job

    def list(self) -> list[dict[str, Any]]:
        """All jobs, newest first."""
        jobs = []
        for d in self.root.glob("job-*"):
            try:
                jobs.append(self.get(d.name))
            except (KeyError, ValueError):
                continue
        return sorted(jobs, key=lambda j: -float(j.get("created_at") or 0))

    def events(self, job_id: str, after: int = 0, limit: int = 100) -> dict[str, Any]:
        """Events with ``seq > after`` (at most ``limit``)."""
        self._load(job_id)
        evs = [e for e in _read_events(self._dir(job_id) / "events.jsonl") if e["seq"] > after]
        page = evs[: max(1, limit)]
        return {
            "object": "list",
            "data": page,
            "has_more": len(evs) > len(page),
            "last_seq": page[-1]["seq"] if page else after,
        }

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a queued or running job (idempotent; a finished job is returned unchanged)."""
        with self._lock:
            job = self._load(job_id)
            if job["status"] in _TERMINAL:
                return self.get(job_id)
            proc = self._procs.get(job_id)
            pid = job.get("pid")
            self._set_status(job_id, "cancelled")
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        elif pid and _pid_alive(int(pid)):  # a worker adopted after a server restart
            os.kill(int(pid), signal.SIGTERM)
        self._schedule()
        return self.get(job_id)

    def artifacts(self, job_id: str) -> list[dict[str, Any]]:
        """Files under the job's output directory (relative paths, sizes)."""
        self._load(job_id)
        out = self._dir(job_id) / "output"
        if not out.is_dir():
            return []
        return [
            {"path": p.relative_to(out).as_posix(), "bytes": p.stat().st_size}
            for p in sorted(out.rglob("*"))
            if p.is_file()
        ]

    def artifact_path(self, job_id: str, name: str) -> Path:
        """Resolve an artifact path inside the job's output directory (no escaping it)."""
        self._load(job_id)
        out = (self._dir(job_id) / "output").resolve()
        path = (out / name).resolve()
        if out not in path.parents or not path.is_file():
            raise KeyError(name)
        return path

    def shutdown(self) -> None:
        """Stop every running worker (the jobs are marked failed: server stopped)."""
        with self._lock:
            procs = list(self._procs.items())
        for job_id, proc in procs:
            proc.terminate()
            self._set_status(job_id, "failed", error="the training server stopped while the job was running")

    # ---------------------------------------------------------------------------------------- workers

    def _schedule(self) -> None:
        with self._lock:
            running = sum(1 for p in self._procs.values() if p.poll() is None)
            queued = sorted(
                (j for j in (self._safe_load(d.name) for d in self.root.glob("job-*")) if j),
                key=lambda j: float(j.get("created_at") or 0),
            )
            for job in queued:
                if running >= self.max_jobs:
                    break
                if job["status"] == "queued":
                    self._start(job["id"])
                    running += 1

    def _safe_load(self, job_id: str) -> dict[str, Any] | None:
        try:
            return self._load(job_id)
        except (KeyError, ValueError):
            return None

    def _start(self, job_id: str) -> None:
        d = self._dir(job_id)
        env = {k: v for k, v in os.environ.items() if k not in self.secret_env}
        root = str(Path(__file__).resolve().parents[2])  # the repository root, for `-m trainers...`
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        log = open(d / "worker.log", "ab")  # handed to the child; closed below
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "trainers.remote.http_server", "--run-job", str(d)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=str(d),
            )
        finally:
            log.close()
        self._procs[job_id] = proc
        self._set_status(job_id, "running", pid=proc.pid)
        threading.Thread(target=self._watch, args=(job_id, proc), daemon=True).start()

    def _watch(self, job_id: str, proc: subprocess.Popen[bytes] | None, pid: int | None = None) -> None:
        if proc is not None:
            code = proc.wait()
        else:
            while pid and _pid_alive(pid):
                time.sleep(1.0)
            code = None
        self._finish(job_id, code)
        with self._lock:
            self._procs.pop(job_id, None)
        self._schedule()

    def _finish(self, job_id: str, code: int | None) -> None:
        d = self._dir(job_id)
        result_path = d / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else None
        if result and result.get("status") == "succeeded":
            self._set_status(job_id, "succeeded", result=result)
        elif result:
            self._set_status(job_id, "failed", error=result.get("error") or "training failed", result=result)
        else:
            tail = ""
            log = d / "worker.log"
            if log.is_file():
                lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
                tail = f": {lines[-1][:300]}" if lines else ""
            if code is None:
                error = "the training server stopped while the job was running"
            else:
                error = f"the training worker exited with code {code}{tail}"
            self._set_status(job_id, "failed", error=error)

    def _recover(self) -> None:
        # Workers exit when their server dies (see run_job), so a job left "running" by a previous server
        # process is finished from its result file, or failed.
        for d in self.root.glob("job-*"):
            job = self._safe_load(d.name)
            if job and job["status"] in ("running", "queued"):
                pid = job.get("pid")
                if job["status"] == "running" and pid and _pid_alive(int(pid)):
                    threading.Thread(
                        target=self._watch, args=(job["id"], None, int(pid)), daemon=True
                    ).start()
                elif job["status"] == "running":
                    self._finish(job["id"], None)
        self._schedule()


def _check_config(raw: str) -> dict[str, Any]:
    """Parse and validate the client's JSON config; returns it without server-owned fields."""
    from trainers.trl_grpo import TRLGRPOConfig

    try:
        cfg = json.loads(raw or "{}")
    except ValueError as exc:
        raise UserError(f"config is not valid JSON: {exc}") from exc
    if not isinstance(cfg, dict):
        raise UserError("config must be a JSON object of TRLGRPOConfig fields")
    names = {f.name for f in dataclasses.fields(TRLGRPOConfig)}
    unknown = sorted(set(cfg) - names)
    if unknown:
        raise UserError(f"unknown config field(s): {', '.join(unknown)}")
    cfg = {k: v for k, v in cfg.items() if k not in _SERVER_OWNED}
    config = TRLGRPOConfig(**cfg)
    from trainers.base import check_model

    try:
        check_model(config.model)
    except UserError as exc:
        raise UserError(f"on the server: {exc}") from exc
    return cfg


def _check_data(path: Path) -> int:
    from trainers._dataset import load_episodes
    from trainers.remote import validate_episodes

    episodes = load_episodes(path)
    validate_episodes(episodes)
    return len(episodes)


def create_app(
    workdir: str | os.PathLike[str],
    token: str,
    *,
    max_jobs: int = 1,
    max_upload_mb: int = 2048,
    token_env: str = "TRACERL_SERVER_TOKEN",
) -> Any:
    """Build the FastAPI application.

    Args:
        workdir: Directory for job state, uploads and artifacts.
        token: Bearer token every ``/v1`` request must present.
        max_jobs: Jobs trained at the same time (others wait ``queued``).
        max_upload_mb: Largest accepted Parquet upload.
        token_env: Environment variable holding the token (removed from the workers' environment).

    Returns:
        A ``fastapi.FastAPI`` app (serve it with uvicorn).

    Example:
        >>> app = create_app("/tmp/jobs", token="s3cret")  # doctest: +SKIP
        >>> import uvicorn; uvicorn.run(app, port=8000)  # doctest: +SKIP
    """
    if FastAPI is None:  # pragma: no cover
        raise UserError("the training server needs fastapi and uvicorn: pip install 'tracerl[remote]'")
    if not token:
        raise ValueError("token must not be empty")
    jobs = JobManager(workdir, max_jobs=max_jobs, secret_env=(token_env,))
    app = FastAPI(title="tracerl training server", version="1")
    app.state.jobs = jobs
    _require_token(app, token)
    _job_routes(app, jobs, max_upload_mb)
    return app


def _job_routes(app: Any, jobs: JobManager, max_upload_mb: int) -> None:
    """The ``/healthz`` and ``/v1/jobs`` endpoints (see the module docstring)."""

    def _missing(job_id: str) -> HTTPException:
        return HTTPException(404, {"message": f"no job {job_id}", "reasons": []})

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.post("/v1/jobs", status_code=201)
    def submit(file: UploadFile = File(...), config: str = Form("{}")) -> dict[str, Any]:
        tmp = jobs.root / f".upload-{uuid.uuid4().hex}.parquet"
        try:
            _receive(file, tmp, max_upload_mb)
            try:
                cfg = _check_config(config)
                _check_data(tmp)
            except UserError as exc:
                reasons = list(getattr(exc, "reasons", []))
                raise HTTPException(422, {"message": str(exc), "reasons": reasons}) from exc
            return jobs.create(cfg, tmp)
        finally:
            tmp.unlink(missing_ok=True)

    @app.get("/v1/jobs")
    def list_jobs() -> dict[str, Any]:
        return {"object": "list", "data": jobs.list()}

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str) -> dict[str, Any]:
        try:
            return jobs.get(job_id)
        except KeyError:
            raise _missing(job_id) from None

    @app.get("/v1/jobs/{job_id}/events")
    def get_events(job_id: str, after: int = 0, limit: int = 100) -> dict[str, Any]:
        try:
            return jobs.events(job_id, after, limit)
        except KeyError:
            raise _missing(job_id) from None

    @app.post("/v1/jobs/{job_id}/cancel")
    def cancel(job_id: str) -> dict[str, Any]:
        try:
            return jobs.cancel(job_id)
        except KeyError:
            raise _missing(job_id) from None

    @app.get("/v1/jobs/{job_id}/artifacts")
    def list_artifacts(job_id: str) -> dict[str, Any]:
        try:
            return {"object": "list", "data": jobs.artifacts(job_id)}
        except KeyError:
            raise _missing(job_id) from None

    @app.get("/v1/jobs/{job_id}/artifacts/{name:path}")
    def get_artifact(job_id: str, name: str) -> Any:
        try:
            return FileResponse(jobs.artifact_path(job_id, name))
        except KeyError:
            raise HTTPException(404, {"message": f"no artifact {name} in {job_id}", "reasons": []}) from None


def _require_token(app: Any, token: str) -> None:
    """Refuse every ``/v1`` request without ``Authorization: Bearer <token>`` (401)."""
    expected = f"Bearer {token}".encode()

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Any:
        if request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse(
                    {"detail": {"message": "missing or invalid bearer token", "reasons": []}},
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
        return await call_next(request)


def _receive(file: Any, dest: Path, max_upload_mb: int) -> None:
    """Stream an upload to ``dest`` in chunks; 413 once it grows past ``max_upload_mb``."""
    size = 0
    with open(dest, "wb") as fh:
        while chunk := file.file.read(_CHUNK):
            size += len(chunk)
            if size > max_upload_mb * _CHUNK:
                raise HTTPException(413, {"message": f"upload larger than {max_upload_mb} MB", "reasons": []})
            fh.write(chunk)


# -------------------------------------------------------------------------------------------------- worker


def _event_callback(events_path: Path) -> Any:
    from transformers import TrainerCallback

    class EventWriter(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            _append_event(
                events_path, {"type": "log", "message": "training started", "max_steps": state.max_steps}
            )

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any):
            clean = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float, str, bool))}
            _append_event(
                events_path,
                {
                    "type": "metrics",
                    "step": state.global_step,
                    "max_steps": state.max_steps,
                    "metrics": clean,
                },
            )

    return EventWriter()


def _exit_with_parent() -> None:
    """Exit when the server that started this worker is gone (no orphaned GPU jobs)."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="tracerl-parent-watch", daemon=True).start()


def run_job(job_dir: str | os.PathLike[str]) -> int:
    """Train one job in this process (the worker side of ``POST /v1/jobs``); writes ``result.json``.

    Example:
        >>> run_job("/tmp/jobs/jobs/job-0123456789ab")  # doctest: +SKIP
        0
    """
    d = Path(job_dir)
    _exit_with_parent()
    events = d / "events.jsonl"
    result_path = d / "result.json"
    try:
        from trainers.trl_grpo import TRLGRPOConfig, TRLGRPOTrainer

        cfg = json.loads((d / "config.json").read_text())
        config = TRLGRPOConfig(**{**cfg, "output_dir": str(d / "output")})
        result = TRLGRPOTrainer().train(
            str(d / "episodes.parquet"),
            config,
            callbacks=[_event_callback(events)],
            extra_config={"backend": "trl", "server_job": d.name},
        )
        out = {
            "status": "succeeded",
            "global_step": result.global_step,
            "metrics": result.metrics,
            "adapter": result.adapter,
            "checkpoint": "final",
            "report": result.report.lines() if result.report else [],
        }
        code = 0
    except UserError as exc:
        out, code = {"status": "failed", "error": str(exc)}, 2
    except Exception as exc:  # any crash becomes a failed job with the error; the traceback goes to the log
        traceback.print_exc()
        out, code = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}, 1
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str))
    os.replace(tmp, result_path)
    return code


# -------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    """Run the server (or, with ``--run-job``, one worker).

    Returns:
        Exit status: 0, or 2 with one line on stderr for a configuration error.

    Example:
        >>> main(["--port", "8000", "--workdir", "/data/jobs"])  # doctest: +SKIP
    """
    p = argparse.ArgumentParser(
        prog="python -m trainers.remote.http_server", description="tracerl training server"
    )
    p.add_argument("--host", default="127.0.0.1", help="Interface to listen on (default 127.0.0.1).")
    p.add_argument("--port", type=int, default=8000, help="Port (0 picks a free one; printed at start).")
    p.add_argument(
        "--token-env", default="TRACERL_SERVER_TOKEN", help="Environment variable holding the bearer token."
    )
    p.add_argument("--workdir", default="tracerl-server", help="Directory for jobs, uploads and artifacts.")
    p.add_argument("--max-jobs", type=int, default=1, help="Jobs trained at the same time.")
    p.add_argument("--max-upload-mb", type=int, default=2048, help="Largest accepted upload in MB.")
    p.add_argument("--run-job", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.run_job:
        return run_job(args.run_job)
    token = os.environ.get(args.token_env, "")
    if not token:
        print(
            f"error: set the bearer token in ${args.token_env} (requests without it are refused)",
            file=sys.stderr,
        )
        return 2
    if FastAPI is None:
        print(
            "error: the training server needs fastapi and uvicorn: pip install 'tracerl[remote]'",
            file=sys.stderr,
        )
        return 2
    import uvicorn

    app = create_app(
        args.workdir,
        token,
        max_jobs=args.max_jobs,
        max_upload_mb=args.max_upload_mb,
        token_env=args.token_env,
    )
    try:
        sock = socket.create_server((args.host, args.port))
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    print(
        f"tracerl training server listening on http://{args.host}:{port} "
        f"(workdir {Path(args.workdir).resolve()})",
        file=sys.stderr,
        flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # pragma: no cover
        pass
    finally:
        app.state.jobs.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
