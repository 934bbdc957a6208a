"""Tiny local causal LM + tokenizer for tests, examples and benchmarks; nothing is downloaded.

The tokenizer is a byte-level BPE (vocabulary 512) trained in memory on a small corpus, with TRL's shipped
``qwen2_5`` chat template, so TRL recognises it: ``supports_tool_calling`` and
``is_chat_template_prefix_preserving`` hold and ``add_response_schema`` knows it. The GPT-2 split regex keeps
newlines and words apart, so no BPE merge crosses a template boundary. The model is a randomly initialised
``Qwen2ForCausalLM`` (or ``Qwen3ForCausalLM``) built from a config (hidden 64, 2 layers, tied embeddings:
about 107k parameters).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DEFAULT_CORPUS", "build_tiny_model", "build_tiny_tokenizer"]

#: Sentences covering the chat template's words, tool names, JSON punctuation, digits and the alphabet.
DEFAULT_CORPUS: tuple[str, ...] = (
    "system user assistant tool You are a helpful assistant.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tool_response>\n{"temperature": 21, "unit": "celsius"}\n</tool_response>',
    "What is the weather in Paris? It is sunny and 21 degrees.",
    'Use the calculator tool: {"name": "add", "arguments": {"a": 12, "b": 30}} = 42',
    "search lookup answer final result the a an of to in is was and or not yes no ok done",
    "Question: what is 7 times 6? Answer: 42. Question: what is 3 plus 4? Answer: 7.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "The quick brown fox jumps over the lazy dog. Good answer. Bad answer. Correct. Wrong.",
    "# Tools You may call one or more functions to assist with the user query.",
    "function signatures within <tools></tools> XML tags: name arguments args-json-object",
)

_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")


def _qwen25_template() -> str:
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    return path.read_text()


def build_tiny_tokenizer(
    output_dir: str | os.PathLike[str] | None = None,
    *,
    vocab_size: int = 512,
    corpus: Sequence[str] | None = None,
):
    """Train a tiny byte-level BPE tokenizer with TRL's ``qwen2_5`` chat template.

    Pad is ``<|endoftext|>`` (id 0) and EOS is ``<|im_end|>`` (id 2). Deterministic for a given corpus.

    Args:
        output_dir: When given, ``save_pretrained`` there.
        vocab_size: Target BPE vocabulary size (the byte alphabet and special tokens included).
        corpus: Training sentences; defaults to :data:`DEFAULT_CORPUS`.

    Returns:
        A ``transformers.PreTrainedTokenizerFast``.

    Example:
        >>> tok = build_tiny_tokenizer()
        >>> tok.eos_token, tok.pad_token_id
        ('<|im_end|>', 0)
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import trainers as bpe_trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    # The GPT-2 regex keeps "\n" and words apart, so BPE never merges across a chat-template boundary.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = bpe_trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[*_SPECIAL, *_TOOL_TAGS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus if corpus is not None else DEFAULT_CORPUS) * 20, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=list(_TOOL_TAGS),
        padding_side="left",
        truncation_side="left",
    )
    hf.chat_template = _qwen25_template()
    if output_dir is not None:
        hf.save_pretrained(str(output_dir))
    return hf


def build_tiny_model(
    output_dir: str | os.PathLike[str],
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    vocab_size: int = 512,
    corpus: Sequence[str] | None = None,
    seed: int = 0,
    architecture: str = "qwen2",
) -> Path:
    """Build and save a tiny random ``Qwen2ForCausalLM`` plus its tokenizer; nothing is downloaded.

    ``architecture="qwen3"`` builds a ``Qwen3ForCausalLM`` of the same size instead (servers that implement
    only some architectures, such as SkyRL tx, load it); ``"llama"`` a ``LlamaForCausalLM`` (SmolLM2's
    architecture, whose forward takes no per-layer-type mask mapping).

    With the defaults the model has about 107 k parameters and a training step on 8 × ~500 tokens takes about
    0.2 s on 2 CPU cores.

    Args:
        output_dir: Directory to write (created if needed); loadable with ``from_pretrained``.
        hidden_size: Model width (attention heads = 4, KV heads = 2, MLP = 2 × width).
        num_layers: Number of decoder layers.
        vocab_size: Target tokenizer vocabulary size.
        corpus: Tokenizer training sentences; defaults to :data:`DEFAULT_CORPUS`.
        seed: Torch seed for the random initialisation.
        architecture: ``qwen2``, ``qwen3`` or ``llama``.

    Returns:
        ``Path(output_dir)``.

    Example:
        >>> path = build_tiny_model("/tmp/tiny")  # doctest: +SKIP
        >>> from transformers import AutoModelForCausalLM
        >>> AutoModelForCausalLM.from_pretrained(path).num_parameters()  # doctest: +SKIP
        107072
    """
    import torch
    import transformers

    if architecture not in ("qwen2", "qwen3", "llama"):
        raise ValueError(f"architecture must be qwen2, qwen3 or llama, got {architecture!r}")
    name = architecture.capitalize()
    config_class, model_class = (
        getattr(transformers, f"{name}Config"),
        getattr(transformers, f"{name}ForCausalLM"),
    )
    # Qwen3's head_dim defaults to 128 whatever the width: keep it width / heads, as Qwen2 derives it.
    extra = {"head_dim": hidden_size // 4} if architecture == "qwen3" else {}
    from trainers._model_dir import writing_model_dir

    out = Path(output_dir)
    # Written aside and renamed into place with its completion mark, as tracerl's other model directories.
    with writing_model_dir(out, by="tracerl build_tiny_model") as aside:
        tok = build_tiny_tokenizer(aside, vocab_size=vocab_size, corpus=corpus)
        config = config_class(
            vocab_size=len(tok),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            bos_token_id=None,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            **extra,
        )
        # Seed locally and restore, so building a model never perturbs the caller's RNG stream.
        state = torch.random.get_rng_state()
        try:
            torch.manual_seed(seed)
            model = model_class(config)
        finally:
            torch.random.set_rng_state(state)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        # A reference model (beta > 0) is rebuilt from `config._name_or_path`: point it at this directory.
        model.config._name_or_path = str(out)
        model.save_pretrained(str(aside))
    return out
