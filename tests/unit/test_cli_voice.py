"""One voice on the command line: every ``tracerl`` subcommand's help and its errors speak the same way.

Each subcommand's parser is caught as its own ``main`` builds it for ``--help`` (``print_help`` records the
parser), so the checks read argparse's actions, not the help text: the program name, a help line for every
option, the reference module in the epilog. Then each bad input the issue found: one ``error:`` line, exit
status 2, no traceback, and no empty store or output directory left behind.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sdk import cli
from sdk.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]

# Every way `tracerl` is typed with --help: each subcommand, and the loop (its own parser under `train`).
INVOCATIONS = {name: [name] for name in COMMANDS} | {"train --loop": ["train", "--loop"]}
# A help that stops mid-phrase ("...; the base") ends with one of these.
DANGLING = re.compile(r"(?:[;,:(]|\b(?:the|a|an|and|or|its|their))\s*$", re.I)


def _parsers_of(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Any) -> list[Any]:
    """The parsers whose help ``tracerl ARGV --help`` prints (the first one is the command's own)."""
    if argv[0] == "serve":
        pytest.importorskip("torch")  # the policy server imports torch at the top
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def record(self: argparse.ArgumentParser, file: Any = None) -> None:
        seen.append(self)
        original(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", record)
    try:
        status = cli.main([*argv, "--help"])
    except SystemExit as exc:  # argparse's --help exits 0; some mains return that status instead
        status = exc.code
    out = capsys.readouterr().out
    assert status == 0 and len(seen) == 1, (argv, status, out[-500:])
    assert out.startswith(f"usage: tracerl {' '.join(argv)}"), out[:200]
    parsers = [seen[0]]
    for parser in parsers:  # subcommands (`tracerl otel export`, `tracerl eval compare`) too
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers += action.choices.values()
    return parsers


@pytest.mark.parametrize("name", sorted(INVOCATIONS))
def test_help_says_tracerl_and_every_option_has_help(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    argv = INVOCATIONS[name]
    parsers = _parsers_of(argv, monkeypatch, capsys)
    top = parsers[0]
    reference = re.search(r"reference: python -m pydoc (\S+)", top.epilog or "")
    assert reference, f"tracerl {name} --help names no reference module: {top.epilog!r}"
    importlib.import_module(reference.group(1))  # the module named exists
    problems = []
    for parser in parsers:
        if not parser.prog.startswith(f"tracerl {argv[0]}"):
            problems.append(f"{parser.prog}: another program name")
        if not parser.format_usage().startswith(f"usage: {parser.prog}"):
            problems.append(f"{parser.prog}: usage says {parser.format_usage()[:60]!r}")
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            label = f"{parser.prog} {'/'.join(action.option_strings) or action.dest}"
            text = action.help
            if isinstance(action, argparse._SubParsersAction):
                text = "listed" if all(a.help for a in action._choices_actions) else None
            if not text or text == argparse.SUPPRESS:
                problems.append(f"{label}: no help")
            elif DANGLING.search(text):
                problems.append(f"{label}: help stops mid-phrase: {text!r}")
    assert not problems, "\n".join(problems)


def test_train_help_lists_the_common_options_first(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    (parser,) = _parsers_of(["train"], monkeypatch, capsys)
    groups = [g for g in parser._action_groups if g._group_actions and g.title != "options"]
    first = {a.dest for a in groups[0]._group_actions}
    assert groups[0].title == "common options"
    assert {"data", "model", "output_dir", "grpo.max_steps", "group_size"} <= first, first
    assert len(groups) >= 4  # grouped, not one list of ~60 flags
    # The usage line is one short synopsis, not every flag.
    assert len(parser.format_usage().splitlines()) <= 3


# ----------------------------------------------------------------------------------- bad input


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    return lines[0]


def _tracerl(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sdk.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("name", sorted(INVOCATIONS))
def test_no_arguments_or_an_unknown_flag_is_one_error_line(name: str, capsys: Any) -> None:
    """Run in-process (a subprocess per command would import torch a dozen times)."""
    if name == "serve":
        pytest.importorskip("torch")
    for extra in ([], ["--no-such-flag"]):
        try:
            status = cli.main([*INVOCATIONS[name], *extra])
        except SystemExit as exc:
            status = exc.code
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert status == 2, (name, extra, status, captured.err[-1000:])
        assert len(lines) == 1 and lines[0].startswith("error: "), (name, extra, captured.err[-1000:])
        assert "usage:" not in captured.out + captured.err


def test_export_without_out_is_one_line_naming_it(tmp_path: Path) -> None:
    line = _one_error_line(_tracerl("export", "--store", str(tmp_path)))
    assert "--out" in line and "tracerl export --help" in line


def test_serve_a_missing_model_directory_in_our_words(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    missing = tmp_path / "nonexistent" / "model"
    line = _one_error_line(_tracerl("serve", "--model", str(missing)))
    assert f"no model directory at {str(missing)!r}" in line
    assert "Repo id" not in line


def test_rollout_with_an_agent_that_does_not_import_leaves_no_store(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "question": "1+1"}\n')
    store = tmp_path / "runs" / "S"
    line = _one_error_line(_tracerl("rollout", "nosuch.module:fn", str(tasks), "--store", str(store)))
    assert "nosuch" in line
    assert not (tmp_path / "runs").exists()  # neither S/ nor the runs/ made for it


def test_rollout_failure_keeps_a_store_that_was_there(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a"}\n')
    store = tmp_path / "S"
    store.mkdir()
    _one_error_line(_tracerl("rollout", "nosuch.module:fn", str(tasks), "--store", str(store)))
    assert store.is_dir()


def test_otel_receive_on_a_busy_port_leaves_no_store(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_error_line(
            _tracerl("otel", "receive", "--store", str(tmp_path / "S"), "--port", str(port))
        )
    assert f"cannot listen on 127.0.0.1:{port}" in line
    assert not (tmp_path / "S").exists()


@pytest.mark.parametrize(
    ("command", "out_flag"),
    [("train", "--output"), ("sft", "--output"), ("export", "--out")],
)
def test_a_failed_start_leaves_no_output_directory(command: str, out_flag: str, tmp_path: Path) -> None:
    out = tmp_path / "made" / "run"
    missing = str(tmp_path / "missing")
    args = {
        "train": ["--data", missing + ".parquet", "--model", missing],
        "sft": ["--data", missing + ".jsonl", "--model", missing],
        "export": ["--store", missing],
    }[command]
    target = str(out / "episodes.parquet") if command == "export" else str(out)
    _one_error_line(_tracerl(command, *args, out_flag, target))
    assert not (tmp_path / "made").exists()


# ------------------------------------------------------------------------ view and inspect agree


def test_view_and_inspect_count_the_same_tasks_by_the_same_name(tmp_path: Path) -> None:
    """The issue's store: view said "N episodes in 892 task groups", inspect "292 tasks" (splits apart)."""
    pytest.importorskip("polars")
    store = _write_sessions(tmp_path / "store")
    view = _tracerl("view", str(store), "--out", str(tmp_path / "r.html"))
    assert view.returncode == 0, view.stderr[-2000:]
    m = re.search(r"(\d+) episodes of (\d+) tasks in (\d+) task groups", view.stdout)
    assert m, view.stdout
    # 3 tasks, each in a train and an eval split: 3 tasks in 6 groups (a split never joins another's).
    assert tuple(map(int, m.groups())) == (12, 3, 6)
    inspect = _tracerl("inspect", str(store), "--json")
    assert inspect.returncode == 0, inspect.stderr[-2000:]
    info = json.loads(inspect.stdout)
    assert (info["tasks"], info["task_groups"]) == (3, 6)
    table = _tracerl("inspect", str(store)).stdout
    assert re.search(r"tasks\W+3 \(6 task groups", table), table


def _write_sessions(store: Path) -> Path:
    """Twelve sessions of one call each: tasks t0..t2, two samples each, in a train and an eval split."""
    import sdk
    from sdk.capture import CallRecord, record_call

    sdk.configure(store=store)
    for split in ("train", "eval"):
        for t in range(3):
            for k in range(2):
                with sdk.session(task_id=f"t{t}", sample=k, split=split) as s:
                    record_call(
                        CallRecord(
                            framework="custom",
                            model="tiny-1",
                            messages=[{"role": "user", "content": f"{t} + {k}?"}],
                            response_message={"role": "assistant", "content": str(t + k)},
                            finish_reason="stop",
                            started_at=1.0,
                            ended_at=1.5,
                        ),
                        s,
                    )
                    s.reward(float(k))
    sdk.flush()
    return store
