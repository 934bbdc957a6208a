"""A scripted stand-in for ``vllm`` (``fake_vllm.py serve MODEL --port P ...``) for the launcher tests.

Records its command line and environment (``$FAKE_VLLM_LOG``, one JSON line per launch) and every POST it
receives; answers ``/health``, ``/v1/models``, ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
like vLLM does (``200`` with a text body; unloading an unknown adapter is a ``404``), and
``/v1/chat/completions`` for the served base or a loaded adapter (a one-word reply whose ``model`` is the
name requested, as vLLM's is; any other name is a ``404``).
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = os.environ["FAKE_VLLM_LOG"]
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
base_name = argv[argv.index("--served-model-name") + 1] if "--served-model-name" in argv else argv[1]
loaded: set[str] = set()


def log(entry: dict) -> None:
    with open(LOG, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


log({"launch": argv, "runtime_lora": os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING")})


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
        self.reply(200, "{}" if self.path == "/health" else json.dumps({"data": [{"id": n} for n in loaded]}))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log({"path": self.path, "body": body})
        name = body.get("lora_name")
        if self.path == "/v1/chat/completions":
            return self.chat(body.get("model"))
        if self.path == "/v1/load_lora_adapter":
            if name in loaded:
                return self.reply(400, f"The lora adapter '{name}' has already been loaded.")
            loaded.add(name)
            return self.reply(200, f"Success: LoRA adapter '{name}' added successfully.")
        if self.path == "/v1/unload_lora_adapter":
            if name not in loaded:
                return self.reply(404, f"The lora adapter '{name}' cannot be found.")
            loaded.discard(name)
            return self.reply(200, f"Success: LoRA adapter '{name}' removed successfully.")
        if self.path == "/admin/reload":
            return self.reply(200, json.dumps({"ok": True}))
        self.reply(404, "not found")

    def chat(self, model: str) -> None:
        if model != base_name and model not in loaded:
            error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}
            return self.reply(404, json.dumps({"error": error}), "application/json")
        message = {"role": "assistant", "content": "ok"}
        body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
        self.reply(200, json.dumps(body), "application/json")


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
