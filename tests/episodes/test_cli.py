"""python -m sdk.export and python -m sdk.inspect: summaries on stdout, one-line errors, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sdk import export as export_cli
from sdk import inspect as inspect_cli
from sdk.episodes import read_episodes
from sdk.testing import ScriptedOpenAIServer, ScriptedResponse
from tests.support.sessions import close_store, weather_session

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def filled(store: Path) -> Path:
    weather_session(task_id="a", reward=1.0, split="train")
    weather_session(task_id="a", reward=0.0, split="train")
    weather_session(task_id="b", reward=None, split="test")
    close_store()
    return store


def run(argv: list[str], capsys: pytest.CaptureFixture[str], cli=export_cli) -> tuple[int, str, str]:
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], lines[0]


def test_export_prints_a_summary_table(
    filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "e.parquet"
    rc, stdout, err = run(["--store", str(filled), "--out", str(out)], capsys)
    assert rc == 0 and err == ""
    for text in (
        "sessions",
        "episodes written",
        "rejected: missing_reward",
        "task a",
        "0.5000 ± 0.5000 (n=2)",
    ):
        assert text in stdout
    assert len(read_episodes(out)) == 2


def test_export_flags(filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "e.parquet"
    rc, stdout, _ = run(
        [
            "--store",
            str(filled),
            "--out",
            str(out),
            "--split",
            "train",
            "--quiet",
            "--summary-json",
            "-",
            "--no-rejects",
        ],
        capsys,
    )
    summary = json.loads(stdout)
    assert (
        rc == 0
        and summary["written"] == 2
        and summary["skipped"] == {"sessions_filtered": 1, "calls_filtered": 2}
    )
    assert summary["rewards"]["a"] == {"n": 2, "mean": 0.5, "std": 0.5}
    assert not (tmp_path / "e.rejects.jsonl").exists()
    rc, _, _ = run(
        [
            "--store",
            str(filled),
            "--out",
            str(out),
            "--allow-missing-reward",
            "-q",
            "--summary-json",
            str(tmp_path / "s.json"),
        ],
        capsys,
    )
    assert rc == 0 and json.loads((tmp_path / "s.json").read_text())["written"] == 3


def test_reward_fn_from_the_working_directory(
    filled: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "cli_rewards.py").write_text("def length(ep):\n    return float(len(ep['messages']))\n")
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(work))])
    rc, _, err = run(
        [
            "--store",
            str(filled),
            "--out",
            "e.parquet",
            "-q",
            "--reward-fn",
            "cli_rewards:length",
            "--reward-fn",
            "len2=cli_rewards:length",
        ],
        capsys,
    )
    assert rc == 0, err
    eps = read_episodes(work / "e.parquet")
    assert [e["reward"] for e in eps] == [5.0, 5.0, 5.0]
    assert eps[0]["rewards"][-1] == {"name": "len2", "value": 5.0}
    sys.modules.pop("cli_rewards", None)


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--reward-fn", "no_such_module:fn"], ["module 'no_such_module'"]),
        (["--reward-fn", "not-a-spec"], ["must look like [name=]module:function"]),
        (["--strict"], ["missing_reward", "(strict mode)"]),
        (["--judge-model", "j"], ["--judge-model needs --judge-base-url"]),
        (
            ["--judge-model", "j", "--judge-base-url", "http://x", "--judge-rubric", "/nonexistent"],
            ["cannot read --judge-rubric"],
        ),
    ],
)
def test_export_errors_are_one_line(
    filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], fragments: list[str]
) -> None:
    out = tmp_path / "e.parquet"
    rc, _, err = run(["--store", str(filled), "--out", str(out), "-q", *extra], capsys)
    assert rc == 2
    assert_one_line_error(err, *fragments)
    assert not out.exists()


def test_export_missing_store_and_bad_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["--store", str(tmp_path / "nope"), "--out", str(tmp_path / "e.parquet")], capsys)
    assert rc == 2
    assert_one_line_error(err, "no tracerl store at")
    (tmp_path / "s").mkdir()
    rc, _, err = run(["--store", str(tmp_path / "s"), "--out", str(tmp_path)], capsys)
    assert rc == 2
    assert_one_line_error(err, "is a directory")


def test_export_with_nothing_to_write_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    rc, stdout, err = run(["--store", str(tmp_path / "empty"), "--out", str(tmp_path / "e.parquet")], capsys)
    assert rc == 1 and "episodes written" in stdout
    assert err.strip() == "warning: no episode was written (the store holds no calls)"


def test_export_with_the_judge(store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weather_session(task_id="w", reward=None)
    weather_session(task_id="w", reward=None)
    close_store()
    out = tmp_path / "e.parquet"
    with ScriptedOpenAIServer() as server:
        server.enqueue(ScriptedResponse.text('{"scores": [0.1, 0.9]}'))
        rc, _, err = run(
            [
                "--store",
                str(store),
                "--out",
                str(out),
                "-q",
                "--judge-model",
                "j",
                "--judge-base-url",
                server.base_url,
                "--judge-name",
                "reward",
            ],
            capsys,
        )
    assert rc == 0, err
    assert [e["reward"] for e in read_episodes(out)] == [0.1, 0.9]


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        export_cli.main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--store",
        "--out",
        "--strict",
        "--reward-fn",
        "--model",
        "--agent",
        "--judge-model",
        "Exit status",
    ):
        assert flag in text


def test_inspect_store_and_parquet(filled: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, stdout, _ = run([str(filled)], capsys, inspect_cli)
    assert rc == 0 and "sessions" in stdout and "with token ids" in stdout
    rc, stdout, _ = run([str(filled), "--json"], capsys, inspect_cli)
    info = json.loads(stdout)
    assert info["sessions"] == 3 and info["calls"] == 6 and info["calls_with_token_ids"] == 6
    out = tmp_path / "e.parquet"
    export_cli.main(["--store", str(filled), "--out", str(out), "-q"])
    rc, stdout, _ = run([str(out), "--json"], capsys, inspect_cli)
    info = json.loads(stdout)
    assert rc == 0 and info["episodes"] == 2 and info["schema_ok"] and info["token_faithful"] == 2
    assert info["reward_per_task"] == {"a": "0.5000 ± 0.5000 (n=2)"}
    rc, stdout, _ = run([str(out)], capsys, inspect_cli)
    assert rc == 0 and "token-faithful" in stdout
    rc, stdout, _ = run(["--schema"], capsys, inspect_cli)
    assert rc == 0 and stdout.startswith("| column | type | meaning |")


def test_inspect_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run([str(tmp_path / "missing")], capsys, inspect_cli)
    assert rc == 2
    assert_one_line_error(err, "no store directory or Parquet file")
    (tmp_path / "junk.parquet").write_bytes(b"\x00" * 100)
    rc, _, err = run([str(tmp_path / "junk.parquet")], capsys, inspect_cli)
    assert rc == 2
    assert_one_line_error(err, "not a readable Parquet file")


def test_subprocess_fatal_input_has_no_traceback(tmp_path: Path) -> None:
    for module, args in (
        ("sdk.export", ["--store", str(tmp_path / "nope"), "--out", str(tmp_path / "o.parquet")]),
        ("sdk.inspect", [str(tmp_path / "nope")]),
    ):
        proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 2 and proc.stdout == ""
        assert_one_line_error(proc.stderr, "error: ")


def test_importing_sdk_and_the_clis_does_not_import_polars() -> None:
    code = (
        "import sys, sdk, sdk.episodes, sdk.export, sdk.inspect\n"
        "print([m for m in ('polars', 'tqdm', 'rich', 'pandas') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
