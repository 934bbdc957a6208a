"""Tiny local policy for the arithmetic agent: tokenizer + Qwen2-style model built offline, SFT warm start.

Nothing is downloaded. The tokenizer is a byte-level BPE trained on rendered task transcripts (digits
are split one per token so that copying numbers generalises to unseen ones) with TRL's shipped Qwen2.5
chat template; the model is a randomly initialised ``Qwen2ForCausalLM``. The warm start imitates
demonstrations (``task.demonstration``), a fraction ``1 - p_good`` of which are flawed, so the policy
succeeds sometimes and RL has something to improve.

Example:
    >>> from examples.arithmetic.policy import build_policy, sft
    >>> tok, model = build_policy(hidden=128, layers=2)               # doctest: +SKIP
    >>> sft(model, tok, steps=300, p_good=0.3)                         # doctest: +SKIP
    >>> save_policy(model, tok, "out/sft")                             # doctest: +SKIP
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from examples.arithmetic.task import TOOLS, Task, demonstration, make_splits
from sdk.messages import render_ids, template_messages

SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]


def _chat_template(compact_tools: bool = True) -> str:
    """TRL's shipped Qwen2.5 template; ``compact_tools`` renders tools as a list of names only.

    The full template spends ~200 tokens on the tool preamble and JSON schemas, 6x the rest of an
    episode: too slow for CPU training and harder for a tiny model. Tool calls, tool responses and
    everything else render exactly as in Qwen2.5 (prefix-preserving).
    """
    import trl

    text = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    if not compact_tools:
        return text
    start = text.index('    {{- "\\n\\n# Tools')
    end = text.index("{%- else %}", text.index("</tools>"))
    compact = (
        '    {{- "\\n# Tools: " }}\n'
        "    {%- for tool in tools %}{{- (tool.function.name if tool.function is defined else tool.name) }}"
        "{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}\n"
        "    {{- '<|im_end|>\\n' }}\n"
    )
    return text[:start] + compact + text[end:]


def build_tokenizer(vocab_size: int = 512, seed: int = 0) -> PreTrainedTokenizerFast:
    """Byte-level BPE (digits split individually) with the Qwen2.5 chat template.

    Example:
        >>> tok = build_tokenizer()
        >>> tok.eos_token, tok.pad_token_id
        ('<|im_end|>', 0)
    """
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # Corpus: rendered transcripts (system prompt, tool schemas, template words) + the alphabet.
    bootstrap = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()))  # only for the template
    bootstrap.chat_template = _chat_template()
    rng = random.Random(seed)
    tasks = make_splits(seed=seed, n_train=0, n_eval=0, n_sft=40)["sft"]
    corpus = [
        bootstrap.apply_chat_template(
            template_messages(demonstration(t, rng, p_good=0.5)), tools=TOOLS, tokenize=False
        )
        for t in tasks
    ]
    corpus += [
        "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,:;!?'\"{}[]()<>/\\-+*=_|#\n"
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus * 5, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[3:],
        padding_side="left",
        truncation_side="left",
    )
    # Whole numbers 0..399 are single tokens (added tokens match longest-first): copying a number is
    # then one attention lookup, which a 2-layer model learns in a few hundred steps; with digit
    # tokens it needs an induction chain and did not learn in 400 steps.
    fast.add_tokens([str(i) for i in range(400)])
    fast.chat_template = _chat_template()
    return fast


def build_policy(
    hidden: int = 128, layers: int = 2, heads: int = 4, seed: int = 0, vocab_size: int = 512
) -> tuple[PreTrainedTokenizerFast, Qwen2ForCausalLM]:
    """Tokenizer + randomly initialised tiny Qwen2 model (tied embeddings, fp32).

    Example:
        >>> tok, model = build_policy(hidden=64, layers=2)
        >>> sum(p.numel() for p in model.parameters()) < 500_000
        True
    """
    tok = build_tokenizer(vocab_size, seed=0)
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return tok, model


def encode_with_mask(
    tok: PreTrainedTokenizerFast, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = TOOLS
) -> tuple[list[int], list[int]]:
    """Ids of the full transcript and a 0/1 mask on assistant tokens (through each ``<|im_end|>``).

    Example:
        >>> ids, mask = encode_with_mask(build_tokenizer(), demonstration(Task("t", "add", 2, 3),
        ...                              random.Random(0)))
        >>> 0 < sum(mask) < len(ids)
        True
    """
    msgs = template_messages(messages)

    def enc(ms: list[dict[str, Any]], gen: bool) -> list[int]:
        return render_ids(tok, ms, tools=tools, add_generation_prompt=gen)  # as the server and trainer do

    ids = enc(msgs, False)
    mask = [0] * len(ids)
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        start, end = len(enc(msgs[:k], True)), len(enc(msgs[: k + 1], False))
        if ids[:start] != enc(msgs[:k], True):
            raise ValueError("chat template is not prefix-preserving")
        for j in range(start, end):
            mask[j] = 1
            if ids[j] == tok.eos_token_id:
                break
    return ids, mask


def sft(
    model: Qwen2ForCausalLM,
    tok: PreTrainedTokenizerFast,
    tasks: list[Task],
    steps: int = 300,
    batch_size: int = 32,
    lr: float = 3e-3,
    p_good: float = 1.0,
    seed: int = 0,
    log_every: int = 50,
    examples: list[tuple[list[int], list[int]]] | None = None,
) -> list[float]:
    """Supervised warm start on demonstrations (plain torch loop; loss on assistant tokens only).

    ``examples`` (``(ids, mask)`` pairs from :func:`encode_with_mask`) replace the arithmetic
    demonstrations of ``tasks`` (another workflow's transcripts). Returns the per-step losses.

    Example:
        >>> tok, model = build_policy(hidden=64)                               # doctest: +SKIP
        >>> losses = sft(model, tok, make_splits(0)["sft"], steps=10)          # doctest: +SKIP
    """
    rng = random.Random(seed)
    data = examples or [encode_with_mask(tok, demonstration(t, rng, p_good)) for t in tasks]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    model.train()
    losses: list[float] = []
    t0 = time.time()
    for step in range(steps):
        batch = rng.sample(data, min(batch_size, len(data)))
        width = max(len(i) for i, _ in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        att = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (i, m) in enumerate(batch):  # right padding
            ids[r, : len(i)] = torch.tensor(i)
            att[r, : len(i)] = 1
            labels[r, : len(i)] = torch.tensor([t if mk else -100 for t, mk in zip(i, m, strict=False)])
        loss = model(input_ids=ids, attention_mask=att, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"  sft step {step + 1}/{steps} loss {loss:.4f} ({time.time() - t0:.1f}s)", flush=True)
    model.eval()
    return losses


def save_policy(model: Qwen2ForCausalLM, tok: PreTrainedTokenizerFast, path: str | Path) -> str:
    """Save model + tokenizer to ``path`` and set ``config._name_or_path`` (TRL rebuilds refs from it)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    model.config._name_or_path = str(path)
    return str(path)
