"""Policy servers for the training loop: serve the current weights, swap in new ones after each round.

Three kinds, one interface (:class:`PolicyServer`: ``start``, ``update``, ``stop``, ``base_url``,
``model_name``):

- :class:`LocalPolicy`: ``sdk.serve`` on the CPU or one GPU (``device``), in this process (a uvicorn
  thread) or as a ``python -m sdk.serve`` subprocess; new weights are pushed or loaded in place.
- :class:`VLLMPolicy`: launches ``vllm serve`` for GPUs. LoRA adapters load through vLLM's runtime API
  (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, set here); full weights are pushed in place with
  ``weight_transfer`` (:mod:`trainers.serve.vllm_weights`), else the server restarts on them. Written
  against vLLM's documented API and tested against a scripted stand-in; not run on a GPU.
- :class:`ExternalPolicy`: a server the user already runs; reloaded through ``/admin/reload``
  (``sdk.serve``) or the vLLM LoRA endpoints, or not at all.

Policy versions: ``update(..., policy_version=N)`` publishes weights as version ``N``. ``sdk.serve``
reports it in every response; vLLM serves version N as ``f"{name}@v{N}"`` (a LoRA adapter loaded beside
the previous one, which is unloaded once no request is on its way to it; or a restarted server), so each
response's ``model`` names its version (``sdk.openai_wire.policy_version_of``) and the stored call keeps
it. Agents find the policy through the environment: :func:`export_env` sets ``TRACERL_POLICY_BASE_URL``
and ``TRACERL_POLICY_MODEL``.

One served name: the name agents send (``model_name``) and the address they call stay the same for the
whole run; agents read them once. With :class:`LocalPolicy` a LoRA adapter pushed as the policy is served
as ``<model_name>-lora`` and the server routes ``model_name`` to it (an alias); vLLM has no aliases, so
:class:`VLLMPolicy` (and :class:`ExternalPolicy` with ``reload="vllm-lora"``) put a proxy the loop owns in
front of it (:mod:`trainers.serve.alias`) that sends ``model_name`` to the version served now. Each
response's ``policy_version`` or ``model`` (the adapter that served it) says which weights answered.

The admin credential: :class:`LocalPolicy` makes a fresh one per run (``secrets.token_urlsafe``), hands it
to its server process on standard input (not the command line, which ``ps`` shows, nor the environment)
and sends it with its own pushes and reloads; :class:`ExternalPolicy` takes the one its server was started
with (``admin_token``, ``admin_token_file`` or ``$TRACERL_ADMIN_TOKEN``). :func:`export_env` never exports
it and takes ``$TRACERL_ADMIN_TOKEN`` out of this process's environment, which agents inherit.

Example:
    >>> from trainers.serve.policy import make_policy
    >>> policy = make_policy(PolicySpec(kind="local"), "runs/sft")  # doctest: +SKIP
    >>> policy.start(); policy.update("runs/train/round-1/final"); policy.stop()  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sdk import _env
from trainers.errors import UserError
from trainers.serve.pidfile import free_port, terminate, wait_healthy
from trainers.serve.versions import StaleVersion, next_version
from trainers.settings import PolicySpec

__all__ = [
    "ENV_ADMIN_TOKEN",
    "ENV_BASE_URL",
    "ENV_MODEL",
    "ExternalPolicy",
    "LocalPolicy",
    "PolicyServer",
    "VLLMPolicy",
    "export_env",
    "make_policy",
]

ENV_BASE_URL = _env.TRACERL_POLICY_BASE_URL
"""Set by the loop: the policy's OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
ENV_MODEL = _env.TRACERL_POLICY_MODEL
"""Set by the loop: the model name agents send, the same for the whole run."""
ENV_ADMIN_TOKEN = _env.TRACERL_ADMIN_TOKEN
"""The policy server's admin credential (:class:`ExternalPolicy` reads it; :func:`export_env` removes it)."""


@runtime_checkable
class PolicyServer(Protocol):
    """What the loop needs from a policy server.

    Example:
        >>> isinstance(ExternalPolicy("http://127.0.0.1:8000/v1", "policy"), PolicyServer)
        True
    """

    base_url: str
    model_name: str
    policy_version: int

    def start(self) -> None:
        """Start serving (a no-op when already serving)."""

    def update(
        self, checkpoint: str, *, adapter: str | None = None, policy_version: int | None = None
    ) -> None:
        """Serve ``checkpoint`` (full weights); ``adapter`` is the LoRA adapter it was merged from.

        ``policy_version``: the version these weights are published as (default: the current one + 1).
        """

    def stop(self) -> None:
        """Stop what :meth:`start` started."""

    def exit_code(self) -> int | None:
        """The exit status of a server process that has exited; ``None`` while it runs or without one."""


