"""The ``tinker`` backend: Datum construction verified with tinker's own types and wire encoding, and the
run's lifecycle (steps, saved states, Ctrl-C, re-attach, cancel) against an in-process stand-in for Tinker's
service (fast, and it checks the calls' order; the Datums it receives are tinker's own types). The same CLI
runs against a real Tinker API server, SkyRL tx, in ``test_remote_tinker_skyrl.py``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests.support.synth import make_episodes, write_parquet

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto import tinker_public_pb2 as public_pb  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import _tensor_data_from_proto  # noqa: E402

from sdk.episodes import group_advantages  # noqa: E402
from trainers.data import prepare_data  # noqa: E402
from trainers.errors import AuthError, UserError  # noqa: E402
from trainers.remote.tinker_backend import (  # noqa: E402
    TinkerConfig,
    TinkerTrainer,
    sequence_to_datum,
)


@pytest.fixture(scope="module")
def episodes(tmp_path_factory, tiny_tokenizer):
    from trainers._tiny import build_tiny_tokenizer

    tok_dir = tmp_path_factory.mktemp("tok")
    build_tiny_tokenizer(tok_dir)
    path = write_parquet(
        make_episodes(2, 4, tokenizer=tiny_tokenizer), tmp_path_factory.mktemp("d") / "e.parquet"
    )
    cfg = TinkerConfig(model="Qwen/Qwen3-8B", tokenizer=str(tok_dir), group_size=4, max_length=512)
    return path, cfg


@pytest.fixture(scope="module")
def prepared(episodes):
    path, cfg = episodes
    return prepare_data(path, cfg), cfg


def test_datums_from_faithful_episodes(prepared):
    data, cfg = prepared
    batches = TinkerTrainer().build_datums(data, cfg)
    assert [len(b) for b in batches] == [4, 4]
    for group, datums in zip(data.groups, batches, strict=True):
        adv = {e.episode_id: a for e, a in zip(group.episodes, group_advantages(group.rewards), strict=True)}
        assert math.isclose(sum(adv.values()), 0.0, abs_tol=1e-9)
        for s, d in zip(group.sequences, datums, strict=True):
            assert isinstance(d, types.Datum)
            full = s.prompt_ids + s.completion_ids
            assert d.model_input.to_ints() == full[:-1]
            t = d.loss_fn_inputs
            assert set(t) == {"target_tokens", "logprobs", "advantages"}
            assert isinstance(t["target_tokens"], types.TensorData) and t["target_tokens"].dtype == "int64"
            assert t["target_tokens"].tolist() == full[1:]
            n = len(full) - 1
            mask = ([0] * len(s.prompt_ids) + s.loss_mask)[1:]
            advs, lps = t["advantages"].to_numpy(), t["logprobs"].to_numpy()
            assert advs.shape == lps.shape == (n,) and advs.dtype == lps.dtype == np.float32
            # advantage on model-generated targets only; tool results and template glue get none
            assert np.allclose(advs, np.float32(adv[s.episode_id]) * np.asarray(mask, dtype=np.float32))
            assert 0 < sum(mask) < len(s.completion_ids)  # the tool result really is masked out
            behaviour = ([0.0] * len(s.prompt_ids) + s.logprobs)[1:]
            expect = np.where(np.asarray(mask) > 0, np.asarray(behaviour, dtype=np.float32), 0.0)
            assert np.allclose(lps, expect) and not np.isnan(lps).any()


def test_datums_survive_tinkers_wire_encoding(prepared):
    data, cfg = prepared
    datums = [d for b in TinkerTrainer().build_datums(data, cfg) for d in b]
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=datums, loss_fn="ppo"),
        model_id="model-1",
        seq_id=1,
    )
    wire = forward_backward_request_to_proto(request).SerializeToString()
    decoded = public_pb.ForwardBackwardRequest.FromString(wire)
    assert decoded.loss_fn == "ppo" and len(decoded.data) == len(datums)
    for msg, d in zip(decoded.data, datums, strict=True):
        for key in ("target_tokens", "logprobs", "advantages"):
            back = _tensor_data_from_proto(msg.loss_fn_inputs[key]).to_numpy()
            assert np.array_equal(back, d.loss_fn_inputs[key].to_numpy())


def test_unknown_logprobs_are_nan_until_filled_and_cross_entropy_uses_weights():
    from trainers.data import TrainingSequence

    s = TrainingSequence("t", "e", prompt_ids=[5, 6], completion_ids=[7, 8, 9], loss_mask=[1, 0, 1])
    d = sequence_to_datum(s, -1.0)
    lp = d.loss_fn_inputs["logprobs"].to_numpy()
    assert np.isnan(lp[[1, 3]]).all() and lp[0] == 0.0 and lp[2] == 0.0  # only trained targets need one
    ce = sequence_to_datum(s, 1.0, loss_fn="cross_entropy")
    assert set(ce.loss_fn_inputs) == {"target_tokens", "weights"}
    assert ce.loss_fn_inputs["weights"].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_config_and_key_errors(tmp_path, monkeypatch, prepared):
    with pytest.raises(UserError, match="loss_fn must be one of importance_sampling, ppo"):
        TinkerConfig(model="m", loss_fn="sft")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    _, cfg = prepared
    cfg = TinkerConfig(**{**cfg.__dict__, "output_dir": str(tmp_path)})
    with pytest.raises(AuthError, match=r"set \$TINKER_API_KEY"):
        TinkerTrainer().train("unused.parquet", cfg)


# ------------------------------------------------------------------------------------ the run's lifecycle


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class FakeTinker:
    """Tinker's ServiceClient and TrainingClient as the loop uses them; records the calls it gets."""

    def __init__(self, interrupt_at=None):
        self.calls, self.interrupt_at, self.steps = [], interrupt_at, 0

    def create_lora_training_client(self, base_model, rank, seed):
        self.calls.append(("create", base_model, rank))
        return _Done(self)

    def create_training_client_from_state_with_optimizer(self, path):
        self.calls.append(("restore", path))
        return _Done(self)

    def forward_backward(self, datums, loss_fn):
        self.steps += 1
        if self.steps == self.interrupt_at:
            raise KeyboardInterrupt
        assert all(isinstance(d, types.Datum) for d in datums) and loss_fn == "importance_sampling"
        self.calls.append(("forward_backward", len(datums)))
        return _Done(type("Out", (), {"metrics": {"loss:sum": 0.5}})())

    def optim_step(self, params):
        self.calls.append(("optim_step", params.learning_rate))
        return _Done(None)

    def save_state(self, name):
        self.calls.append(("save_state", name))
        return _Done(type("Saved", (), {"path": f"tinker://run/state/{name}"})())

    def save_weights_for_sampler(self, name):
        self.calls.append(("save_weights_for_sampler", name))
        return _Done(type("Saved", (), {"path": f"tinker://run/sampler/{name}"})())


