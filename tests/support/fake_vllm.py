"""A scripted stand-in for ``vllm`` (``fake_vllm.py serve MODEL --port P ...``) for the launcher tests.

Its own process, because what is under test is the launcher: ``VLLMPolicy`` runs the ``vllm`` command
line itself (``executable=VLLM``) with its environment, waits for ``/health``, and stops or restarts the
process; an in-process server would skip all of that. Inside, it is ``sdk.testing``'s scripted server with
vLLM's routes added (``ScriptedOpenAIServer(routes=...)``).

Not vLLM (which needs a GPU and is not installed here): it models only what tracerl relies on, as vLLM's
OpenAI server does it (``vllm/entrypoints/openai/models/serving.py``). Records its command line and
environment (``$FAKE_VLLM_LOG``, one JSON line per launch) and every POST it receives; answers ``/health``,
``/v1/models`` (the served base, then the loaded adapters), ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` like vLLM does (``200`` with a text body; loading a name already loaded is a
``400`` (vLLM's ``load_inplace`` is not modelled); unloading an unknown adapter is a ``404``), and
``/v1/chat/completions`` for the served base or a loaded adapter: a reply whose ``model`` is the name
requested, as vLLM's is (the adapter's ``lora_name``), and whose content is ``adapter <lora_path>`` for an
adapter (which weights answered) or one word for the base; any other name is a ``404``. With ``"stream":
true`` the reply is server-sent ``chat.completion.chunk`` events and ``data: [DONE]``.

Started with ``VLLM_SERVER_DEV_MODE=1`` and ``--weight-transfer-config``, it also answers vLLM 0.33's
weight-transfer routes (``/get_world_size``, ``/init_weight_transfer_engine``, ``/pause``,
``/start_weight_update``, ``/update_weights``, ``/finish_weight_update``, ``/resume``, ``/weight_info``) with
vLLM's order checks. Its data plane stands in for NCCL: the worker connects to the trainer's
``master_address:master_port`` over TCP and reads each tensor's bytes in the order of ``names``; the
SHA-256 of each is logged. ``$FAKE_VLLM_PARAMS`` (JSON ``{name: [dtype, shape]}``) is its model: other names
or shapes are refused (``400``, the data socket closed). While paused, chat requests wait; a reply's
content is ``v<weight_version>``. ``$FAKE_VLLM_UPDATE_DELAY`` seconds are slept in ``/update_weights``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sdk.testing import RecordedRequest, Route, ScriptedOpenAIServer, ScriptedResponse

__all__ = ["VLLM"]

VLLM = [sys.executable, str(Path(__file__).resolve())]
"""The stand-in's command line, in the place of ``vllm`` (``VLLMPolicy(executable=VLLM)``)."""

_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8}


def _text(status: int, text: str) -> ScriptedResponse:
    return ScriptedResponse.raw(text.encode(), status=status, content_type="text/plain")