def export_env(policy: PolicyServer) -> None:
    """Tell agents in this process (and its children) where the policy is.

    Example:
        >>> export_env(ExternalPolicy("http://127.0.0.1:9/v1", "policy"))
        >>> os.environ[ENV_MODEL]
        'policy'
    """
    os.environ[ENV_BASE_URL] = policy.base_url
    os.environ[ENV_MODEL] = policy.model_name
    for name in _env.TRAINER_ONLY:  # agents inherit this environment: the trainer's credentials leave it
        os.environ.pop(name, None)


def _post(
    url: str,
    body: dict[str, Any] | bytes,
    timeout: float = 600.0,
    kind: str | None = None,
    token: str | None = None,
) -> tuple[int, str]:
    """POST JSON or bytes (of content type ``kind``); ``(status, text)``, 0 if the server did not answer.

    ``token``: the admin credential, sent as ``Authorization: Bearer``.
    """
    raw = isinstance(body, bytes)
    data = body if raw else json.dumps(body).encode()
    kind = kind or ("application/octet-stream" if raw else "application/json")
    headers = {"Content-Type": kind}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        return 0, f"the policy server did not answer: {exc}"


def _next_version(name: str, current: int, requested: int | None) -> int:
    """The version a handle publishes next where it counts them itself (:func:`next_version`'s rule)."""
    try:
        return next_version(name, current, requested)
    except StaleVersion as exc:
        raise UserError(f"policy {exc}") from None


def _vllm_load(v1: str, name: str, path: str) -> None:
    """Load the LoRA adapter at ``path`` as ``name`` on the vLLM server at ``v1``.

    ``name`` is unloaded first (a 404 when it is not loaded, as it is unless a resumed run loads its
    version again), as vLLM refuses to load a name twice.
    """
    _post(f"{v1}/unload_lora_adapter", {"lora_name": name})
    status, text = _post(f"{v1}/load_lora_adapter", {"lora_name": name, "lora_path": path})
    if status != 200:
        raise UserError(f"vLLM refused the LoRA adapter {path} ({status}): {text[:500]}")


def _vllm_switch(v1: str, proxy: Any, name: str, path: str, previous: str | None) -> None:
    """Load version ``name`` of the adapter, send the agents' name to it, then unload ``previous``.

    Requests vLLM is still running on ``previous`` keep its loaded weights; ``proxy.route`` returns once
    none it rewrote to that name is still on its way to the server, so none is refused for it.
    """
    _vllm_load(v1, name, path)
    if proxy is not None:
        proxy.route(name)
    if previous is not None and previous != name:
        _post(f"{v1}/unload_lora_adapter", {"lora_name": previous})


