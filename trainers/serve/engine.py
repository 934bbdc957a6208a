"""The policy server's engine: one causal LM (and any LoRA adapters on it) sampling chat completions.

Split from :mod:`trainers.serve.app` (the HTTP side) to keep both readable. The engine batches concurrent
requests, routes each by its requested ``model`` to the base weights or one LoRA adapter (peft
multi-adapter: one forward batch per adapter), and gives every set of weights a ``policy_version``
that each generation reports, so a trainer knows which weights produced which tokens.

Two paths (see :class:`Engine`): transformers' continuous batching (:mod:`trainers.serve.paged`) on an
accelerator, and a running batch over a plain KV cache (:mod:`trainers.serve.batch`) on CPU, kept because
it measured faster there for the small models the CPU runs (``tests/bench/engine.py``); it also serves what
the paged path cannot: per-request LoRA adapters and ``top_logprobs``. Both sample on the device with
:mod:`trainers.serve.sampling`.

Example:
    >>> from trainers.serve.engine import Engine  # doctest: +SKIP
    >>> eng = Engine("path/to/base", model_name="base", adapters={"router": "runs/router"})  # doctest: +SKIP
    >>> eng.chat({"model": "router", "messages": [{"role": "user", "content": "hi"}]})  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import queue
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from sdk.openai_wire import chat_completion, usage
from trainers.serve.batch import PrefixCache, RunningBatch
from trainers.serve.params import sampling_params, stop_cut
from trainers.serve.sampling import SEED_BITS, new_seed
from trainers.serve.text import completion_choice, parse_tool_calls, render_prompt_ids
from trainers.serve.versions import StaleVersion, next_version
from trainers.serve.weights import serving_dtype

__all__ = [
    "Engine",
    "EngineBusy",
    "Generation",
    "ModelNotFound",
    "StaleVersion",
    "parse_tool_calls",
    "render_prompt_ids",
]

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


class EngineBusy(RuntimeError):
    """The engine holds its most requests and none finished in time (HTTP 429: back-pressure).

    Example:
        >>> str(EngineBusy("busy"))
        'busy'
    """


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_logprobs: int
    seed: int
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
    text: str | None = None  # set when a stop string cut the completion: its text before the string


@dataclass
class _Slot:
    """One servable set of weights: the base model (``adapter`` None) or one LoRA adapter on it."""

    name: str
    adapter: str | None
    path: str | None
    version: int = 0


@dataclass
class _Base:
    """Loaded base weights, not yet served (a reload builds them aside, then swaps them in)."""

    model: Any
    tokenizer: PreTrainedTokenizerBase
    path: str | None
    stop: set[int]


def _finish(reqs: list[_Request], error: BaseException) -> None:
    """Fail ``reqs`` with ``error`` (their callers raise it)."""
    for r in reqs:
        r.error = error
        r.done.set()


class Engine:
    """Holds a causal LM + tokenizer (and optional LoRA adapters on it) and samples chat completions.

    Two paths serve requests, both sampling on the model's device (:mod:`trainers.serve.sampling`):

    - *paged*: transformers' continuous batching (:mod:`trainers.serve.paged`): requests join and leave the
      running batch at every step, the KV cache is paged. It serves base-weight requests without
      ``top_logprobs`` while no adapter is loaded; the default on an accelerator.
    - *batch* (:mod:`trainers.serve.batch`): a running batch of left-padded rows over one KV cache, one
      set of weights at a time; requests for those weights join it at the next step, rows leave when done,
      and a common prompt prefix is prefilled once. It serves everything else, and every request on CPU,
      where it measured faster for small models (``tests/bench/RESULTS.md``, "Policy engine"). While
      requests for another adapter wait, the batch takes no more rows and drains, then theirs runs.

    A request's ``model`` picks the weights: the base model's name, or an adapter's (a ``@v<N>`` suffix is
    ignored), or an alias (:attr:`aliases`): a stable name a push points at an adapter, so the name agents
    send stays the same for a whole run while the trained adapter changes (an alias of the base's own name
    routes that name to the adapter). Without adapters every request is served by the base weights, whatever
    it names. At most
    ``max_pending`` requests are admitted at once; more wait for a place (back-pressure), and one that waits
    longer than ``admit_timeout_s`` is refused with :class:`EngineBusy`.

    Each set of weights has a ``policy_version`` (0 as loaded, then what each reload says, else + 1). A
    reload or push swaps weights between steps once the requests generating on them are done (new ones
    wait meanwhile), so every response's tokens come from one version, the one it reports.

    Args:
        model: a path (``from_pretrained``) or a loaded ``PreTrainedModel``.
        tokenizer: a tokenizer; loaded from ``model`` when it is a path and this is None.
        model_name: name of the base weights in responses and ``/v1/models``.
        device: torch device.
        max_batch: most rows per forward.
        batch_wait_s: how long an idle batch path waits for more requests before it starts (later ones join
            the running batch).
        adapters: LoRA adapters to serve on the base, ``{name: adapter directory}``.
        policy_version: version of the base weights as loaded (a restarted server goes on counting).
        paged: use the paged path (None: on an accelerator only).
        max_pending: most requests admitted at once (default ``4 * max_batch``).
        admit_timeout_s: how long a request waits for a place before :class:`EngineBusy`.
        dtype: what checkpoints load as: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (their own).

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
        *,
        paged: bool | None = None,
        max_pending: int | None = None,
        admit_timeout_s: float = 600.0,
        dtype: str = "float32",
    ) -> None:
        self.device, self.dtype = torch.device(device), serving_dtype(dtype)
        self.lock = threading.Lock()
        self.max_batch, self.batch_wait_s = max_batch, batch_wait_s
        self.paged = self.device.type != "cpu" if paged is None else bool(paged)
        self._queue: queue.Queue[_Request] = queue.Queue()  # bounded by the admission semaphore below
        self.max_pending, self.admit_timeout_s = max_pending or 4 * max_batch, admit_timeout_s
        self._admit = threading.BoundedSemaphore(self.max_pending)
        self._swap = threading.Condition()  # guards _in_paged and _swapping
        self._in_paged, self._swapping = 0, False
        # Swaps waiting for the batch path's lock: meanwhile the running batch takes no new rows.
        self._waiting_swaps = 0
        # The batch path's last shared prompt prefix, emptied whenever weights change.
        self._prefix = PrefixCache()
        self._pool: Any = None
        self._adapter_ids = itertools.count()
        self.model_path: str | None = None
        self.model: Any
        self.tokenizer: PreTrainedTokenizerBase
        self._install(self._read(model, tokenizer))
        self.model_name = model_name or (Path(self.model_path).name if self.model_path else "local-model")
        base = _Slot(self.model_name, None, self.model_path, int(policy_version))
        self.slots: dict[str, _Slot] = {self.model_name: base}
        # Stable names routed to an adapter's slot (``push(..., alias=NAME)``); looked up before the slots.
        self.aliases: dict[str, str] = {}
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

    def served(self) -> dict[str, str]:
        """``{name a request may send: the slot serving it}``: slots an alias does not shadow, then aliases.

        Example:
            >>> engine.served()  # doctest: +SKIP
            {'policy-lora': 'policy-lora', 'policy': 'policy-lora'}
        """
        names = {n: n for n in self.slots if n not in self.aliases}
        return {**names, **self.aliases}

    def versions(self) -> dict[str, int]:
        """``{served name: policy version}``.

        Example:
            >>> engine.versions()  # doctest: +SKIP
            {'base': 0, 'router': 3}
        """
        return {n: s.version for n, s in self.slots.items()}

    @property
    def context_length(self) -> int:
        """Most prompt + completion tokens a request may hold (the model's ``max_position_embeddings``)."""
        return int(getattr(self.model.config, "max_position_embeddings", None) or 1 << 30)

    def _read(self, model: str | Path | PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> _Base:
        """Load base weights without serving them; a checkpoint that cannot be loaded is a ``ValueError``."""
        from trainers.serve.weights import load_model

        return _Base(*load_model(model, tokenizer, self.device, self.dtype))

    def _install(self, new: _Base) -> None:
        """Serve ``new`` from the next generation step on (call while swapping weights or before serving)."""
        self.model, self.tokenizer, self.model_path = new.model, new.tokenizer, new.path
        self.stop_ids = new.stop
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self.paged:
            from trainers.serve.paged import PagedPool

            max_len = min(self.context_length, 2048)
            self._pool = PagedPool(
                new.model, sorted(self.stop_ids), max_batch=self.max_batch, max_len=max_len
            )

    @contextmanager
    def _swapping_weights(self) -> Iterator[None]:
        """Hold the weights still: the batch path's lock, and the paged path drained (new requests wait)."""
        with self._swap:
            self._waiting_swaps += 1
        try:
            with self.lock:
                with self._swap:
                    self._swapping = True
                    self._swap.wait_for(lambda: self._in_paged == 0)
                try:
                    yield
                finally:
                    self._prefix.clear()
                    with self._swap:
                        self._swapping = False
        finally:
            with self._swap:
                self._waiting_swaps -= 1
                self._swap.notify_all()

    def reload(
        self,
        model: str | Path | PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        policy_version: int | None = None,
    ) -> int:
        """Swap in new base weights (a checkpoint path or a model object); returns their version.

        ``policy_version``: the version from now on (default: the current + 1; lower: :class:`StaleVersion`).
        In-flight requests finish on the old weights. All or nothing: the new base is loaded and every
        adapter attached to it aside (both bases in memory meanwhile) and swapped in only when all of it
        loaded; else a ``ValueError`` and the old weights and versions keep serving. Each adapter's
        version then moves up by one (base + adapter changed; see :mod:`trainers.serve.versions`).

        Example:
            >>> engine.reload("out/round-1/checkpoint")  # doctest: +SKIP
            1
        """
        with self._swapping_weights():
            base = self.slots[self.model_name]
            version = next_version(base.name, base.version, policy_version)
            if isinstance(model, (str, Path)) and tokenizer is None:
                tokenizer = self.tokenizer if _same_tokenizer(self.tokenizer, str(model)) else None
            new = self._read(model, tokenizer)
            ids: dict[str, str] = {}
            for slot in self.slots.values():
                if slot.adapter is None:
                    continue
                try:
                    new.model, ids[slot.name] = self._attach(slot, new.model)
                except ValueError as exc:
                    raise ValueError(
                        f"the new base weights were not swapped in: adapter {slot.name!r} does not load on "
                        f"them ({exc}); still serving the previous weights as version {base.version}"
                    ) from None
            self._install(new)  # everything loaded: only now does anything served change
            base.path, base.version = new.path, version
            for name, adapter_id in ids.items():
                self.slots[name].adapter = adapter_id
                self.slots[name].version += 1
            return version

    def reload_adapter(self, name: str, checkpoint: str | Path, *, policy_version: int | None = None) -> int:
        """Load (or replace) the LoRA adapter served as ``name``; the other weights keep serving.

        The new adapter is loaded beside the old one and swapped in between generation batches, so
        requests already generating with ``name`` finish on the old adapter and its version. An adapter
        that does not load (``ValueError``) or a version lower than the adapter's current one
        (:class:`StaleVersion`) changes nothing.

        Example:
            >>> engine.reload_adapter("router", "runs/router/step-20", policy_version=2)  # doctest: +SKIP
            2
        """
        if _VERSION_SUFFIX.search(name):
            raise ValueError(f"adapter name {name!r} must not end in @v<N> (that suffix names a version)")
        if not (Path(checkpoint) / "adapter_config.json").exists():
            raise ValueError(f"{str(checkpoint)!r} is not a LoRA adapter directory (no adapter_config.json)")
        with self._swapping_weights():
            old = self.slots.get(name)
            if old is not None and old.adapter is None:
                raise ValueError(f"{name!r} names the base weights, not an adapter")
            if old is None:
                version = 0 if policy_version is None else int(policy_version)
            else:
                version = next_version(name, old.version, policy_version)
            self.model, new_id = self._attach(str(checkpoint), self.model)
            if old is None:
                self.slots[name] = _Slot(name, new_id, str(checkpoint), version)
                return version
            self.model.set_adapter(new_id)  # never delete the active adapter (peft warns, then picks one)
            self.model.delete_adapter(old.adapter)
            old.adapter, old.path, old.version = new_id, str(checkpoint), version
            return version

    def push(
        self,
        tensors: Mapping[str, torch.Tensor],
        *,
        adapter: str | None = None,
        adapter_config: Mapping[str, Any] | None = None,
        policy_version: int | None = None,
        alias: str | None = None,
    ) -> int:
        """Swap in weights sent as tensors (no checkpoint on disk); returns their version.

        Without ``adapter``: the base model's whole state (tied tensors once), copied into its parameters.
        With ``adapter``: that LoRA adapter's tensors (peft's names); ``adapter_config`` (the peft config's
        ``to_dict()``) is needed when the adapter is new. Everything is checked before anything is copied, so
        a push that does not fit (``ValueError``) or a version below the current one (:class:`StaleVersion`)
        leaves the served weights as they were. The swap happens between generation steps: requests
        already generating finish on the old weights and version. A base push moves each adapter's version
        up by one (as :meth:`reload` does). ``alias`` (with ``adapter``): from this push on, requests naming
        ``alias`` are served by the adapter (the swap and the new route are one step); it may be the base's
        own name, which then routes to the adapter, so agents keep sending one name while it is trained.

        Example:
            >>> engine.push(trainer_state, policy_version=3)  # doctest: +SKIP
            3
        """
        from trainers.serve import weights

        for name in (adapter, alias):
            if name is not None and _VERSION_SUFFIX.search(name):
                raise ValueError(f"name {name!r} must not end in @v<N> (that suffix names a version)")
        if alias is not None and (adapter is None or alias == adapter):
            raise ValueError("an alias names an adapter pushed under another name")
        with self._swapping_weights():
            named = self.slots.get(alias or "")
            if named is not None and named.adapter is not None:
                raise ValueError(f"the alias {alias!r} names another adapter")
            if adapter is None:
                slot = self.slots[self.model_name]
                version = next_version(slot.name, slot.version, policy_version)
                base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
                weights.copy_full_weights(base, {k: v.to(self.device) for k, v in tensors.items()})
                for other in self.slots.values():  # base + adapter changed: each adapter's version moves
                    other.version += other.adapter is not None
            else:
                slot = self.slots.get(adapter)
                if slot is not None and slot.adapter is None:
                    raise ValueError(f"{adapter!r} names the base weights, not an adapter")
                version = next_version(adapter, -1 if slot is None else slot.version, policy_version)
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
            slot.version = version
            if alias is not None:
                self.aliases[alias] = slot.name
            return version

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

    def _attach(self, source: str | _Slot, model: Any) -> tuple[Any, str]:
        """Put an adapter on ``model`` under a fresh internal name; returns (model, name). Lock held.

        ``source``: an adapter directory, or a served slot (its checkpoint, or its tensors when it was
        pushed from memory). A ``ValueError`` leaves ``model`` as it was.
        """
        from trainers.serve import weights

        adapter_id = f"slot{next(self._adapter_ids)}"
        if isinstance(source, _Slot) and source.path is None:
            model = weights.copy_served_adapter(self.model, str(source.adapter), model, adapter_id)
        else:
            path = source.path if isinstance(source, _Slot) else source
            model = weights.attach_adapter(model, str(path), adapter_id)
        model.to(self.device).eval()
        return model, adapter_id

    def slot_for(self, model: str | None) -> str:
        """The served name a request's ``model`` routes to (raises ``ModelNotFound``).

        Example:
            >>> engine.slot_for("router@v3")  # doctest: +SKIP
            'router'
        """
        name = _VERSION_SUFFIX.sub("", model or "")
        if name in self.aliases:
            return self.aliases[name]
        if name in self.slots:
            return name
        if len(self.slots) == 1:
            return self.model_name
        raise ModelNotFound(f"the model {model!r} does not exist; served: {', '.join(self.served())}")

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
        """Sample one completion (concurrent callers share forwards).

        Logprobs are of ``softmax(logits / temperature)`` (raw logits when ``temperature == 0``).

        Example:
            >>> g = engine.generate([1, 2, 3], max_tokens=4, temperature=0)  # doctest: +SKIP
        """
        req = _Request(
            list(prompt_ids), int(max_tokens), float(temperature), float(top_p), int(top_logprobs),
            new_seed() if seed is None else int(seed) % (1 << SEED_BITS), self.slot_for(model),
        )  # fmt: skip
        return self._run([req])[0]

    def _run(self, reqs: list[_Request]) -> list[Generation]:
        """Admit ``reqs`` (waiting for places), serve them on the paged or the batch path; their results."""
        admitted = 0
        try:
            for _ in reqs:
                if not self._admit.acquire(timeout=self.admit_timeout_s):
                    raise EngineBusy(
                        f"the engine is at its limit of concurrent requests for {self.admit_timeout_s} s"
                    )
                admitted += 1
            gens = self._run_paged(reqs)
            if gens is not None:
                return gens
            for r in reqs:
                self._queue.put(r)
            for r in reqs:
                r.done.wait()
            for r in reqs:
                if r.error is not None:
                    raise r.error
            return [r.result for r in reqs if r.result is not None]
        finally:
            for _ in range(admitted):
                self._admit.release()

    def _run_paged(self, reqs: list[_Request]) -> list[Generation] | None:
        """Serve on the paged path, or None when it cannot (no pool, adapters loaded, top logprobs asked)."""
        with self._swap:
            self._swap.wait_for(lambda: not self._swapping)
            if self._pool is None or len(self.slots) > 1 or any(r.top_logprobs for r in reqs):
                return None
            self._in_paged += len(reqs)
            pool, version = self._pool, self.slots[self.model_name].version
        try:
            tickets = [pool.submit(r.prompt_ids, max_tokens=r.max_tokens, temperature=r.temperature,
                                   top_p=r.top_p, seed=r.seed) for r in reqs]  # fmt: skip
            gens = []
            for t in tickets:
                ids, lps, finish = pool.result(t)
                gens.append(Generation(ids, lps, [], finish, version))
            return gens
        finally:
            with self._swap:
                self._in_paged -= len(reqs)
                self._swap.notify_all()

    def _worker(self) -> None:
        pending: deque[_Request] = deque()
        while True:
            if not pending:
                pending.append(self._queue.get())
            self._gather(pending, self.batch_wait_s)
            with self._swap:  # a waiting swap goes first (the batch it waited for is done)
                self._swap.wait_for(lambda: not self._waiting_swaps)
            name = pending[0].slot
            try:
                self._serve(name, pending)
            except Exception as exc:  # its weights could not be served: its requests fail, the worker goes on
                failed = [r for r in pending if r.slot == name]
                for r in failed:
                    pending.remove(r)
                _finish(failed, exc)

    def _gather(self, pending: deque[_Request], wait_s: float) -> None:
        """Move queued requests to ``pending``; with ``wait_s``, until ``wait_s`` passes without one.

        A burst (many agents at once) thus starts as one batch rather than one request and a crowd waiting.
        """
        deadline = time.monotonic() + wait_s
        while True:
            try:
                pending.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                return
            if wait_s and len(pending) >= self.max_batch:
                return
            deadline = time.monotonic() + wait_s

    def _take(self, name: str, pending: deque[_Request], running: int) -> list[_Request]:
        """The pending requests for ``name`` that join the batch now (up to ``max_batch`` rows in all).

        None while a weight swap waits, nor while another slot's request waits and the batch still runs:
        the batch then drains, so the swap (or the other slot) comes next.
        """
        if self._waiting_swaps or (running and any(r.slot != name for r in pending)):
            return []
        take = [r for r in pending if r.slot == name][: self.max_batch - running]
        for r in take:
            pending.remove(r)
        return take

    @contextmanager
    def _weights_of(self, slot: _Slot) -> Iterator[None]:
        """Serve ``slot``'s weights: its adapter, or the base bare when adapters are loaded. Lock held."""
        if slot.adapter is not None:
            self.model.set_adapter(slot.adapter)
            yield
        elif len(self.slots) > 1:
            with self.model.disable_adapter():
                yield
        else:
            yield

    def _serve(self, name: str, pending: deque[_Request]) -> None:
        """One running batch on ``name``'s weights until it empties; requests for it join at each step.

        The lock keeps a reload or push from swapping the weights under it: every response's tokens come
        from the one version it reports.
        """
        with self.lock:
            slot = self.slots[name]
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
            run = RunningBatch(
                self.model,
                pad=pad,
                stop_ids=self.stop_ids,
                device=self.device,
                prefix=self._prefix,
                slot=name,
            )
            with self._weights_of(slot):
                while True:
                    take = self._take(name, pending, len(run)) if run.joinable or not run else []
                    try:
                        run.add(take)
                    except Exception as exc:  # these requests fail; the running rows go on
                        _finish(take, exc)
                    if not run:
                        return
                    try:
                        done = run.step()
                    except Exception as exc:
                        _finish(run.reqs, exc)
                        return
                    for r, (ids, lps, top, finish) in done:
                        r.result = Generation(ids, lps, top, finish, slot.version)
                        r.done.set()
                    self._gather(pending, 0.0)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one ``/v1/chat/completions`` request body (non-streaming) as an OpenAI response dict.

        Extra (non-OpenAI) fields: ``return_token_ids`` (vLLM), ``chat_template_kwargs``. A bad parameter or
        a prompt longer than the context is a ``ValueError``; ``max_tokens`` is cut to what the context holds.

        Example:
            >>> r = engine.chat({"messages": [{"role": "user", "content": "What is 2 plus 3?"}],
            ...     "tools": TOOLS, "logprobs": True, "return_token_ids": True})  # doctest: +SKIP
            >>> r["choices"][0]["message"]["tool_calls"]  # doctest: +SKIP
        """
        messages = body.get("messages") or []
        if not messages:
            raise ValueError("messages must be a non-empty list")
        slot = self.slot_for(body.get("model"))
        p = sampling_params(body)
        tools = body.get("tools") or None
        prompt_ids = render_prompt_ids(
            self.tokenizer, messages, tools, True, **(body.get("chat_template_kwargs") or {})
        )
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"this model's maximum context length is {self.context_length} tokens; the messages are "
                f"{len(prompt_ids)} tokens"
            )
        seed = new_seed() if p.seed is None else p.seed
        reqs = [
            _Request(prompt_ids, min(p.max_tokens, room), p.temperature, p.top_p, p.top_logprobs,
                     (seed + i) % (1 << SEED_BITS), slot)
            for i in range(p.n)
        ]  # fmt: skip
        gens = self._run(reqs)
        for g in gens if p.stop else []:
            cut = stop_cut(
                lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False), g.token_ids, p.stop
            )
            if cut is not None:
                k, g.text = cut
                del g.token_ids[k:], g.logprobs[k:], g.top_logprobs[k:]
                g.finish_reason = "stop"
        # The n choices normally share one batch; should a reload fall between them, say the oldest.
        version = min(g.policy_version for g in gens)
        choices = [
            completion_choice(
                self.tokenizer, i, g, tools=bool(tools), logprobs=bool(body.get("logprobs")),
                token_ids=bool(body.get("return_token_ids")),
            )
            for i, g in enumerate(gens)
        ]  # fmt: skip
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


def _same_tokenizer(tok: PreTrainedTokenizerBase, path: str) -> bool:
    """Reuse the loaded tokenizer when the checkpoint has none (trainers often save only weights)."""
    p = Path(path)
    return not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json"))
