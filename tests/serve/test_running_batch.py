"""The batch path's running batch (issue 37): rows join a batch that is generating and leave it when done; a
common prompt prefix is run once and kept for the next batch. On the tiny model in fp32, every row's tokens
are what it samples alone and its logprobs equal a direct forward pass, however it joined."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from tests.support.serve import MSGS, make_base, reference_logprobs  # noqa: E402
from trainers.serve.batch import MIN_SHARED, PrefixCache, RunningBatch, generate_batch  # noqa: E402
from trainers.serve.engine import Engine  # noqa: E402
from trainers.serve.scheduler import Batching  # noqa: E402

CPU = torch.device("cpu")
SYSTEM = [(7 * k) % 400 + 5 for k in range(MIN_SHARED + 24)]  # an agent's system prompt, as token ids


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_base(tmp_path_factory.mktemp("running"))


@pytest.fixture(scope="module")
def model(base: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()


def _req(prompt: list[int], seed: int, max_tokens: int = 6) -> SimpleNamespace:
    return SimpleNamespace(
        prompt_ids=prompt, max_tokens=max_tokens, temperature=1.0, top_p=1.0, top_logprobs=0, seed=seed
    )


def _check(base: str, model, req: SimpleNamespace, ids: list[int], lps: list[float]) -> None:
    """``ids`` are what ``req`` samples alone; ``lps`` equal a direct forward pass."""
    alone = generate_batch(model, [req], pad=0, stop_ids=set(), device=CPU)[0]
    assert ids == alone[0] and len(ids) == req.max_tokens
    ref = reference_logprobs(base, None, req.prompt_ids, ids)
    assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-4


def test_rows_sharing_a_prompt_prefix_sample_as_they_would_alone(base: str, model) -> None:
    """A common prefix (an agent's system prompt) runs once for the whole group."""
    tails = [[11], [12, 13, 14, 15, 16], [12, 13, 99], list(range(20, 40))]
    reqs = [_req(SYSTEM + t, s) for s, t in enumerate(tails)]
    together = generate_batch(model, reqs, pad=0, stop_ids=set(), device=CPU)
    for r, (ids, lps, _, _) in zip(reqs, together, strict=True):
        _check(base, model, r, ids, lps)


def test_rows_joining_a_running_batch_sample_as_they_would_alone(base: str, model) -> None:
    first = [_req(SYSTEM + [11, 12], 0, 9), _req(list(range(30, 60)), 1, 4)]
    # Joiners with prompts shorter and longer than the running cache, one sharing the system prompt.
    later = [_req([9, 8, 7], 2, 5), _req(SYSTEM + list(range(100, 160)), 3, 6), _req(SYSTEM + [13], 4, 3)]
    run = RunningBatch(model, pad=0, stop_ids=set(), device=CPU)
    run.add(first)
    out: dict[int, tuple] = {}
    sizes = []
    for step in range(40):
        if step == 2:
            run.add(later[:2])
        if step == 5:
            run.add(later[2:])
        sizes.append(len(run))
        for r, row in run.step():
            out[r.seed] = row
        if not run and step > 5:
            break
    assert (
        sorted(out) == [0, 1, 2, 3, 4] and max(sizes) == 4
    )  # the 4-token row had left before the last joined
    for r in first + later:
        _check(base, model, r, out[r.seed][0], out[r.seed][1])


def test_a_kept_prefix_serves_the_next_batch_of_its_own_weights_only(base: str, model) -> None:
    cache = PrefixCache()
    run = RunningBatch(model, pad=0, stop_ids=set(), device=CPU, prefix=cache, slot="base")
    run.add([_req(SYSTEM + [21, 22], 5), _req(SYSTEM + [23], 6)])
    while run:
        run.step()
    assert cache.slot == "base" and cache.ids == SYSTEM

    def alone(slot: str) -> tuple[SimpleNamespace, tuple]:
        req = _req(SYSTEM + [24, 25, 26], 7)
        run = RunningBatch(model, pad=0, stop_ids=set(), device=CPU, prefix=cache, slot=slot)
        run.add([req])
        rows = []
        while run:
            rows += run.step()
        return req, rows[0][1]

    req, row = alone("base")  # reuses the kept prefix, extends it by the request's own tokens
    _check(base, model, req, row[0], row[1])
    assert cache.ids == SYSTEM + [24, 25]
    cache.layers = [(torch.zeros_like(k), torch.zeros_like(v)) for k, v in cache.layers]  # poison it
    req, row = alone("base")  # the poisoned prefix is used: proof that the call above used the kept one
    assert row[1] != pytest.approx(reference_logprobs(base, None, req.prompt_ids, row[0]), abs=1e-4)
    req, row = alone("adapter")  # other weights: the kept prefix is not used
    _check(base, model, req, row[0], row[1])


def test_a_request_joins_the_batch_that_is_generating_instead_of_waiting_for_it(base: str) -> None:
    eng = Engine(base, batching=Batching(paged=False))
    eng.weights.stop_ids = set()  # every request generates all its tokens
    slow = eng.model.register_forward_hook(lambda *_: time.sleep(0.01))
    long_done = threading.Event()
    try:
        body = {"messages": MSGS, "temperature": 1.0, "seed": 1}
        long = threading.Thread(
            target=lambda: (eng.chat({**body, "max_tokens": 80, "stop": []}), long_done.set())
        )
        long.start()
        time.sleep(0.15)  # the long request is generating (80 forwards of >= 10 ms each)
        short = eng.chat({**body, "max_tokens": 3, "logprobs": True, "return_token_ids": True})
        assert not long_done.is_set(), "the short request waited for the long one's batch"
        long.join(60)
    finally:
        slow.remove()
    ids = short["choices"][0]["token_ids"]
    lps = [e["logprob"] for e in short["choices"][0]["logprobs"]["content"]]
    ref = reference_logprobs(base, None, short["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-4


def test_new_weights_empty_the_kept_prefix(base: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from trainers._tiny import build_tiny_model

    eng = Engine(base, batching=Batching(paged=False))
    body = {"messages": MSGS, "max_tokens": 4, "logprobs": True, "return_token_ids": True, "seed": 3}
    eng.chat(body)
    assert eng.scheduler.prefix.ids  # the prompt's prefix is kept
    other = str(build_tiny_model(tmp_path / "other", seed=1))
    eng.push(AutoModelForCausalLM.from_pretrained(other, dtype=torch.float32).state_dict())
    assert not eng.scheduler.prefix.ids
    resp = eng.chat(body)
    ids = resp["choices"][0]["token_ids"]
    lps = [e["logprob"] for e in resp["choices"][0]["logprobs"]["content"]]
    ref = reference_logprobs(other, None, resp["prompt_token_ids"], ids)
    assert max(abs(a - b) for a, b in zip(ref, lps, strict=True)) < 1e-4


def test_weights_that_cannot_be_served_fail_their_requests_and_the_engine_goes_on(
    base: str, tmp_path
) -> None:
    from tests.support.serve import make_adapter

    adapters = {"a": make_adapter(base, tmp_path / "a", seed=3)}
    eng = Engine(base, model_name="base", adapters=adapters, batching=Batching(paged=False))
    body = {"messages": MSGS, "max_tokens": 3}

    def broken(name: str) -> None:
        raise RuntimeError("adapter weights unavailable")

    eng.model.set_adapter = broken
    with pytest.raises(RuntimeError, match="adapter weights unavailable"):
        eng.chat({**body, "model": "a"})
    assert eng.chat({**body, "model": "base"})["choices"][0]["message"] is not None


def test_host_uniforms_are_the_device_hash_bit_for_bit() -> None:
    """The batch path draws on the host (numpy), the paged path on the device (torch): the same floats."""
    import random

    from trainers.serve.sampling import uniform, uniform_host

    rng = random.Random(0)
    seeds = [rng.randrange(-(2**63), 2**63) for _ in range(2000)] + [0, -1, 2**63 - 1, -(2**63)]
    positions = [rng.randrange(0, 2**40) for _ in range(2000)] + [0, 1, 2**62, 7]
    assert torch.equal(uniform_host(seeds, positions), uniform(torch.tensor(seeds), torch.tensor(positions)))
