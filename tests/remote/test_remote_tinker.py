"""The ``tinker`` backend: Datum construction verified with tinker's own types and wire encoding.

No loopback Tinker server here (see the closing note in the report): the training loop's calls
(``create_lora_training_client``, ``forward_backward``, ``optim_step``, ``save_state``) are not exercised.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _synth import make_episodes, write_parquet

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402
from tinker.proto import tinker_public_pb2 as public_pb  # noqa: E402
from tinker.proto.request_conv import forward_backward_request_to_proto  # noqa: E402
from tinker.proto.response_conv import _tensor_data_from_proto  # noqa: E402

from trainers.base import prepare_data  # noqa: E402
from trainers.errors import AuthError, UserError  # noqa: E402
from trainers.remote.tinker_backend import (  # noqa: E402
    TinkerConfig,
    TinkerTrainer,
    group_advantages,
    sample_to_datum,
)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_tokenizer):
    from trainers._tiny import build_tiny_tokenizer

    tok_dir = tmp_path_factory.mktemp("tok")
    build_tiny_tokenizer(tok_dir)
    path = write_parquet(
        make_episodes(2, 4, tokenizer=tiny_tokenizer), tmp_path_factory.mktemp("d") / "e.parquet"
    )
    cfg = TinkerConfig(model="Qwen/Qwen3-8B", tokenizer=str(tok_dir), num_generations=4, max_length=512)
    return prepare_data(path, cfg), cfg


def test_datums_from_faithful_episodes(prepared):
    data, cfg = prepared
    batches = TinkerTrainer().build_datums(data, cfg)
    assert [len(b) for b in batches] == [4, 4]
    for group, datums in zip(data.groups, batches, strict=True):
        adv = group_advantages(group)
        assert math.isclose(sum(adv.values()), 0.0, abs_tol=1e-9)
        for s, d in zip(group.samples, datums, strict=True):
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
    from trainers._dataset import TrainingSample

    s = TrainingSample("t", "e", prompt_ids=[5, 6], completion_ids=[7, 8, 9], loss_mask=[1, 0, 1])
    d = sample_to_datum(s, -1.0)
    lp = d.loss_fn_inputs["logprobs"].to_numpy()
    assert np.isnan(lp[[1, 3]]).all() and lp[0] == 0.0 and lp[2] == 0.0  # only trained targets need one
    ce = sample_to_datum(s, 1.0, loss_fn="cross_entropy")
    assert set(ce.loss_fn_inputs) == {"target_tokens", "weights"}
    assert ce.loss_fn_inputs["weights"].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_config_and_key_errors(tmp_path, monkeypatch, prepared):
    with pytest.raises(UserError, match="loss_fn must be importance_sampling or ppo"):
        TinkerConfig(model="m", loss_fn="sft")
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    _, cfg = prepared
    cfg = TinkerConfig(**{**cfg.__dict__, "output_dir": str(tmp_path)})
    with pytest.raises(AuthError, match=r"set \$TINKER_API_KEY"):
        TinkerTrainer().train("unused.parquet", cfg)