class _FakeVLLM:
    """One served model: its adapters, its weight version and the weight-transfer state."""

    def __init__(self, argv: list[str]) -> None:
        self.log_path = os.environ["FAKE_VLLM_LOG"]
        self.port = int(argv[argv.index("--port") + 1])
        self.base = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[1]
        self.transfer = "--weight-transfer-config" in argv and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
        params = os.environ.get("FAKE_VLLM_PARAMS")
        self.params = json.loads(Path(params).read_text()) if params else None
        self.loaded: dict[str, str] = {}  # lora_name -> lora_path
        self.data: socket.socket | None = None
        self.updating, self.version = False, None
        self.running = threading.Event()
        self.running.set()
        runtime_lora, dev_mode = (
            os.environ.get(k) for k in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_SERVER_DEV_MODE")
        )
        self.log({"launch": argv, "runtime_lora": runtime_lora, "dev_mode": dev_mode})

    def log(self, entry: dict[str, Any]) -> None:
        with open(self.log_path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")

    def routes(self) -> dict[str, Route]:
        posts: dict[str, Route] = {
            "/v1/chat/completions": self.chat,
            "/v1/load_lora_adapter": self.load,
            "/v1/unload_lora_adapter": self.unload,
            "/admin/reload": lambda request: ScriptedResponse.json_body({"ok": True}),
        }
        if self.transfer:
            posts |= {
                "/init_weight_transfer_engine": self.init_engine,
                "/pause": self.pause,
                "/resume": self.resume,
                "/start_weight_update": self.start_update,
                "/update_weights": self.update,
                "/finish_weight_update": self.finish_update,
            }
        routes = {f"POST {path}": self.logged(handler) for path, handler in posts.items()}
        routes["POST *"] = self.logged(lambda request: _text(404, "not found"))
        if self.transfer:
            routes["GET /get_world_size"] = lambda request: ScriptedResponse.json_body({"world_size": 1})
            routes["GET /weight_info"] = lambda request: ScriptedResponse.json_body(
                {"weight_version": self.version}
            )
        routes["GET /health"] = lambda request: ScriptedResponse.json_body({})
        routes["GET *"] = self.models  # /v1/models, and what else a client asks for
        return routes

    def logged(self, handler: Route) -> Route:
        """Every POST is logged as sent (its query string too) before it is answered."""

        def run(request: RecordedRequest) -> ScriptedResponse | None:
            request.json = request.json or {}  # vLLM reads an empty body as {}
            query = "?" + urllib.parse.urlencode(request.query) if request.query else ""
            self.log({"path": request.path + query, "body": request.json})
            return handler(request)

        return run

    def models(self, request: RecordedRequest) -> ScriptedResponse:
        data = [{"id": name, "object": "model"} for name in (self.base, *self.loaded)]
        return ScriptedResponse.json_body({"object": "list", "data": data})

    def load(self, request: RecordedRequest) -> ScriptedResponse:
        name = request.json.get("lora_name")
        if name in self.loaded:
            return _text(400, f"The lora adapter '{name}' has already been loaded.")
        self.loaded[name] = request.json.get("lora_path")
        return _text(200, f"Success: LoRA adapter '{name}' added successfully.")

    def unload(self, request: RecordedRequest) -> ScriptedResponse:
        name = request.json.get("lora_name")
        if name not in self.loaded:
            return _text(404, f"The lora adapter '{name}' cannot be found.")
        del self.loaded[name]
        return _text(200, f"Success: LoRA adapter '{name}' removed successfully.")

    def chat(self, request: RecordedRequest) -> ScriptedResponse:
        self.running.wait()  # paused: the request waits in the queue (mode keep)
        model = request.json.get("model")
        if model != self.base and model not in self.loaded:
            error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}
            return ScriptedResponse.json_body({"error": error}, status=404)
        if model in self.loaded:
            content = f"adapter {self.loaded[model]}"
        else:
            content = "ok" if self.version is None else f"v{self.version}"
        if not request.json.get("stream"):
            message = {"role": "assistant", "content": content}
            return ScriptedResponse.json_body(
                {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
                 "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
            )  # fmt: skip

        def events() -> Iterator[bytes]:
            for i, part in enumerate(content.split(" ")):
                delta = {"role": "assistant", "content": part} if i == 0 else {"content": " " + part}
                chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        # No length: the stream ends when the connection closes.
        return ScriptedResponse.raw(events(), content_type="text/event-stream", framing="close")

    def init_engine(self, request: RecordedRequest) -> ScriptedResponse:
        info = request.json["init_info"]
        if (
            set(info) - {"master_address", "master_port", "rank_offset", "world_size"}
            or info["rank_offset"] != 1
        ):
            return _text(400, f"bad init_info {info}")
        deadline = time.time() + 30
        while True:  # the trainer's end may not listen yet: both sides join concurrently
            try:
                self.data = socket.create_connection(
                    (info["master_address"], info["master_port"]), timeout=30
                )
                break
            except OSError:
                if time.time() > deadline:
                    return _text(500, "rendezvous timed out")
                time.sleep(0.05)
        return ScriptedResponse.json_body({"message": "Weight transfer initialized"})

    def pause(self, request: RecordedRequest) -> ScriptedResponse:
        self.running.clear()
        return ScriptedResponse.json_body({"status": "paused"})

    def resume(self, request: RecordedRequest) -> ScriptedResponse:
        self.running.set()
        return ScriptedResponse.json_body({"status": "resumed"})

    def start_update(self, request: RecordedRequest) -> ScriptedResponse:
        if self.updating:
            return _text(400, "a weight update is already in progress")
        self.updating = True
        return ScriptedResponse.json_body({"message": "Weight update started"})

    def update(self, request: RecordedRequest) -> ScriptedResponse:
        if not self.updating or self.data is None:
            return _text(400, "start_weight_update first")
        info = request.json["update_info"]
        time.sleep(float(os.environ.get("FAKE_VLLM_UPDATE_DELAY", "0")))
        received = {}
        for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"], strict=True):
            if self.params is not None and self.params.get(name) != [dtype, shape]:
                self.data.close()  # the trainer's send fails instead of waiting forever
                self.data = None
                return _text(400, f"no parameter {name} {dtype} {shape} in the served model")
            n = _SIZES[dtype]
            for d in shape:
                n *= d
            data = bytearray()
            while len(data) < n:
                chunk = self.data.recv(n - len(data))
                if not chunk:
                    return _text(500, "the data plane closed")
                data += chunk
            received[name] = hashlib.sha256(data).hexdigest()
        self.log({"received": received})
        return ScriptedResponse.json_body({"message": "Weights updated"})

    def finish_update(self, request: RecordedRequest) -> ScriptedResponse:
        if not self.updating:
            return _text(400, "no weight update in progress")
        self.updating, self.version = False, request.json.get("weight_version")
        return ScriptedResponse.json_body({"message": "Weight update finished"})


if __name__ == "__main__":
    fake = _FakeVLLM(sys.argv[1:])
    server = ScriptedOpenAIServer(port=fake.port, routes=fake.routes()).start()
    threading.Event().wait()
