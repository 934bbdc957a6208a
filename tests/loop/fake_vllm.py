"""A scripted stand-in for ``vllm`` (``fake_vllm.py serve MODEL --port P ...``) for the launcher tests.

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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = os.environ["FAKE_VLLM_LOG"]
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
base_name = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[1]
loaded: dict[str, str] = {}  # lora_name -> lora_path
TRANSFER = "--weight-transfer-config" in argv and os.environ.get("VLLM_SERVER_DEV_MODE") == "1"
PARAMS = (
    json.loads(open(os.environ["FAKE_VLLM_PARAMS"]).read()) if os.environ.get("FAKE_VLLM_PARAMS") else None
)
SIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "int64": 8}
state = {"data": None, "updating": False, "version": None}
running = threading.Event()
running.set()


def log(entry: dict) -> None:
    with open(LOG, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


log(
    {
        "launch": argv,
        "runtime_lora": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
        "dev_mode": os.environ.get("VLLM_SERVER_DEV_MODE"),
    }
)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, text: str, content_type: str = "text/plain") -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if TRANSFER and self.path.startswith("/get_world_size"):
            return self.reply(200, json.dumps({"world_size": 1}))
        if TRANSFER and self.path == "/weight_info":
            return self.reply(200, json.dumps({"weight_version": state["version"]}))
        if self.path == "/health":
            return self.reply(200, "{}")
        models = [{"id": base_name, "object": "model"}, *({"id": n, "object": "model"} for n in loaded)]
        self.reply(200, json.dumps({"object": "list", "data": models}))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        log({"path": self.path, "body": body})
        name = body.get("lora_name")
        if self.path == "/v1/chat/completions":
            running.wait()  # paused: the request waits in the queue (mode keep)
            return self.chat(body.get("model"), bool(body.get("stream")))
        route = urllib.parse.urlparse(self.path).path
        if TRANSFER and route in TRANSFER_ROUTES:
            status, text = TRANSFER_ROUTES[route](self, body)
            return self.reply(status, json.dumps(text) if isinstance(text, dict) else text)
        if self.path == "/v1/load_lora_adapter":
            if name in loaded:
                return self.reply(400, f"The lora adapter '{name}' has already been loaded.")
            loaded[name] = body.get("lora_path")
            return self.reply(200, f"Success: LoRA adapter '{name}' added successfully.")
        if self.path == "/v1/unload_lora_adapter":
            if name not in loaded:
                return self.reply(404, f"The lora adapter '{name}' cannot be found.")
            del loaded[name]
            return self.reply(200, f"Success: LoRA adapter '{name}' removed successfully.")
        if self.path == "/admin/reload":
            return self.reply(200, json.dumps({"ok": True}))
        self.reply(404, "not found")

    def chat(self, model: str, stream: bool = False) -> None:
        if model != base_name and model not in loaded:
            error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}
            return self.reply(404, json.dumps({"error": error}), "application/json")
        if model in loaded:
            content = f"adapter {loaded[model]}"
        else:
            content = "ok" if state["version"] is None else f"v{state['version']}"
        if stream:
            return self.stream(model, content)
        message = {"role": "assistant", "content": content}
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
        self.reply(200, json.dumps(body), "application/json")

    def stream(self, model: str, content: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # no length: the stream ends when the connection closes (HTTP/1.0)
        for i, part in enumerate(content.split(" ")):
            delta = {"role": "assistant", "content": part} if i == 0 else {"content": " " + part}
            chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}  # fmt: skip
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")


def init_engine(handler: Handler, body: dict) -> tuple[int, object]:
    info = body["init_info"]
    if set(info) - {"master_address", "master_port", "rank_offset", "world_size"} or info["rank_offset"] != 1:
        return 400, f"bad init_info {info}"
    deadline = time.time() + 30
    while True:  # the trainer's end may not listen yet: both sides join concurrently
        try:
            state["data"] = socket.create_connection(
                (info["master_address"], info["master_port"]), timeout=30
            )
            break
        except OSError:
            if time.time() > deadline:
                return 500, "rendezvous timed out"
            time.sleep(0.05)
    return 200, {"message": "Weight transfer initialized"}


def pause(handler: Handler, body: dict) -> tuple[int, object]:
    running.clear()
    return 200, {"status": "paused"}


def resume(handler: Handler, body: dict) -> tuple[int, object]:
    running.set()
    return 200, {"status": "resumed"}


def start(handler: Handler, body: dict) -> tuple[int, object]:
    if state["updating"]:
        return 400, "a weight update is already in progress"
    state["updating"] = True
    return 200, {"message": "Weight update started"}


def update(handler: Handler, body: dict) -> tuple[int, object]:
    if not state["updating"] or state["data"] is None:
        return 400, "start_weight_update first"
    info = body["update_info"]
    time.sleep(float(os.environ.get("FAKE_VLLM_UPDATE_DELAY", "0")))
    received = {}
    for name, dtype, shape in zip(info["names"], info["dtype_names"], info["shapes"], strict=True):
        if PARAMS is not None and PARAMS.get(name) != [dtype, shape]:
            state["data"].close()  # the trainer's send fails instead of waiting forever
            state["data"] = None
            return 400, f"no parameter {name} {dtype} {shape} in the served model"
        n = SIZES[dtype]
        for d in shape:
            n *= d
        data = bytearray()
        while len(data) < n:
            chunk = state["data"].recv(n - len(data))
            if not chunk:
                return 500, "the data plane closed"
            data += chunk
        received[name] = hashlib.sha256(data).hexdigest()
    log({"received": received})
    return 200, {"message": "Weights updated"}


def finish(handler: Handler, body: dict) -> tuple[int, object]:
    if not state["updating"]:
        return 400, "no weight update in progress"
    state["updating"], state["version"] = False, body.get("weight_version")
    return 200, {"message": "Weight update finished"}


TRANSFER_ROUTES = {
    "/init_weight_transfer_engine": init_engine,
    "/pause": pause,
    "/resume": resume,
    "/start_weight_update": start,
    "/update_weights": update,
    "/finish_weight_update": finish,
}

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
