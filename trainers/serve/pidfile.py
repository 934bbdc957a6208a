"""The policy server's process: its pid file, the wait for it to answer, its stop.

One server per output directory, never a stale one beside a new one.

:class:`~trainers.serve.policy.LocalPolicy` (subprocess mode) records the ``python -m sdk.serve`` process it
started in ``OUT/policy-server.pid`` (JSON: ``pid``, ``parent``, ``port``). The server itself exits with
its parent (``--parent-pid``), so after a ``kill -9`` of the loop it is normally gone within a second; the
file covers what that cannot: a server from an older tracerl, a server stuck past its parent, a re-run
started before the orphan noticed. On start, :func:`claim` looks at the recorded process:

- gone, or not a policy server (its pid reused): the record is stale and is replaced;
- a policy server whose parent still runs (another run, or another policy object, on this output
  directory): refused with one line (:class:`~trainers.errors.UserError`), nothing is stopped;
- a policy server orphaned by an earlier run: stopped (SIGTERM, then SIGKILL) and reported on one line;
  it would otherwise hold its port and (GPU) memory for ever beside the new one.

Example:
    >>> claim("runs/loop/policy-server.pid")  # doctest: +SKIP
    >>> record("runs/loop/policy-server.pid", proc.pid, port)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from trainers.errors import UserError

__all__ = ["claim", "free_port", "process_info", "record", "release", "terminate", "wait_healthy"]

_SERVER_MODULES = ("sdk.serve", "trainers.serve")


def process_info(pid: int) -> tuple[int, str] | None:
    """``(parent pid, command line)`` of a live process; ``None`` when there is none (or a zombie).

    Example:
        >>> process_info(os.getpid())[0] == os.getppid()
        True
    """
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        return None if fields[0] in ("Z", "X") else (int(fields[1]), cmd.strip())
    out = subprocess.run(["ps", "-o", "stat=,ppid=,command=", "-p", str(pid)], capture_output=True, text=True)
    parts = out.stdout.strip().split(None, 2)
    if out.returncode != 0 or len(parts) < 3 or parts[0].startswith("Z"):
        return None
    return int(parts[1]), parts[2]


def _is_server(cmd: str) -> bool:
    return any(f"-m {m}" in cmd or f"{m}/__main__" in cmd for m in _SERVER_MODULES)


def _stop(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM ``pid``, SIGKILL it after ``timeout`` s; ``True`` once it is gone (bounded: never hangs)."""
    for sig, wait in ((signal.SIGTERM, timeout), (getattr(signal, "SIGKILL", signal.SIGTERM), 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if process_info(pid) is None:
                return True
            time.sleep(0.1)
    return False


def claim(path: str | os.PathLike[str]) -> None:
    """Make way for this process's policy server in ``path``'s directory (see the module's rules).

    Raises:
        UserError: Another live run's policy server is recorded there, or an orphan would not stop.

    Example:
        >>> claim("runs/loop/policy-server.pid")  # doctest: +SKIP
    """
    file = Path(path)
    try:
        rec = json.loads(file.read_text())
        pid, parent, port = int(rec["pid"]), int(rec.get("parent") or 0), rec.get("port")
    except (OSError, ValueError, KeyError, TypeError):
        return  # nothing recorded (or not readable as a record): nothing to stop
    info = process_info(pid)
    if info is None or not _is_server(info[1]):
        file.unlink(missing_ok=True)
        return
    if info[0] == parent and process_info(parent) is not None:
        raise UserError(
            f"another run (process {parent}) is serving its policy from this output directory (server "
            f"process {pid}, port {port}, recorded in {file}): stop it first, or use another output directory"
        )
    if not _stop(pid):
        raise UserError(f"a policy server left by an earlier run (process {pid}, port {port}) would not stop")
    print(f"stopped a policy server left by an earlier run (process {pid}, port {port})", file=sys.stderr)
    file.unlink(missing_ok=True)


def record(path: str | os.PathLike[str], pid: int, port: int) -> None:
    """Write the record of the server ``pid`` started by this process (atomically).

    Example:
        >>> record("runs/loop/policy-server.pid", 4242, 8000)  # doctest: +SKIP
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps({"pid": pid, "parent": os.getpid(), "port": port}) + "\n")
    os.replace(tmp, file)


def release(path: str | os.PathLike[str], pid: int) -> None:
    """Remove the record once its server ``pid`` has been stopped (a record of another server stays).

    Example:
        >>> release("runs/loop/policy-server.pid", 4242)  # doctest: +SKIP
    """
    file = Path(path)
    try:
        if int(json.loads(file.read_text())["pid"]) == pid:
            file.unlink()
    except (OSError, ValueError, KeyError, TypeError):
        pass


def terminate(proc: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM ``proc``, and SIGKILL it if it has not exited within ``timeout`` seconds.

    Example:
        >>> terminate(subprocess.Popen(["sleep", "30"]), 5)
    """
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it).

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[Any] | None, timeout: float, log: Path | None) -> None:
    """Wait until ``url`` answers 200; a ``proc`` that exits meanwhile is one error with its log's tail.

    Raises:
        UserError: The process exited, or nothing answered within ``timeout`` seconds.

    Example:
        >>> wait_healthy("http://127.0.0.1:8000/health", proc, 300, Path("serve.log"))  # doctest: +SKIP
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise UserError(f"policy server exited with code {proc.returncode} while starting:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise UserError(f"policy server did not answer {url} within {timeout:.0f} s")