class LocalPolicy:
    """``sdk.serve`` serving a local checkpoint, in this process or as a subprocess.

    Args:
        model: Checkpoint directory (model + tokenizer).
        model_name: Name the server reports and agents send.
        subprocess: Run ``python -m sdk.serve`` in a child process (keeps the server's memory and
            threads out of the training process) instead of a uvicorn thread here.
        threads: torch threads of the subprocess.
        log: File for the subprocess's output.
        adapters: LoRA adapters served beside the base, ``{name: adapter directory}`` (agents send the
            name as ``model``); :meth:`update_adapter` replaces one while the others keep serving.
        pid_file: Where the subprocess is recorded (``make_policy``: ``OUT/policy-server.pid``); one left
            by an earlier run is stopped, one of a run still going refused (:mod:`trainers.serve.pidfile`).
            The subprocess exits with this process in any case (``--parent-pid``), ``kill -9`` included.
        device: Where the model runs: ``"cpu"`` (default), ``"cuda"`` or ``"cuda:N"`` (checked here).
        dtype: What checkpoints load as: ``float32`` (default), ``bfloat16``, ``float16``, ``auto``.
        reload_roots: Directories the server process may reload checkpoints from, beside ``model`` and the
            adapters' (``make_policy``: the run's output directory).

    The server process's admin routes need a credential made here per run and known only to this object
    (in this process the server's admin routes are off: pushes and reloads are calls).

    Example:
        >>> p = LocalPolicy("runs/sft", model_name="policy")  # doctest: +SKIP
        >>> p.start(); p.update("runs/round-1/final")  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str,
        model_name: str = "policy",
        *,
        subprocess: bool = False,
        threads: int | None = None,
        log: str | os.PathLike[str] | None = None,
        adapters: dict[str, str] | None = None,
        pid_file: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        reload_roots: list[str] | None = None,
    ) -> None:
        if device != "cpu" or dtype != "float32":  # checked now, not at start; torch imported only then
            from trainers.serve.weights import serving_device, serving_dtype

            try:
                serving_device(device), serving_dtype(dtype)
            except ValueError as exc:
                raise UserError(f"policy {exc}") from None
        self.model, self.model_name, self.device, self.dtype = str(model), model_name, device, dtype
        self.reload_roots = [str(r) for r in reload_roots or []]
        self._admin_token = secrets.token_urlsafe(32)  # this run's; never in an agent's environment
        self.pid_file = Path(pid_file) if pid_file else None
        self.adapters = {name: str(path) for name, path in (adapters or {}).items()}
        self.use_subprocess, self.threads = subprocess, threads
        self.log = Path(log) if log else None
        self.base_url, self.policy_version = "", 0
        self._server: Any = None
        self._proc: subprocess.Popen[Any] | None = None
        self._port = 0
        self._lora_name: str | None = None  # the adapter pushed as the policy (LoRA training)
        self._no_ipc = False  # the server process could not open CUDA IPC handles: pushes go through the host

    @property
    def push_device(self) -> str | None:
        """Where :meth:`push` wants the weights: the server's device in this process, the host for a CPU one.

        ``None`` for a process on a GPU: the trainer's own tensors, copied once by the push (CUDA IPC).
        """
        if not self.use_subprocess or self.device == "cpu":
            return self.device
        return None

    def start(self) -> None:
        """Start serving ``model``."""
        if self._server is not None or self._proc is not None:
            return
        if not self.use_subprocess:
            from trainers.serve.app import LocalPolicyServer

            self._server = LocalPolicyServer(
                self.model,
                model_name=self.model_name,
                adapters=self.adapters,
                policy_version=self.policy_version,
                device=self.device,
                dtype=self.dtype,
            ).start()
            self.base_url = self._server.base_url
            return
        from trainers.serve import pidfile

        if self.pid_file is not None:
            pidfile.claim(self.pid_file)  # never a second server beside one an earlier run left
        self._port = free_port()
        cmd = [sys.executable, "-m", "sdk.serve", "--model", self.model, "--port", str(self._port)]
        cmd += ["--parent-pid", str(os.getpid())]  # it exits when this process is gone, even by kill -9
        cmd += ["--model-name", self.model_name, "--policy-version", str(self.policy_version)]
        for name, path in self.adapters.items():
            cmd += ["--adapter", f"{name}={path}"]
        for root in self.reload_roots:
            cmd += ["--reload-root", root]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        cmd += ["--device", self.device, "--dtype", self.dtype, "--admin-token-file", "-"]
        out: Any = subprocess.DEVNULL
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log, "ab")  # the child process writes to it
        env = {k: v for k, v in os.environ.items() if k not in _env.TRAINER_ONLY}  # the token comes on stdin
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env
        )
        try:  # on standard input: neither ps nor /proc/PID/environ shows it
            assert self._proc.stdin is not None
            self._proc.stdin.write(f"{self._admin_token}\n".encode())
            self._proc.stdin.close()
        except OSError:  # it exited at once: wait_healthy reports its error
            pass
        if self.pid_file is not None:
            pidfile.record(self.pid_file, self._proc.pid, self._port)
        self.base_url = f"http://127.0.0.1:{self._port}/v1"
        wait_healthy(f"http://127.0.0.1:{self._port}/health", self._proc, 300, self.log)

    def update(
        self, checkpoint: str, *, adapter: str | None = None, policy_version: int | None = None
    ) -> None:
        """Load the full-weight ``checkpoint`` in place as ``policy_version`` (default: the current + 1).

        ``adapter`` is not needed: it is merged. Requests already generating finish on the old weights.
        """
        if self._server is None and self._proc is None:  # start() serves it as this version
            version = _next_version(self.model_name, self.policy_version, policy_version)
        else:
            body = {"checkpoint": str(checkpoint), "policy_version": policy_version}
            version = self._reload(body, "policy reload failed")
        self.model, self.policy_version = str(checkpoint), version

    def _reload(self, body: dict[str, Any], failed: str) -> int:
        """Reload what ``body`` (``/admin/reload``'s fields) names: a call here, else that route."""
        if self._server is None:
            status, text = _post(f"http://127.0.0.1:{self._port}/admin/reload", body, token=self._admin_token)
            return self._version_of(status, text, failed)
        path, version = body["checkpoint"], body["policy_version"]
        try:
            if "adapter" in body:
                return self._server.reload_adapter(body["adapter"], path, policy_version=version)
            return self._server.reload(path, policy_version=version)
        except (ValueError, OSError) as exc:
            raise UserError(f"{failed}: {exc}") from None

    def _version_of(self, status: int, text: str, failed: str) -> int:
        """The version the server process's admin answer names (``UserError``: it names none, and why)."""
        code = self._proc.poll() if status == 0 and self._proc is not None else None
        if code is not None:
            raise UserError(f"the policy server exited (code {code})")
        if status != 200:
            raise UserError(f"{failed} ({status}): {text[:500]}" if status else text)
        return int(json.loads(text)["policy_version"])

    def push(
        self,
        tensors: Mapping[str, Any],
        *,
        adapter_config: Mapping[str, Any] | None = None,
        adapter: str | None = None,
        policy_version: int | None = None,
    ) -> dict[str, Any]:
        """Serve weights sent as tensors, without a checkpoint on disk.

        Returns ``{"policy_version", "bytes", "seconds"}``. Full weights (no ``adapter_config``) replace
        the base's. A LoRA adapter (``adapter_config``: its peft config's ``to_dict()``) is served as
        ``adapter`` (default: ``<model_name>-lora``); the policy's adapter (the first pushed) is also served
        as :attr:`model_name` (an alias on the server), so the name agents send never changes. In this
        process the tensors are copied into the served model; to a server process they go as one
        ``safetensors`` buffer over the loopback, with this run's admin credential.

        Raises:
            UserError: The server is gone or refused the weights (names or shapes that do not fit): the
                served weights are unchanged.

        Example:
            >>> policy.push(*resident.weights(), policy_version=3)  # doctest: +SKIP
            {'policy_version': 3, 'bytes': 428032, 'seconds': 0.01}
        """
        if adapter_config is not None and adapter is None:
            adapter = self._lora_name or f"{self.model_name}-lora"
        # the policy's adapter: the first one pushed new (with its config), then that one again
        first = adapter is not None and adapter_config is not None
        policy = adapter == self._lora_name if self._lora_name else first
        alias = self.model_name if policy else None  # the name agents send routes to the policy's adapter
        t0 = time.perf_counter()
        if self._server is not None:
            try:
                version = self._server.push(
                    tensors,
                    adapter=adapter,
                    adapter_config=adapter_config,
                    policy_version=policy_version,
                    alias=alias,
                )
            except ValueError as exc:
                raise UserError(f"the policy server refused the weights: {exc}") from None
            moved = sum(t.numel() * t.element_size() for t in tensors.values())
        elif self._proc is not None:
            query = {"adapter": adapter} if adapter else {}
            if alias is not None:
                query["alias"] = alias
            if policy_version is not None:
                query["policy_version"] = str(int(policy_version))
            url = f"http://127.0.0.1:{self._port}/admin/weights?{urllib.parse.urlencode(query)}"
            status, text, moved = self._post_weights(url, tensors, adapter_config)
            version = self._version_of(status, text, "the policy server refused the weights")
        else:
            raise UserError("the policy server is not running: start() it before pushing weights")
        if policy:
            self._lora_name = adapter
            self.adapters.pop(adapter, None)
        if adapter is None or adapter == self._lora_name:
            self.policy_version = version
        return {"policy_version": version, "bytes": moved, "seconds": round(time.perf_counter() - t0, 4)}

    def _post_weights(
        self, url: str, tensors: Mapping[str, Any], adapter_config: Mapping[str, Any] | None
    ) -> tuple[int, str, int]:
        """POST a push to the server process: CUDA IPC handles where both can, else a safetensors body."""
        from trainers.serve import ipc
        from trainers.serve.weights import encode_push

        moved = sum(t.numel() * t.element_size() for t in tensors.values())
        shared = ipc.share(tensors, adapter_config) if self.device != "cpu" and not self._no_ipc else None
        if shared is not None:
            status, text = _post(url, shared.body, kind=ipc.CONTENT_TYPE, token=self._admin_token)
            del shared  # the server has let go of the buffer (it answered); torch frees it
            ipc.collect()
            if status != 400 or ipc.UNAVAILABLE not in text:
                return status, text, moved
            self._no_ipc = True  # said once; every later push goes through the host
            print(f"tracerl: pushing weights through the host: {text[:300]}", file=sys.stderr, flush=True)
        body = encode_push({k: v.to("cpu") for k, v in tensors.items()}, adapter_config)
        status, text = _post(url, body, token=self._admin_token)
        return status, text, len(body)

    def update_adapter(self, name: str, checkpoint: str, *, policy_version: int | None = None) -> int:
        """Load (or replace) the LoRA adapter served as ``name``; the base and other adapters keep serving.

        Returns the adapter's new version (``policy_version``, default: its current one + 1; 0 when new).

        Example:
            >>> p.update_adapter("router", "runs/router/step-20")  # doctest: +SKIP
            1
        """
        if self._server is None and self._proc is None:  # start() loads it
            version = 0 if policy_version is None else int(policy_version)
        else:
            body = {"adapter": name, "checkpoint": str(checkpoint), "policy_version": policy_version}
            version = self._reload(body, "adapter reload failed")
        self.adapters[name] = str(checkpoint)
        return version

    def stop(self) -> None:
        """Stop the server."""
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._proc is not None:
            terminate(self._proc, 30)
            if self.pid_file is not None:
                from trainers.serve import pidfile

                pidfile.release(self.pid_file, self._proc.pid)
            self._proc = None

    def exit_code(self) -> int | None:
        """The child server's exit status once it has exited (``None``: running, or served in-process).

        Example:
            >>> LocalPolicy("runs/sft").exit_code() is None
            True
        """
        return self._proc.poll() if self._proc is not None else None


class VLLMPolicy:
    """Launch ``vllm serve`` and keep it serving the loop's current weights (GPU machines).

    With ``lora=True`` the server starts with ``--enable-lora --max-lora-rank R`` on the base model
    (served as ``<model_name>-base``), and version N's adapter is loaded as ``<model_name>@vN``; the
    adapter must have been trained on that base model. Otherwise (or when the adapter's base is not the
    served model) the server restarts on the new full weights, served as ``<model_name>@vN``. Agents call
    the proxy in front of it (:mod:`trainers.serve.alias`, on ``port``) with ``model_name`` for the whole
    run; it forwards each request to the name served now (:attr:`served_name`), and vLLM's response names
    it, so the stored call says which version answered.

    Responses carry logprobs and token ids when the agent asks (``logprobs: true`` and, vLLM >= 0.10.2,
    ``return_token_ids: true`` in the request body); ``--max-logprobs`` bounds ``top_logprobs``.

    Args:
        model: Base model directory or hub id.
        model_name: Name agents send (the same for the whole run).
        lora: Serve LoRA adapters on the base (loaded at run time).
        max_lora_rank: ``--max-lora-rank`` (at least the adapters' rank).
        max_loras: ``--max-loras``, adapters in one batch: 2 lets requests still running on version N
            share batches with the first ones on N+1 while a versioned update swaps adapters.
        port: TCP port agents call, the proxy's (0: a free one); vLLM listens on a free one behind it
            (:attr:`server_port`).
        tool_call_parser: ``--tool-call-parser`` (with ``--enable-auto-tool-choice``), e.g. ``hermes``.
        extra_args: More ``vllm serve`` arguments (a list or one shell-quoted string).
        executable: The ``vllm`` command (tests pass a scripted stand-in).
        startup_timeout: Seconds to wait for ``/health``.
        log: File for the server's output.
        weight_transfer: Full weights are pushed into the running server (vLLM >= 0.33's weight-transfer
            routes, NCCL from this process's GPU; see :mod:`trainers.serve.vllm_weights`) instead of a
            restart on a saved copy. Not with ``lora`` (adapters go through the adapter API).
        weight_sender, master_address: :class:`~trainers.serve.vllm_weights.VLLMWeightTransfer`'s
            ``sender`` and ``master_address``.

    Example:
        >>> VLLMPolicy("Qwen/Qwen2.5-0.5B-Instruct", lora=True, port=8000).command()[:3]
        ['vllm', 'serve', 'Qwen/Qwen2.5-0.5B-Instruct']
        >>> VLLMPolicy("m", lora=True, port=8000).base_url
        'http://127.0.0.1:8000/v1'
    """

    def __init__(
        self,
        model: str,
        model_name: str = "policy",
        *,
        lora: bool = False,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        port: int = 0,
        tool_call_parser: str | None = None,
        extra_args: list[str] | str | None = None,
        executable: list[str] | str = "vllm",
        startup_timeout: float = 900.0,
        log: str | os.PathLike[str] | None = None,
        weight_transfer: bool = False,
        weight_sender: Any = None,
        master_address: str = "127.0.0.1",
    ) -> None:
        if weight_transfer and lora:
            raise UserError("policy weight_transfer is for full weights (adapters: vLLM's adapter API)")
        self.weight_transfer, self.weight_sender, self._transfer = weight_transfer, weight_sender, None
        self.master_address = master_address
        self.base_model, self.model, self.model_name = str(model), str(model), model_name
        self.name = model_name  # the stem of the served names f"{name}@v{N}"; agents send it as it is
        self.policy_version = 0
        self.lora, self.max_lora_rank, self.max_loras = lora, int(max_lora_rank), int(max_loras)
        self.port = port or free_port()
        self.server_port = free_port()
        self._served: str | None = None  # the versioned name now served (None: the name vLLM started with)
        self.tool_call_parser = tool_call_parser
        self.extra_args = shlex.split(extra_args) if isinstance(extra_args, str) else list(extra_args or [])
        self.executable = shlex.split(executable) if isinstance(executable, str) else list(executable)
        self.startup_timeout = startup_timeout
        self.log = Path(log) if log else None
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.server_url = f"http://127.0.0.1:{self.server_port}/v1"
        self.adapter: str | None = None
        self._proc: subprocess.Popen[Any] | None = None
        self._proxy: Any = None

    @property
    def served_base_name(self) -> str:
        """Name of the weights the server starts on (the base with LoRA, else :attr:`served_name`)."""
        return f"{self.name}-base" if self.lora else self.served_name

    @property
    def served_name(self) -> str:
        """The name on the server that requests for ``model_name`` go to now.

        Example:
            >>> VLLMPolicy("m", lora=True).served_name
            'policy-base'
        """
        if self._served is not None and (self.adapter is not None or not self.lora):
            return self._served
        return f"{self.name}-base" if self.lora else self.name

    def command(self) -> list[str]:
        """The ``vllm serve`` command line for the current weights.

        Example:
            >>> p = VLLMPolicy("m", lora=True, max_lora_rank=32, port=8001)
            >>> p.command()[3:7] == ['--host', '127.0.0.1', '--port', str(p.server_port)]
            True
            >>> p.command()[7:9]
            ['--served-model-name', 'policy-base']
        """
        cmd = [*self.executable, "serve", self.model, "--host", "127.0.0.1", "--port", str(self.server_port)]
        cmd += ["--served-model-name", self.served_base_name, "--max-logprobs", "20"]
        if self.lora:
            cmd += ["--enable-lora", "--max-lora-rank", str(self.max_lora_rank)]
            cmd += ["--max-loras", str(self.max_loras)]
        if self.tool_call_parser:
            cmd += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_call_parser]
        if self.weight_transfer:
            cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
        return cmd + self.extra_args

    def env(self) -> dict[str, str]:
        """The server's environment: this one, plus runtime LoRA updates when ``lora``."""
        env = dict(os.environ)
        if self.lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.weight_transfer:  # vLLM registers its weight-transfer routes in dev mode only
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env

    def start(self) -> None:
        """Start the proxy agents call, launch ``vllm serve`` and wait for ``/health``."""
        if self._proxy is None:
            from trainers.serve.alias import AliasProxy

            log = self.log.with_name("policy-alias.log") if self.log is not None else None
            upstream = f"http://127.0.0.1:{self.server_port}"
            self._proxy = AliasProxy(upstream, self.name, self.served_name, port=self.port, log=log)
            self._proxy.start()
        self._start_server()

    def _start_server(self) -> None:
        if self._proc is not None:
            return
        out: Any = subprocess.DEVNULL
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log, "ab")  # the child process writes to it
        try:
            self._proc = subprocess.Popen(
                self.command(), stdout=out, stderr=subprocess.STDOUT, env=self.env()
            )
        except FileNotFoundError:
            raise UserError(
                f"cannot run {self.executable[0]!r}: install vLLM on this machine (pip install vllm)"
            ) from None
        health = f"http://127.0.0.1:{self.server_port}/health"
        wait_healthy(health, self._proc, self.startup_timeout, self.log)
        if self.adapter is not None:
            _vllm_load(self.server_url, self.served_name, self.adapter)
        self._proxy.route(self.served_name)

    def update(
        self, checkpoint: str, *, adapter: str | None = None, policy_version: int | None = None
    ) -> None:
        """Serve new weights: the LoRA ``adapter`` at run time, or else restart on ``checkpoint``.

        Published as version N (``policy_version``, default the current + 1) under ``f"{name}@v{N}"``.
        The adapter is loaded only when it was trained on the served base model, beside the previous one;
        the proxy then sends ``model_name`` to it and the previous adapter is unloaded. ``model_name``
        never changes.

        Example:
            >>> policy.update("runs/round-1/merged", adapter="runs/round-1/final")  # doctest: +SKIP
        """
        version = _next_version(self.name, self.policy_version, policy_version)
        name = f"{self.name}@v{version}"
        if self.lora and adapter is not None and _trained_on(adapter, self.base_model):
            previous = self._served if self.adapter is not None else None
            if self._proc is not None:
                _vllm_switch(self.server_url, self._proxy, name, str(adapter), previous)
            self.adapter, self._served, self.policy_version = str(adapter), name, version
            return
        self.model, self.adapter, self._served, self.policy_version = str(checkpoint), None, name, version
        self.lora = False  # the adapters' base is no longer served
        if self._proc is not None:
            self._stop_server()
            self._start_server()

    push_device = None  # the trainer's tensors go as they are (on its GPU): no host copy

    def pushes(self, lora: bool) -> bool:
        """Whether :meth:`push` serves this kind of weights (full weights with ``weight_transfer``)."""
        return self.weight_transfer and not lora

    def push(
        self,
        tensors: Mapping[str, Any],
        *,
        adapter_config: Mapping[str, Any] | None = None,
        adapter: str | None = None,
        policy_version: int | None = None,
    ) -> dict[str, Any]:
        """Push full weights into the running server as ``policy_version`` (default: the current + 1).

        Returns ``{"policy_version", "bytes", "seconds"}``; ``model_name`` stays. Raises ``UserError``
        without ``weight_transfer``, for an adapter, or when the server is gone or refused the weights.

        Example:
            >>> policy.push(model.state_dict(), policy_version=3)  # doctest: +SKIP
            {'policy_version': 3, 'bytes': 988065792, 'seconds': 0.41}
        """
        if not self.pushes(adapter_config is not None):
            raise UserError("VLLMPolicy.push needs weight_transfer=True and full weights (adapters: update)")
        from trainers.serve.vllm_weights import VLLMWeightTransfer

        version = _next_version(self.name, self.policy_version, policy_version)
        url, sender, where = f"http://127.0.0.1:{self.server_port}", self.weight_sender, self.master_address
        self._transfer = self._transfer or VLLMWeightTransfer(url, sender, master_address=where)
        stats = self._transfer.push(tensors, version=version)
        self.policy_version = version
        return stats

    def stop(self) -> None:
        """Terminate the server and the proxy in front of it."""
        self._stop_server()
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None

    def _stop_server(self) -> None:
        if self._transfer is not None:  # a new server opens a new group
            self._transfer.close()
            self._transfer = None
        if self._proc is None:
            return
        terminate(self._proc, 60)
        self._proc = None

    def exit_code(self) -> int | None:
        """The exit status of the vLLM process (or the proxy) once it has exited; ``None`` while both run."""
        if self._proc is not None and self._proc.poll() is not None:
            return self._proc.poll()
        return self._proxy.exit_code() if self._proxy is not None else None


