"""The training run's model card is tracerl's (base model, data, rewards, command), not TRL's generic one."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk import cli
from tests.support.synth import make_episodes, write_parquet


def test_train_writes_its_own_model_card(
    tmp_path: Path, tiny_model_dir: Path, tiny_tokenizer, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """One step with a checkpoint saved (TRL writes its card in _save_checkpoint): ours is what is left."""
    pytest.importorskip("trl")
    data = write_parquet(make_episodes(2, 4, tokenizer=tiny_tokenizer), tmp_path / "episodes.parquet")
    out = tmp_path / "run"
    args = ["train", "--data", str(data), "--model", str(tiny_model_dir), "--output", str(out)]
    args += ["--max-steps", "1", "--save-steps", "1", "--group-size", "4", "--no-plots"]
    monkeypatch.setattr("sys.argv", ["/venv/bin/tracerl", *args])  # as the console script runs it
    assert cli.main(args) == 0, capsys.readouterr().err[-3000:]
    assert (out / "checkpoint-1").is_dir()  # the checkpoint where TRL would have written its card
    card = (out / "README.md").read_text()
    assert "huggingface.co/None" not in card and "fine-tuned version of" not in card
    assert f"- base model: `{tiny_model_dir}`" in card
    assert f"- data: `{data}`" in card
    assert "- rewards: the episodes' stored `reward` (mean" in card and "n=8)" in card
    assert f"- command: `tracerl {' '.join(args)}`" in card
    assert "steps: 1" in card and "trained: all weights" in card
    assert not list(out.rglob("README.md"))[1:], list(out.rglob("README.md"))  # no card elsewhere