def _use(monkeypatch, fake):
    import trainers.remote.tinker_backend as backend

    monkeypatch.setenv("TINKER_API_KEY", "tk-test")
    monkeypatch.setattr(backend, "_service_client", lambda cfg: fake)


def _interrupted(tmp_path, monkeypatch, episodes, *, interrupt_at, **settings):
    """Start a run and interrupt it (Ctrl-C) in forward_backward number ``interrupt_at``."""
    path, cfg = episodes
    cfg = TinkerConfig(**{**cfg.__dict__, "output_dir": str(tmp_path / "run"), **settings})
    _use(monkeypatch, FakeTinker(interrupt_at=interrupt_at))
    with pytest.raises(KeyboardInterrupt):
        TinkerTrainer().train(path, cfg)
    return path, cfg, tmp_path / "run"


def test_run_steps_saves_states_and_finishes(tmp_path, monkeypatch, episodes):
    from trainers.remote import RemoteJob

    path, cfg = episodes
    fake = FakeTinker()
    _use(monkeypatch, fake)
    out = tmp_path / "run"
    cfg = TinkerConfig(
        **{**cfg.__dict__, "output_dir": str(out), "steps": 3, "save_every": 2, "groups_per_step": 1}
    )
    result = TinkerTrainer().train(path, cfg)
    assert [c[0] for c in fake.calls].count("forward_backward") == 3
    assert [c[1] for c in fake.calls if c[0] == "save_state"] == ["tracerl-000002", "tracerl-final"]
    assert result.global_step == 3 and result.metrics["sampler_path"] == "tinker://run/sampler/tracerl-final"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["datums"] == 4 for r in rows)
    job = RemoteJob.load(out)
    assert job.status == "succeeded" and job.info["state_path"] == "tinker://run/state/tracerl-final"
    assert json.loads((out / "result.json").read_text())["steps"] == 3


