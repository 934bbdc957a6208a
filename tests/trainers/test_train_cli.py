"""``python -m sdk.train``: end to end on Parquet, dry run, config merging, one-line user errors."""

from __future__ import annotations

import json

import pytest
import yaml

from sdk.train import main
from tests.support.synth import make_episode, make_episodes, write_parquet


def run_cli(capsys, args):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_user_error(capsys, args, *needles):
    rc, _, err = run_cli(capsys, args)
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def parquet(tmp_path, tiny_tokenizer):
    return write_parquet(make_episodes(2, 4, tokenizer=tiny_tokenizer), tmp_path / "episodes.parquet")


@pytest.mark.slow
def test_cli_end_to_end(tmp_path, parquet, tiny_model_dir, capsys):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "backend": "trl",
                "group_size": 4,
                "max_length": 512,
                "grpo": {
                    "learning_rate": "1e-3",
                    "max_steps": 5,
                    "logging_steps": 1,
                    "disable_tqdm": True,
                    "save_steps": 2,
                    "loss_type": "dr_grpo",
                },
            }
        )
    )
    out = tmp_path / "out"
    rc, stdout, err = run_cli(
        capsys,
        [
            "--data",
            parquet,
            "--model",
            tiny_model_dir,
            "--config",
            cfg,
            "--output",
            out,
            "--max-steps",
            2,
            "--grpo",
            "loss_type=grpo",
        ],
    )
    assert rc == 0, err
    assert "tracerl training finished" in stdout and "steps: 2" in stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2]
    for png in ("reward.png", "loss.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    resolved = yaml.safe_load((out / "config.yaml").read_text())
    assert resolved["backend"] == "trl" and resolved["data"] == str(parquet) and resolved["max_length"] == 512
    assert resolved["grpo"]["max_steps"] == 2 and resolved["grpo"]["loss_type"] == "grpo"  # flags beat YAML
    assert resolved["grpo"]["learning_rate"] == 1e-3  # "1e-3" from YAML coerced to a float
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()
    assert (out / "final" / "model.safetensors").is_file() and (
        out / "final" / "tokenizer_config.json"
    ).is_file()
    assert json.loads((out / "data_report.json").read_text())["report"]["groups"] == 2

    # resume from the checkpoint and continue to step 3; the resolved config is reusable with --config
    rc, stdout, err = run_cli(capsys, ["--config", out / "config.yaml", "--resume", "--max-steps", 3])
    assert rc == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3]


def test_dry_run_prints_groups_and_stats(parquet, tokenizer_dir, capsys):
    rc, out, err = run_cli(capsys, ["--data", parquet, "--model", tokenizer_dir, "--dry-run"])
    assert rc == 0, err
    assert "task-0" in out and "task-1" in out and "trained_tokens" in out and "nothing trained" in out
    assert "token-faithful episodes (behaviour logprobs used)" in out


def test_the_old_name_of_group_size_is_refused(parquet, tokenizer_dir, tmp_path, capsys):
    """num_generations was renamed group_size before any release: flag, YAML key and keyword are refused."""
    base = ["--data", parquet, "--model", tokenizer_dir, "--dry-run"]
    assert_user_error(capsys, [*base, "--num-generations", "4"], "unrecognized arguments: --num-generations")
    conf = tmp_path / "old.yaml"
    conf.write_text("num_generations: 4\n")
    assert_user_error(capsys, [*base, "--config", conf], "unknown setting(s)", "num_generations")
    from trainers.trl import TRLGRPOConfig

    with pytest.raises(TypeError, match="num_generations"):
        TRLGRPOConfig(model="./tiny", num_generations=6)  # type: ignore[call-arg]


def test_dry_run_counts_truncation(tmp_path, tokenizer_dir, capsys):
    path = write_parquet(make_episodes(2, 4), tmp_path / "e.parquet")
    rc, out, _ = run_cli(capsys, ["--data", path, "--model", tokenizer_dir, "--dry-run", "--max-length", 70])
    assert rc == 0 and "episodes truncated to max length" in out


def test_error_no_task_with_two_episodes(tmp_path, tokenizer_dir, capsys):
    eps = [
        make_episode(0, 0, good=True),
        make_episode(1, 0, good=False),
        make_episode(2, 0, good=True),
        make_episode(2, 1, good=True, reward=None),
    ]
    eps[-1]["reward"] = None
    path = write_parquet(eps, tmp_path / "e.parquet")
    assert_user_error(
        capsys,
        ["--data", path, "--model", tokenizer_dir, "--dry-run"],
        "at least 2",
        "task-0 (1), task-1 (1), task-2 (1)",
    )


def test_error_tokenizer_without_chat_template(tmp_path, parquet, capsys):
    from trainers._tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "notemplate")
    line = assert_user_error(
        capsys,
        ["--data", parquet, "--model", tmp_path / "notemplate", "--dry-run"],
        "no chat template",
        "tokenizer.chat_template",
        "--chat-template FILE",
    )
    assert "Traceback" not in line
    # ... and --chat-template fixes it
    import trl

    template = f"{trl.__path__[0]}/chat_templates/qwen2_5.jinja"
    rc, _, err = run_cli(
        capsys,
        ["--data", parquet, "--model", tmp_path / "notemplate", "--dry-run", "--chat-template", template],
    )
    assert rc == 0, err


