"""The asynchronous loop's recovery checkpoints: only the loop writes them, and the one ``state.json`` names
is never deleted before the next one is committed (kill -9 at any moment leaves a checkpoint to resume)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.loop import async_config
from trainers.loop import run_loop

pytest.importorskip("trl")


@pytest.mark.slow
def test_the_committed_checkpoint_outlives_the_next_one_until_that_is_committed(
    tmp_path, tiny_model_dir, monkeypatch
):
    from trainers.loop import driver

    # One optimizer step per version, a checkpoint every 2 versions (at steps 2 and 4).
    cfg = async_config(tmp_path, str(tiny_model_dir), max_versions=4, checkpoint_every=2, eval_tasks=None)
    out = Path(cfg["out"])
    resumable: list[bool] = []
    commit = driver._Run.commit

    def checked_commit(self, *args, **kw):
        # Until this commit replaces state.json, a kill -9 resumes from the checkpoint it names.
        state = json.loads((out / "state.json").read_text()) if (out / "state.json").exists() else {}
        if state.get("resident_checkpoint"):
            resumable.append((Path(state["resident_checkpoint"]) / "trainer_state.json").is_file())
        return commit(self, *args, **kw)

    monkeypatch.setattr(driver._Run, "commit", checked_commit)
    assert run_loop(cfg, quiet=True)["version"] == 4
    assert resumable == [True]  # at version 4's commit, version 2's checkpoint was still whole
    # transformers' end-of-train() save is off: no checkpoint of a version the loop did not checkpoint.
    assert sorted(p.name for p in (out / "train").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
