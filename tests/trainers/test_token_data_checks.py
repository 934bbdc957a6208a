"""Stored token data the trainer must not trust (issue 24, items 17 and 24): a negative id, a logprob list of
another length than its ids. Rejected or re-rendered, counted under their own names, never trained as is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sdk.episodes import export
from tests.support.segments import good_store
from tests.support.segments import negative_token_id as _negative_token_id
from tests.support.synth import make_episodes
from trainers.base import TrainerConfig
from trainers.data import convert_episode, prepare_data
from trainers.trl._units import _write_episode_paths


def test_export_rejects_a_negative_token_id(tmp_path: Path) -> None:
    store = good_store(tmp_path / "store")
    _negative_token_id(store)
    summary = export(store, tmp_path / "e.parquet")
    assert summary.written == 4 and summary.rejected == {"invalid_token_ids": 1}
    reject = json.loads((tmp_path / "e.rejects.jsonl").read_text().splitlines()[0])
    assert "invalid_token_ids" in json.dumps(reject)


def test_a_negative_id_never_reaches_the_trainer(tiny_tokenizer: Any) -> None:
    # convert_episode alone (validation bypassed): the stored ids are not used, the thread is re-rendered.
    ep = make_episodes(1, 1, tokenizer=tiny_tokenizer)[0]
    ep["turns"][0]["token_ids"] = [-1, *ep["turns"][0]["token_ids"]]
    conv = convert_episode(ep, tiny_tokenizer)
    assert conv.path != "exact_ids" and conv.sequences
    assert all(i >= 0 for s in conv.sequences for i in s.prompt_ids + s.completion_ids)


def test_logprobs_length_mismatch_is_its_own_reason(tmp_path: Path, tiny_tokenizer: Any) -> None:
    eps = make_episodes(2, 2, tokenizer=tiny_tokenizer)
    eps[0]["turns"][1]["logprobs"] = eps[0]["turns"][1]["logprobs"] + [-0.5]
    # The same on the re-render path (no prompt ids: the thread is rendered with the template).
    for t in eps[1]["turns"]:
        t["prompt_token_ids"] = None
    eps[1]["turns"][0]["logprobs"] = eps[1]["turns"][0]["logprobs"][:-1]
    prepared = prepare_data(eps, TrainerConfig(model="tiny"), tokenizer=tiny_tokenizer)
    report = prepared.report
    assert report.unfaithful_logprobs_length_mismatch == 2 and report.unfaithful_no_token_ids == 0
    assert "  of which: logprobs of another length than their ids: 2" in report.lines()
    _write_episode_paths(tmp_path / "paths.jsonl", prepared)
    rows = {r["episode_id"]: r for r in map(json.loads, (tmp_path / "paths.jsonl").read_text().splitlines())}
    assert rows[eps[0]["episode_id"]]["unfaithful_reason"] == "logprobs_length_mismatch"
    assert rows[eps[1]["episode_id"]]["unfaithful_reason"] == "logprobs_length_mismatch"
    assert rows[eps[1]["episode_id"]]["path"] == "rerender_match"  # the ids still match the re-render
    assert rows[eps[2]["episode_id"]]["unfaithful_reason"] is None