def test_error_missing_model_and_data(tmp_path, parquet, tokenizer_dir, capsys):
    assert_user_error(
        capsys, ["--data", parquet, "--model", tmp_path / "no-such-model"], "model path not found"
    )
    assert_user_error(capsys, ["--data", parquet], "no model given")
    assert_user_error(
        capsys, ["--data", tmp_path / "missing.parquet", "--model", tokenizer_dir], "data path not found"
    )
    assert_user_error(capsys, ["--model", tokenizer_dir], "no data given")


def test_error_all_episodes_too_long(parquet, tokenizer_dir, capsys):
    assert_user_error(
        capsys,
        [
            "--data",
            parquet,
            "--model",
            tokenizer_dir,
            "--dry-run",
            "--max-length",
            60,
            "--truncation",
            "skip",
        ],
        "longer than max_length=60",
        "--truncation truncate",
    )


def test_error_bad_settings(tmp_path, parquet, tokenizer_dir, capsys):
    base = ["--data", parquet, "--model", tokenizer_dir]
    assert_user_error(capsys, [*base, "--bogus-flag"], "unrecognized arguments")
    assert_user_error(capsys, [*base, "--truncation", "chop"], "invalid choice")
    assert_user_error(capsys, [*base, "--group-size", 1, "--dry-run"], "group_size")
    assert_user_error(capsys, [*base, "--backend", "nope"], "unknown backend", "trl")
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_lenght: 3\n")
    assert_user_error(capsys, [*base, "--config", bad], "unknown setting", "max_lenght")
    assert_user_error(capsys, [*base, "--config", tmp_path / "none.yaml"], "config file not found")
    flat = write_parquet([make_episode(0, i, good=True) for i in range(4)], tmp_path / "flat.parquet")
    assert_user_error(
        capsys, ["--data", flat, "--model", tokenizer_dir, "--dry-run"], "equal rewards", "filter_zero_std"
    )


@pytest.mark.slow
def test_error_unknown_grpo_field_and_resume_without_checkpoint(tmp_path, parquet, tiny_model_dir, capsys):
    base = ["--data", parquet, "--model", tiny_model_dir, "--output", tmp_path / "o"]
    assert_user_error(
        capsys, [*base, "--grpo", "learning_rat=1"], "unknown GRPOConfig field", "learning_rate"
    )
    assert_user_error(capsys, [*base, "--resume"], "no checkpoint")
    assert_user_error(capsys, [*base, "--grpo", "output_dir=/x"], "top level")


def test_help_exits_zero(capsys):
    rc, out, _ = run_cli(capsys, ["--help"])
    assert rc == 0 and "--group-size" in out and "--grpo KEY=VALUE" in out and "--max-steps" in out
    assert "--loop CONFIG.yaml" in out and "tracerl train --loop --help" in out


def test_a_mistyped_local_model_fails_at_once(tmp_path, parquet, tiny_model_dir, capsys, monkeypatch):
    """``runs/bse`` next to ``runs/`` is a local path, not a hub id to download (which retried for 53 s)."""
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # what a user has: the check must not need it
    assert_user_error(capsys, ["--data", parquet, "--model", "runs/bse", "--dry-run"], "model path not found")


def test_yaml_values_keep_trl_strings_and_read_exponent_floats(tmp_path) -> None:
    """YAML 1.1 would read ``save_strategy: no`` as False and ``1e-3`` as a string."""
    from trainers.cli import _grpo_pairs
    from trainers.settings import read_yaml

    assert _grpo_pairs(["save_strategy=no", "bf16=false", "learning_rate=1e-3"]) == {
        "save_strategy": "no",
        "bf16": False,
        "learning_rate": 0.001,
    }
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grpo:\n  save_strategy: no\n  learning_rate: 5e-4\n")
    assert read_yaml(str(cfg))["grpo"] == {"save_strategy": "no", "learning_rate": 0.0005}


def test_sdk_train_is_a_shim_that_imports_trainers_only_when_run() -> None:
    """``sdk`` stands below ``trainers``: importing the entry point loads nothing of the trainers."""
    import subprocess
    import sys
    from pathlib import Path

    code = "import sys, sdk.train\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'trainers'))"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(root))
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "sdk.train", "--no-such-flag"], capture_output=True, text=True, cwd=str(root)
    )
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: unrecognized arguments"), (
        proc.stderr
    )


def test_dry_run_groups_as_the_episodes_were_collected(tmp_path, tokenizer_dir, capsys):
    """Episodes of ``tracerl rollout --group-size 8`` are 8 to a group, not split by a hidden default of 4."""
    eps = make_episodes(2, 8)
    for ep in eps:
        ep["metadata"] = json.dumps({"split": "train", "rollout": "r", "group_size": 8})
    data = str(write_parquet(eps, tmp_path / "g8.parquet"))
    rc, out, err = run_cli(capsys, ["--data", data, "--model", str(tokenizer_dir), "--dry-run"])
    assert rc == 0, err
    assert "as the episodes were collected (--group-size to change)" in out and "in 2 groups" in out
    rc, out, _ = run_cli(
        capsys, ["--data", data, "--model", str(tokenizer_dir), "--dry-run", "--group-size", "4"]
    )
    assert rc == 0 and "this run uses 4 (--group-size 8 to match)" in out and "in 4 groups" in out
    for ep in eps:
        ep["metadata"] = json.dumps({"split": "train"})  # episodes that do not say: the default, said so
    data = str(write_parquet(eps, tmp_path / "unknown.parquet"))
    rc, out, _ = run_cli(capsys, ["--data", data, "--model", str(tokenizer_dir), "--dry-run"])
    assert rc == 0 and "the default (the episodes do not record" in out
