"""The policy server's engine: one causal LM (and any LoRA adapters on it) sampling chat completions.

Split from :mod:`trainers.serve.app` (the HTTP side) to keep both readable. The engine batches concurrent
requests, routes each by its requested ``model`` to the base weights or one LoRA adapter (peft
multi-adapter: one forward batch per adapter), and gives every set of weights a ``policy_version``
that each generation reports, so a trainer knows which weights produced which tokens.

Example:
    >>> from trainers.serve.engine import Engine  # doctest: +SKIP
    >>> eng = Engine("path/to/base", model_name="base", adapters={"router": "runs/router"})  # doctest: +SKIP
    >>> eng.chat({"model": "router", "messages": [{"role": "user", "content": "hi"}]})  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import json
import queue
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from sdk.messages import render_ids, template_messages
from sdk.openai_wire import assistant_message, chat_choice, chat_completion, usage

__all__ = ["Engine", "Generation", "ModelNotFound", "parse_tool_calls", "render_prompt_ids"]

_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_VERSION_SUFFIX = re.compile(r"@v\d+$")


class ModelNotFound(LookupError):
    """The requested ``model`` is neither the base model's name nor a loaded adapter's (HTTP 404).

    Example:
        >>> str(ModelNotFound("the model 'x' does not exist"))
        "the model 'x' does not exist"
    """


# ----------------------------------------------------------------------------------------------------
# Templating: the message rules live in sdk.messages, shared with the trainer so that ids match
# ----------------------------------------------------------------------------------------------------


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    **template_kwargs: Any,
) -> list[int]:
    """Token ids of OpenAI ``messages`` rendered with the tokenizer's chat template (the server's prompt).

    Messages go through ``sdk.messages.template_messages`` and ``render_ids``, the same steps the trainer
    takes on the exported episode, so the ids returned as ``prompt_token_ids`` are the ids it re-renders.

    Example:
        >>> ids = render_prompt_ids(tok, [{"role": "user", "content": "hi"}])  # doctest: +SKIP
    """
    return render_ids(
        tokenizer,
        template_messages(messages),
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        **template_kwargs,
    )


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    r"""Split model output into (content, OpenAI tool_calls) using ``<tool_call>{json}</tool_call>``.

    A block whose JSON does not parse, or lacks ``name``, is left in the content (no call).

    Example:
        >>> out = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
        >>> out[1][0]["function"]
        {'name': 'add', 'arguments': '{"a": 1}'}
    """
    calls: list[dict[str, Any]] = []
    for match in _TOOL_CALL_RE.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
            }
        )
    if not calls:
        return (text if text else None), []
    content = text[: text.find("<tool_call>")].strip()
    return (content or None), calls


# ----------------------------------------------------------------------------------------------------
# Engine: model + sampling
# ----------------------------------------------------------------------------------------------------


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int
    seed: int | None
    slot: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    result: Generation | None = None
    error: BaseException | None = None


@dataclass
class Generation:
    """One sampled completion, with the version of the weights that produced it."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "stop"
    policy_version: int = 0


@dataclass
class _Slot:
    """One servable set of weights: the base model (``adapter`` None) or one LoRA adapter on it."""

    name: str
    adapter: str | None
    path: str | None
    version: int = 0


