"""``python -m sdk.eval``: the tables, ``--json``, and bad input as one ``error:`` line with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sdk.eval import EvalError, load_results
from sdk.eval._cli import main

ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def rows(tasks: range, samples: int, split: str = "eval", good=lambda t, k: (t + k) % 3 == 0) -> list[dict]:
    return [
        {
            "task_id": f"t{t}",
            "sample": k,
            "split": split,
            "status": "ok",
            "success": good(t, k),
            "answer": str(t % 2),
        }
        for t in tasks
        for k in range(samples)
    ]


def one_error(capsys, argv: list[str], match: str) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and match in err[0], captured.err
    assert captured.out == ""


def test_summarize_table_and_json(tmp_path, capsys):
    f = write(tmp_path / "r.jsonl", rows(range(5), 4))
    assert main(["summarize", str(f)]) == 0
    out = capsys.readouterr().out
    assert "pass@1" in out and "k=4" in out and "maj@k" in out and "t4" in out
    assert main(["summarize", str(f), "--json", "--k", "1,3"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got["pass_at_k"]) == ["1", "3"] and got["tasks"] == 5 and len(got["per_task"]) == 5
    assert main(["summarize", str(f), "--no-tasks"]) == 0
    assert "majority answer" not in capsys.readouterr().out


def test_compare_table_json_and_warning(tmp_path, capsys):
    a = write(tmp_path / "a.jsonl", rows(range(6), 3, good=lambda t, k: False))
    b = write(tmp_path / "b.jsonl", rows(range(1, 6), 3, good=lambda t, k: k == 0))
    assert main(["compare", str(a), str(b), "--resamples", "500"]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("warning: the task sets differ: 1 task(s) only in A")
    assert "+33.3 points" in captured.out and "5 / 0 / 0" in captured.out
    assert main(["compare", str(a), f"{b},{b}", "--json"]) == 2  # the same file twice is not two shards
    capsys.readouterr()
    b1 = write(tmp_path / "b1.jsonl", [r for r in rows(range(1, 6), 3) if r["task_id"] < "t3"])
    b2 = write(tmp_path / "b2.jsonl", [r for r in rows(range(1, 6), 3) if r["task_id"] >= "t3"])
    assert main(["compare", str(a), f"{b1},{b2}", "--json", "--seed", "3"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tasks"] == 5 and got["seed"] == 3 and got["only_a"] == ["t0"]


def test_torn_last_line_is_skipped(tmp_path):
    f = write(tmp_path / "r.jsonl", rows(range(2), 2), tail='{"task_id": "t9", "sam')
    assert {r["task_id"] for r in load_results(f)} == {"t0", "t1"}


def test_bad_input_is_one_error_line(tmp_path, capsys):
    good = write(tmp_path / "good.jsonl", rows(range(3), 2))
    (tmp_path / "empty.jsonl").write_text("")
    write(tmp_path / "train.jsonl", rows(range(3, 5), 2, split="train"))
    (tmp_path / "garbage.jsonl").write_text("not json\n" + json.dumps(rows(range(1), 1)[0]) + "\n")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    write(tmp_path / "other.jsonl", rows(range(10, 12), 2))
    cases = [
        (["summarize", str(tmp_path / "empty.jsonl")], "no results in"),
        (["summarize", str(tmp_path / "missing.jsonl")], "cannot read"),
        (["summarize", str(tmp_path)], "cannot read"),
        (["summarize", str(tmp_path / "garbage.jsonl")], "garbage.jsonl:1: not a results line"),
        (["summarize", str(tmp_path / "binary.jsonl")], "cannot read"),
        (["summarize", str(good), str(good)], "not disjoint shards"),
        (["summarize", str(good), str(tmp_path / "train.jsonl")], "mix splits"),
        (["summarize", str(good), "--k", "0"], "k must be at least 1"),
        (["summarize", str(good), "--k=-2,1"], "k must be at least 1"),
        (["summarize", str(good), "--k", "3"], "more than the 2 samples"),
        (["summarize", str(good), "--k", "two"], "--k takes integers"),
        (["summarize", str(good), "--answer-fn", "no_such_module_xyz:f"], "no_such_module_xyz"),
        (["summarize", str(good), "--store", str(tmp_path / "nostore")], "no store at"),
        (["summarize"], "the following arguments are required"),
        (["evaluate", str(good)], "invalid choice"),
        (["compare", str(good), str(tmp_path / "other.jsonl")], "share no task"),
        (["compare", str(good), str(good), "--resamples", "0"], "resamples must be at least 1"),
        (["compare", str(good), ","], "no results file"),
    ]
    for argv, match in cases:
        one_error(capsys, argv, match)


def test_python_m_entry_point(tmp_path):
    f = write(tmp_path / "r.jsonl", rows(range(3), 2))
    env_cmd = [sys.executable, "-m", "sdk.eval"]
    ok = subprocess.run([*env_cmd, "summarize", str(f)], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ok.returncode == 0 and "pass@1" in ok.stdout and ok.stderr == ""
    bad = subprocess.run(
        [*env_cmd, "summarize", str(tmp_path / "x.jsonl")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: cannot read")
    # `import sdk.eval` pulls in no third-party package (it is standard library only).
    probe = "import sys, sdk.eval; print(sorted(m for m in ('numpy', 'polars', 'torch', 'scipy') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr


def test_library_errors_are_eval_errors():
    with pytest.raises(EvalError, match="no results given"):
        load_results([])