def test_interrupted_run_is_refused_then_continued_then_cancel_is_final(tmp_path, monkeypatch, episodes):
    from trainers.remote import RemoteJob

    path, cfg, out = _interrupted(
        tmp_path, monkeypatch, episodes, interrupt_at=3, steps=3, save_every=2, groups_per_step=1
    )
    job = RemoteJob.load(out)
    assert job.status == "running" and job.info["step"] == 2
    assert job.info["state_path"] == "tinker://run/state/tracerl-000002"
    with pytest.raises(UserError, match="unfinished Tinker run at step 2"):
        TinkerTrainer().train(path, cfg)

    fake = FakeTinker()
    _use(monkeypatch, fake)
    result = TinkerTrainer().attach(out)  # continues from the saved state: one step left
    assert fake.calls[0] == ("restore", "tinker://run/state/tracerl-000002")
    assert [c[0] for c in fake.calls].count("forward_backward") == 1 and result.global_step == 3
    assert TinkerTrainer().attach(out).metrics["status"] == "succeeded"  # final: nothing to do
    assert TinkerTrainer().cancel(out).metrics["status"] == "succeeded"  # a final run stays as it is


def test_cancel_marks_an_unfinished_run_cancelled(tmp_path, monkeypatch, episodes):
    _, _, out = _interrupted(tmp_path, monkeypatch, episodes, interrupt_at=2, steps=2)
    assert TinkerTrainer().cancel(out).metrics["status"] == "cancelled"
    assert TinkerTrainer().attach(out).global_step == 1  # nothing continues a cancelled run


def test_resume_restarts_at_the_saved_states_step(tmp_path, monkeypatch, episodes):
    from trainers.remote import RemoteJob

    _, _, out = _interrupted(
        tmp_path, monkeypatch, episodes, interrupt_at=4, steps=4, save_every=2, groups_per_step=1
    )
    job = RemoteJob.load(out)
    assert job.info["step"] == 3 and job.info["state_step"] == 2  # step 3 is not in the saved state

    fake = FakeTinker()
    _use(monkeypatch, fake)
    assert TinkerTrainer().attach(out).global_step == 4
    assert fake.calls[0] == ("restore", "tinker://run/state/tracerl-000002")
    assert [c[0] for c in fake.calls].count("forward_backward") == 2  # steps 3 and 4


class LoadIntoNewModelOnly(FakeTinker):
    """A server without create-from-checkpoint (as SkyRL tx 0.4.0): HTTP 422, then load_state works."""

    def create_training_client_from_state_with_optimizer(self, path):
        import httpx

        response = httpx.Response(422, request=httpx.Request("POST", "http://127.0.0.1/api/v1/load_weights"))
        raise tinker.UnprocessableEntityError("model_id: Field required", response=response, body=None)

    def load_state_with_optimizer(self, path):
        self.calls.append(("load_state", path))
        return _Done(None)


def test_resume_loads_the_state_into_a_new_client_where_the_server_cannot_create_from_it(
    tmp_path, monkeypatch, episodes
):
    _, cfg, out = _interrupted(tmp_path, monkeypatch, episodes, interrupt_at=3, steps=3, save_every=2)
    fake = LoadIntoNewModelOnly()
    _use(monkeypatch, fake)
    assert TinkerTrainer().attach(out).global_step == 3
    assert fake.calls[:2] == [
        ("create", cfg.model, cfg.lora_rank),
        ("load_state", "tinker://run/state/tracerl-000002"),
    ]