class Engine:
    """Holds a causal LM + tokenizer (and optional LoRA adapters on it) and samples chat completions.

    Concurrent requests are batched dynamically (up to ``max_batch`` rows per forward), which is what
    makes collecting many agent episodes in parallel cheap on CPU. A request's ``model`` picks the
    weights: the base model's name, or an adapter's (one forward batch per adapter; a ``@v<N>`` suffix
    is ignored). Without adapters every request is served by the base weights, whatever it names.

    Each set of weights has a ``policy_version`` (0 as loaded, then what each reload says, else + 1). A
    reload swaps weights between generation batches: requests already generating finish on the old
    weights and report the old version.

    Args:
        model: a path (``from_pretrained``) or a loaded ``PreTrainedModel``.
        tokenizer: a tokenizer; loaded from ``model`` when it is a path and this is None.
        model_name: name of the base weights in responses and ``/v1/models``.
        device: torch device.
        max_batch: most rows per forward.
        batch_wait_s: how long the batcher waits for more requests.
        adapters: LoRA adapters to serve on the base, ``{name: adapter directory}``.
        policy_version: version of the base weights as loaded (a restarted server goes on counting).

    Example:
        >>> eng = Engine("path/to/model")  # doctest: +SKIP
        >>> eng.chat({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        model_name: str | None = None,
        device: str = "cpu",
        max_batch: int = 64,
        batch_wait_s: float = 0.002,
        adapters: Mapping[str, str | Path] | None = None,
        policy_version: int = 0,
    ) -> None:
        self.device = torch.device(device)
        self.lock = threading.Lock()
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._adapter_ids = itertools.count()
        self.model_path: str | None = None
        self.model: Any
        self.tokenizer: PreTrainedTokenizerBase
        self._load(model, tokenizer)
        self.model_name = model_name or (Path(self.model_path).name if self.model_path else "local-model")
        base = _Slot(self.model_name, None, self.model_path, int(policy_version))
        self.slots: dict[str, _Slot] = {self.model_name: base}
        for name, path in (adapters or {}).items():
            self.reload_adapter(name, path, policy_version=0)
        threading.Thread(target=self._worker, name="tracerl-engine", daemon=True).start()

    @property
    def policy_version(self) -> int:
        """Version of the base weights (0 as started; each adapter has its own, see ``versions``)."""
        return self.slots[self.model_name].version

    @property
    def version(self) -> int:
        """Same as ``policy_version`` (the name ``/health`` has always used)."""
        return self.policy_version

    @property
    def model_names(self) -> list[str]:
        """Names a request may send: the base model's, then each adapter's."""
        return list(self.slots)

    def versions(self) -> dict[str, int]:
        """``{served name: policy version}``.

        Example:
            >>> engine.versions()  # doctest: +SKIP
            {'base': 0, 'router': 3}
        """
        return {n: s.version for n, s in self.slots.items()}

    def _load(self, model: str | Path | PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> None:
        if isinstance(model, (str, Path)):
            self.model_path = str(model)
            tok = tokenizer or AutoTokenizer.from_pretrained(str(model))
            mdl = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
        else:
            if tokenizer is None:
                raise ValueError("tokenizer is required when model is an object")
            tok, mdl = tokenizer, model
        mdl.to(self.device).eval()
        self.model, self.tokenizer = mdl, tok
        stop = {tok.eos_token_id, tok.pad_token_id}
        gen_eos = getattr(getattr(mdl, "generation_config", None), "eos_token_id", None)
        stop.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        self.stop_ids = {i for i in stop if i is not None}
        self._last_logits_only = True  # until a model's forward refuses ``logits_to_keep``

    def reload(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        policy_version: int | None = None,
    ) -> int:
        """Swap in new base weights (a checkpoint path or a model object); returns their version.

        ``policy_version`` is the version to report from now on (default: the current one + 1). Requests
        in flight finish on the old weights; later ones use the new ones. Adapters are loaded again on
        the new base and keep their versions.

        Example:
            >>> engine.reload("out/round-1/checkpoint")  # doctest: +SKIP
            1
        """
        with self.lock:
            if isinstance(model, (str, Path)) and tokenizer is None:
                tokenizer = self.tokenizer if _same_tokenizer(self.tokenizer, str(model)) else None
            self._load(model, tokenizer)
            base = self.slots[self.model_name]
            base.path = self.model_path
            for slot in self.slots.values():
                if slot.adapter is not None:
                    slot.adapter = self._attach(str(slot.path))
            base.version = base.version + 1 if policy_version is None else int(policy_version)
            return base.version

    def reload_adapter(self, name: str, checkpoint: str | Path, *, policy_version: int | None = None) -> int:
        """Load (or replace) the LoRA adapter served as ``name``; the other weights keep serving.

        The new adapter is loaded beside the old one and swapped in between generation batches, so
        requests already generating with ``name`` finish on the old adapter and its version.

        Example:
            >>> engine.reload_adapter("router", "runs/router/step-20", policy_version=2)  # doctest: +SKIP
            2
        """
        if _VERSION_SUFFIX.search(name):
            raise ValueError(f"adapter name {name!r} must not end in @v<N> (that suffix names a version)")
        if not (Path(checkpoint) / "adapter_config.json").exists():
            raise ValueError(f"{str(checkpoint)!r} is not a LoRA adapter directory (no adapter_config.json)")
        with self.lock:
            old = self.slots.get(name)
            if old is not None and old.adapter is None:
                raise ValueError(f"{name!r} names the base weights, not an adapter")
            new_id = self._attach(str(checkpoint))
            if old is None:
                version = 0 if policy_version is None else int(policy_version)
                self.slots[name] = _Slot(name, new_id, str(checkpoint), version)
                return version
            self.model.set_adapter(new_id)  # never delete the active adapter (peft warns, then picks one)
            self.model.delete_adapter(old.adapter)
            old.adapter, old.path = new_id, str(checkpoint)
            old.version = old.version + 1 if policy_version is None else int(policy_version)
            return old.version

    def push(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        adapter: str | None = None,
        adapter_config: Mapping[str, Any] | None = None,
        policy_version: int | None = None,
    ) -> int:
        """Swap in weights sent as tensors (no checkpoint on disk); returns their version.

        Without ``adapter``: the base model's whole state (tied tensors once), copied into its parameters.
        With ``adapter``: that LoRA adapter's tensors (peft's names); ``adapter_config`` (the peft config's
        ``to_dict()``) is needed when the adapter is new. Everything is checked before anything is copied, so
        a push that does not fit (``ValueError``) leaves the served weights as they were. The swap happens
        between generation batches: requests already generating finish on the old weights and version.

        Example:
            >>> engine.push(trainer_state, policy_version=3)  # doctest: +SKIP
            3
        """
        from trainers.serve import weights

        if adapter is not None and _VERSION_SUFFIX.search(adapter):
            raise ValueError(f"adapter name {adapter!r} must not end in @v<N> (that suffix names a version)")
        with self.lock:
            if adapter is None:
                base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
                weights.copy_full_weights(base, {k: v.to(self.device) for k, v in tensors.items()})
                slot = self.slots[self.model_name]
            else:
                slot = self.slots.get(adapter)
                if slot is not None and slot.adapter is None:
                    raise ValueError(f"{adapter!r} names the base weights, not an adapter")
                if slot is None:
                    if adapter_config is None:
                        raise ValueError(
                            f"adapter {adapter!r} is new: its first push needs its adapter_config"
                        )
                    slot = _Slot(
                        adapter, self._add_adapter(weights.new_adapter_config(adapter_config)), None, -1
                    )
                    try:
                        weights.copy_adapter_weights(self.model, slot.adapter, tensors)
                    except ValueError:
                        self.model.delete_adapter(slot.adapter)
                        raise
                    self.slots[adapter] = slot
                else:
                    weights.copy_adapter_weights(self.model, str(slot.adapter), tensors)
            slot.path = None  # served from memory: no checkpoint on disk holds these weights
            slot.version = slot.version + 1 if policy_version is None else int(policy_version)
            return slot.version

    def _add_adapter(self, config: Any) -> str:
        """A new, empty adapter slot from a peft config (call with the lock held)."""
        from peft import PeftModel, get_peft_model

        adapter_id = f"slot{next(self._adapter_ids)}"
        if isinstance(self.model, PeftModel):
            self.model.add_adapter(adapter_id, config)
        else:
            self.model = get_peft_model(self.model, config, adapter_name=adapter_id)
        self.model.to(self.device).eval()
        return adapter_id

    def _attach(self, path: str) -> str:
        """Load the adapter at ``path`` under a fresh internal name (call with the lock held)."""
        from peft import PeftModel

        adapter_id = f"slot{next(self._adapter_ids)}"
        if isinstance(self.model, PeftModel):
            self.model.load_adapter(path, adapter_name=adapter_id)
        else:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=adapter_id)
        self.model.to(self.device).eval()
        return adapter_id

    def slot_for(self, model: str | None) -> str:
        """The served name a request's ``model`` routes to (raises ``ModelNotFound``).

        Example:
            >>> engine.slot_for("router@v3")  # doctest: +SKIP
            'router'
        """
        name = _VERSION_SUFFIX.sub("", model or "")
        if name in self.slots:
            return name
        if len(self.slots) == 1:
            return self.model_name
        raise ModelNotFound(f"the model {model!r} does not exist; served: {', '.join(self.slots)}")

    # -- sampling ---------------------------------------------------------------------------------

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int = 256,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_logprobs: int = 0,
        seed: int | None = None,
        model: str | None = None,
    ) -> Generation:
        """Sample one completion (goes through the batching queue, so concurrent callers share forwards).

        Logprobs are of ``softmax(logits / temperature)`` (raw logits when ``temperature == 0``).

        Example:
            >>> g = engine.generate([1, 2, 3], max_tokens=4, temperature=0)  # doctest: +SKIP
        """
        req = _Request(
            list(prompt_ids), int(max_tokens), float(temperature), float(top_p), int(top_logprobs), seed,
            self.slot_for(model),
        )  # fmt: skip
        self._queue.put(req)
        req.done.wait()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _worker(self) -> None:
        while True:
            first = self._queue.get()
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
                except queue.Empty:
                    break
            groups: dict[str, list[_Request]] = {}
            for r in batch:
                groups.setdefault(r.slot, []).append(r)
            for slot, reqs in groups.items():
                try:
                    results = self._generate_with(slot, reqs)
                    for r, g in zip(reqs, results, strict=False):
                        r.result = g
                except Exception as exc:
                    for r in reqs:
                        r.error = exc
                for r in reqs:
                    r.done.set()

    def _generate_with(self, name: str, reqs: list[_Request]) -> list[Generation]:
        """One batch on one slot's weights; the lock keeps a reload from swapping them mid-batch."""
        with self.lock:
            slot = self.slots[name]
            if slot.adapter is not None:
                self.model.set_adapter(slot.adapter)
                results = self._generate_batch(reqs)
            elif len(self.slots) > 1:  # adapters are loaded on the base: serve it bare
                with self.model.disable_adapter():
                    results = self._generate_batch(reqs)
            else:
                results = self._generate_batch(reqs)
            for g in results:
                g.policy_version = slot.version
        return results

    def _prefill(self, **inputs: Any) -> Any:
        """The prompt's forward pass, computing logits at its last position only.

        Full logits are batch x prompt length x vocabulary floats: 64 prompts of 300 tokens with a 49k
        vocabulary are 3.8 GB, of which sampling reads one position.
        """
        if self._last_logits_only:
            try:
                return self.model(**inputs, logits_to_keep=1)
            except TypeError as exc:  # a model whose forward does not take it: full logits from now on
                if "logits_to_keep" not in str(exc):
                    raise
                self._last_logits_only = False
        return self.model(**inputs)

    @torch.inference_mode()
    def _generate_batch(self, reqs: list[_Request]) -> list[Generation]:
        """Left-padded batched sampling with a KV cache; rows stop independently."""
        n = len(reqs)
        width = max(len(r.prompt_ids) for r in reqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids) :] = 1
        gens = []
        for r in reqs:
            g = torch.Generator(device="cpu")
            if r.seed is not None:
                g.manual_seed(int(r.seed))
            else:
                g.seed()
            gens.append(g)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self._prefill(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            use_cache=True,
        )
        past = out.past_key_values
        logits = out.logits[:, -1].float().cpu()
        results = [Generation([], [], [], "length") for _ in reqs]
        active = [True] * n
        last_pos = pos[:, -1]
        for _step in range(max(r.max_tokens for r in reqs)):
            nxt = torch.full((n, 1), pad, dtype=torch.long)
            for i, r in enumerate(reqs):
                if not active[i]:
                    continue
                row = logits[i]
                logp = torch.log_softmax(row / r.temperature if r.temperature > 0 else row, dim=-1)
                if r.temperature <= 0:
                    tok = int(torch.argmax(logp))
                else:
                    probs = logp.exp()
                    if r.top_p < 1.0:
                        sp, si = torch.sort(probs, descending=True)
                        keep = torch.cumsum(sp, 0) - sp < r.top_p
                        probs = torch.zeros_like(probs).scatter(0, si[keep], sp[keep])
                    tok = int(torch.multinomial(probs, 1, generator=gens[i]))
                res = results[i]
                res.token_ids.append(tok)
                res.logprobs.append(float(logp[tok]))
                if r.top_logprobs:
                    v, k = torch.topk(logp, min(r.top_logprobs, logp.numel()))
                    res.top_logprobs.append(
                        [(int(a), float(b)) for a, b in zip(k.tolist(), v.tolist(), strict=False)]
                    )
                if tok in self.stop_ids:
                    res.finish_reason, active[i] = "stop", False
                elif len(res.token_ids) >= r.max_tokens:
                    active[i] = False
                else:
                    nxt[i, 0] = tok
            if not any(active):
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
            last_pos = last_pos + 1
            out = self.model(
                input_ids=nxt.to(self.device),
                attention_mask=mask.to(self.device),
                position_ids=last_pos[:, None].to(self.device),
                past_key_values=past,
                use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1].float().cpu()
        return results

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one ``/v1/chat/completions`` request body (non-streaming) as an OpenAI response dict.

        Extra (non-OpenAI) fields: ``return_token_ids`` (vLLM), ``seed``, ``chat_template_kwargs``.

        Example:
            >>> r = engine.chat({"messages": [{"role": "user", "content": "What is 2 plus 3?"}],
            ...     "tools": TOOLS, "logprobs": True, "return_token_ids": True})  # doctest: +SKIP
            >>> r["choices"][0]["message"]["tool_calls"]  # doctest: +SKIP
        """
        messages = body.get("messages") or []
        if not messages:
            raise ValueError("messages must be a non-empty list")
        slot = self.slot_for(body.get("model"))
        tools = body.get("tools") or None
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        temperature = 1.0 if body.get("temperature") is None else float(body["temperature"])
        top_p = 1.0 if body.get("top_p") is None else float(body["top_p"])
        want_lp = bool(body.get("logprobs"))
        n_top = int(body.get("top_logprobs") or 0) if want_lp else 0
        seed = body.get("seed")
        tok = self.tokenizer
        prompt_ids = render_prompt_ids(tok, messages, tools, True, **(body.get("chat_template_kwargs") or {}))
        reqs = [
            _Request(prompt_ids, int(max_tokens), temperature, top_p, n_top,
                     None if seed is None else int(seed) + i, slot)
            for i in range(int(body.get("n") or 1))
        ]  # fmt: skip
        for r in reqs:
            self._queue.put(r)
        gens = []
        for r in reqs:
            r.done.wait()
            if r.error is not None:
                raise r.error
            assert r.result is not None
            gens.append(r.result)
        # The n choices normally share one batch; should a reload fall between them, say the oldest.
        version = min(g.policy_version for g in gens)
        choices = [
            self._choice(i, g, tools=bool(tools), want_lp=want_lp, body=body) for i, g in enumerate(gens)
        ]
        n_completion = sum(len(g.token_ids) for g in gens)
        resp = chat_completion(
            f"chatcmpl-{uuid.uuid4().hex}",
            int(time.time()),
            slot,
            choices,
            usage=usage(len(prompt_ids), n_completion),
            prompt_token_ids=prompt_ids if body.get("return_token_ids") else None,
            system_fingerprint=f"tracerl-serve-v{version}",
        )
        resp["policy_version"] = version
        return resp

    def _choice(
        self, i: int, g: Generation, *, tools: bool, want_lp: bool, body: dict[str, Any]
    ) -> dict[str, Any]:
        """One generation as an OpenAI choice: text (or tool calls), finish reason, logprobs, token ids."""
        body_ids = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        text = self.tokenizer.decode(body_ids, skip_special_tokens=False)
        content, calls = parse_tool_calls(text) if tools else (text, [])
        return chat_choice(
            i,
            assistant_message(content, calls),
            "tool_calls" if calls and g.finish_reason == "stop" else g.finish_reason,
            logprobs=self._lp_content(g) if want_lp else None,
            token_ids=g.token_ids if body.get("return_token_ids") else None,
        )

    def _lp_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        s = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": s, "logprob": logprob, "bytes": list(s.encode("utf-8"))}

    def _lp_content(self, g: Generation) -> list[dict[str, Any]]:
        content = []
        for k, (t, lp) in enumerate(zip(g.token_ids, g.logprobs, strict=False)):
            entry = self._lp_entry(t, lp)
            entry["top_logprobs"] = (
                [self._lp_entry(i, v) for i, v in g.top_logprobs[k]] if g.top_logprobs else []
            )
            content.append(entry)
        return content


def _same_tokenizer(tok: PreTrainedTokenizerBase, path: str) -> bool:
    """Reuse the loaded tokenizer when the checkpoint has none (trainers often save only weights)."""
    p = Path(path)
    return not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