def _trained_on(adapter: str, base: str) -> bool:
    """Whether the LoRA ``adapter`` was trained on ``base`` (one whose config does not say is trusted)."""
    try:
        said = json.loads((Path(adapter) / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError):
        said = None
    if not said or said == base:  # not said: trust the loop, which trained it on the served base
        return True
    return Path(said).exists() and Path(base).exists() and Path(said).resolve() == Path(base).resolve()


class ExternalPolicy:
    """A policy server the user runs; the loop only reloads it.

    Args:
        base_url: ``http://host:port/v1``.
        model_name: Name agents send.
        reload: ``"admin"`` (``sdk.serve``'s ``POST /admin/reload``), ``"vllm-lora"`` (vLLM's LoRA
            endpoints; the server runs with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``)
            or ``"none"`` (nothing is reloaded: the loop then keeps collecting with the old weights).
            With ``vllm-lora``, version N's adapter is loaded as ``f"{model_name}@vN"`` and :meth:`start`
            puts the served-name proxy (:mod:`trainers.serve.alias`) on 127.0.0.1 in front of the server:
            ``base_url`` becomes the proxy's (``server_url`` stays the server's), and agents send
            ``model_name`` for the whole run (before the first update, it goes to the server as it is).
            Agents must then run on this machine.
        admin_token: The admin credential the server was started with (``admin``): this argument, else
            the file ``admin_token_file`` (what a loop config should name: the config is saved in the run
            directory), else ``$TRACERL_ADMIN_TOKEN``.
        admin_token_file: A file holding it.

    Example:
        >>> ExternalPolicy("http://127.0.0.1:8000/v1", "policy", reload="admin").base_url
        'http://127.0.0.1:8000/v1'
    """

    def __init__(
        self,
        base_url: str,
        model_name: str = "policy",
        *,
        reload: str = "admin",
        admin_token: str | None = None,
        admin_token_file: str | None = None,
    ) -> None:
        if reload not in ("admin", "vllm-lora", "none"):
            raise UserError(f"policy reload must be admin, vllm-lora or none, got {reload!r}")
        if admin_token is None and admin_token_file is not None:
            try:
                admin_token = Path(admin_token_file).read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise UserError(f"policy admin_token_file {admin_token_file}: {exc}") from None
        self._admin_token = admin_token or os.environ.get(ENV_ADMIN_TOKEN) or None
        self.base_url, self.model_name, self.reload = base_url.rstrip("/"), model_name, reload
        self.server_url = self.base_url
        self.name = model_name
        self.policy_version = 0
        self._served: str | None = None  # the adapter loaded last (vllm-lora)
        self._proxy: Any = None

    def start(self) -> None:
        """With ``vllm-lora``, start the served-name proxy (``base_url`` moves to it); else nothing."""
        if self.reload != "vllm-lora" or self._proxy is not None:
            return
        from trainers.serve.alias import AliasProxy

        root = self.server_url[: -len("/v1")] if self.server_url.endswith("/v1") else self.server_url
        self._proxy = AliasProxy(root, self.name, self._served or self.name)
        self._proxy.start()
        self.base_url = self._proxy.base_url

    def update(
        self, checkpoint: str, *, adapter: str | None = None, policy_version: int | None = None
    ) -> None:
        """Ask the server to load the new weights (see ``reload``) as ``policy_version``.

        ``admin`` passes the version on; ``vllm-lora`` loads the adapter as ``f"{name}@v{N}"``, the proxy
        sends ``model_name`` to it and the previous one is unloaded, as :class:`VLLMPolicy` does;
        ``none`` only counts the version. ``model_name`` never changes.
        """
        version = _next_version(self.name, self.policy_version, policy_version)
        root = self.server_url[: -len("/v1")] if self.server_url.endswith("/v1") else self.server_url
        if self.reload == "admin":
            body: dict[str, Any] = {"path": str(checkpoint)}
            if policy_version is not None:
                body["policy_version"] = version
            status, text = _post(f"{root}/admin/reload", body, token=self._admin_token)
            if status != 200:
                raise UserError(f"policy reload failed ({status}): {text[:500]}")
        elif self.reload == "vllm-lora":
            if adapter is None:
                raise UserError("reload vllm-lora needs LoRA training (train: {lora: true})")
            name = f"{self.name}@v{version}"
            _vllm_switch(self.server_url, self._proxy, name, str(adapter), self._served)
            self._served = name
        self.policy_version = version

    def stop(self) -> None:
        """Stop the served-name proxy, if one was started (the server is the user's)."""
        if self._proxy is not None:
            self._proxy.stop()
            self._proxy = None
            self.base_url = self.server_url

    def exit_code(self) -> int | None:
        """The served-name proxy's exit status once it has exited; ``None`` otherwise.

        The server itself is not this process's child.
        """
        return self._proxy.exit_code() if self._proxy is not None else None


def make_policy(spec: PolicySpec, checkpoint: str, *, log_dir: str | None = None) -> PolicyServer:
    """Build the policy server a loop config's ``policy:`` section describes (starts nothing).

    Args:
        spec: The section (:class:`trainers.settings.PolicySpec`: each key with its type, default and help).
        checkpoint: The weights it serves first.
        log_dir: The run's directory: the server's log and pid file go there, and it may reload from it.

    Example:
        >>> make_policy(PolicySpec(kind="external", base_url="http://127.0.0.1:8000/v1"), "m").model_name
        'policy'
    """
    kw = spec.kwargs()
    log = str(Path(log_dir) / "policy-server.log") if log_dir else None
    if spec.kind == "local":
        pid_file = str(Path(log_dir) / "policy-server.pid") if log_dir else None
        kw["reload_roots"] = [*spec.reload_roots, *([log_dir] if log_dir else [])]  # the run's checkpoints
        return LocalPolicy(checkpoint, log=log, pid_file=pid_file, **kw)
    if spec.kind == "vllm":
        return VLLMPolicy(checkpoint, log=log, **kw)
    return ExternalPolicy(kw.pop("base_url"), **kw)
