"""The resident trainer: N versions make the same updates as one uninterrupted run; resuming is exact.

Tiny model in fp32, fixed seeds, no shuffling, one GRPO group per optimizer step: version ``v`` trains the
groups of tasks ``2v, 2v + 1``, and the uninterrupted run trains the four groups in the same order.
"""

from __future__ import annotations

import pytest

from tests.support.resident import G
from tests.support.resident import max_diff as _max_diff
from tests.support.resident import resident_config as _config
from tests.support.resident import trainer_state as _state
from tests.support.resident import two_versions as _versions
from tests.support.resident import uninterrupted_state as _uninterrupted
from tests.support.synth import make_episodes

pytestmark = pytest.mark.slow


def test_versions_equal_one_uninterrupted_run_and_restarts_do_not(tmp_path, tiny_model_dir, model_tokenizer):
    from trainers.trl import TRLGRPOTrainer
    from trainers.trl.resident import ResidentTrainer

    tok = model_tokenizer
    versions, eps = _versions(tok)
    ref_params, ref_m1, ref_m2 = _uninterrupted(tmp_path, tiny_model_dir, tok, eps)

    resident = ResidentTrainer(_config(tmp_path, tiny_model_dir, "resident"), planned_steps=4, tokenizer=tok)
    results = [resident.train_version(v) for v in versions]
    assert [r.steps for r in results] == [2, 2] and resident.global_step == 4
    assert results[0].build_s > 0 and results[1].build_s == 0  # built once
    params, m1, m2 = _state(resident.trainer)
    assert _max_diff(params, ref_params) < 1e-6
    assert _max_diff(m1, ref_m1) < 1e-7 and _max_diff(m2, ref_m2) < 1e-9
    assert [r["step"] for r in results[1].log_rows if "loss" in r] == [3, 4]

    # The path the loops took before: a new trainer per version from the last checkpoint (Adam restarts).
    model = str(tiny_model_dir)
    for i, v in enumerate(versions):
        cfg = _config(tmp_path, model, f"restart-{i}", max_steps=2)
        built = TRLGRPOTrainer().build_trainer(v, cfg, tokenizer=tok)
        built.trainer.train()
        built.trainer.save_model(str(tmp_path / f"restart-{i}" / "final"))
        model = str(tmp_path / f"restart-{i}" / "final")
    restart_params, _, _ = _state(built.trainer)
    assert _max_diff(restart_params, ref_params) > 1e-4  # the test tells the two paths apart


def test_resume_from_checkpoint_continues_exactly(tmp_path, tiny_model_dir, model_tokenizer):
    from trainers.trl.resident import ResidentTrainer

    tok = model_tokenizer
    versions, _ = _versions(tok)
    a = ResidentTrainer(_config(tmp_path, tiny_model_dir, "a"), planned_steps=4, tokenizer=tok)
    a.train_version(versions[0])
    checkpoint = a.save_checkpoint()
    assert checkpoint.name == "checkpoint-2"
    a.train_version(versions[1])
    want = _state(a.trainer)

    b = ResidentTrainer(
        _config(tmp_path, tiny_model_dir, "a"), planned_steps=4, resume=checkpoint, tokenizer=tok
    )
    assert b.global_step == 2
    result = b.train_version(versions[1])
    assert result.global_step == 4
    # The run's log goes on: steps 1-2 from before the checkpoint, 3-4 after it, each once.
    import json

    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    got = _state(b.trainer)
    for x, y in zip(got, want, strict=True):
        assert _max_diff(x, y) < 1e-7


def test_lora_weights_are_the_adapter_only(tmp_path, tiny_model_dir, model_tokenizer):
    from trainers.trl.resident import ResidentTrainer

    tok = model_tokenizer
    versions, _ = _versions(tok)
    cfg = _config(tmp_path, tiny_model_dir, "lora")
    cfg.lora, cfg.lora_r, cfg.lora_alpha = True, 4, 8
    resident = ResidentTrainer(cfg, planned_steps=4, tokenizer=tok)
    resident.train_version(versions[0])
    tensors, adapter_config = resident.weights()
    assert tensors and all("lora_" in name for name in tensors)
    assert adapter_config["r"] == 4 and adapter_config["peft_type"] == "LORA"
    resident.train_version(versions[1])
    again, _ = resident.weights()
    assert any(float((again[k] - tensors[k]).abs().max()) > 0 for k in tensors)  # it trained on


def test_fewer_groups_than_a_batch_train_as_one_smaller_batch(tmp_path, tiny_model_dir, model_tokenizer):
    from trainers.trl.resident import ResidentTrainer

    tok = model_tokenizer
    versions, _ = _versions(tok)
    cfg = _config(tmp_path, tiny_model_dir, "small", per_device_train_batch_size=2 * G)
    resident = ResidentTrainer(cfg, tokenizer=tok)
    first = resident.train_version(versions[0] + versions[1])  # 4 groups: 2 batches of 2 groups
    assert first.steps == 2
    one_group = [ep for ep in versions[0] if ep["task_id"] == versions[0][0]["task_id"]]
    with pytest.warns(UserWarning, match="learning-rate schedule spans 2 steps"):  # said, not silent
        second = resident.train_version(one_group, passes=2)
    assert second.steps == 2 and second.units == 1
    assert resident.trainer.args.generation_batch_size == G
    third = resident.train_version(versions[1])  # the configured batch again
    assert third.steps == 1 and resident.trainer.args.generation_batch_size == 2 * G


def test_a_version_trains_every_sequence_when_samples_make_two(tmp_path, tiny_model_dir, model_tokenizer):
    """Issue 38 item 8: samples with two threads (two training sequences) are trained whole; the steps of a
    version follow from the sequences, not from the number of samples."""
    import json

    from trainers.trl.resident import ResidentTrainer

    tok = model_tokenizer
    eps = []
    for ep in make_episodes(2, G, tokenizer=tok):  # each sample: thread 0 and a second, independent thread
        eps.append(ep)
        eps.append({**ep, "episode_id": ep["episode_id"] + "-t1", "thread": 1})
    cfg = _config(tmp_path, tiny_model_dir, "two-threads")
    resident = ResidentTrainer(cfg, planned_steps=8, tokenizer=tok)
    done = resident.train_version(eps, passes=1)
    assert done.units == 4 and done.steps == 4  # 2 groups x 2 sequences per sample, one unit per step
    log = [
        json.loads(x) for x in (tmp_path / "two-threads" / "trained_episodes.jsonl").read_text().splitlines()
    ]
    trained = {e for row in log for share in row["shares"] for e in share}
    assert trained == {ep["episode_id"] for ep in eps}
