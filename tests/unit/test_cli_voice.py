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

    pytest.importorskip("fastapi")  # the receiver's server (tracerl[otel]); the lean CI legs lack it

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


# ------------------------------------------------------------------ README commands and flags exist

SHELL_BLOCK = re.compile(r"^```(bash|sh|shell|console|zsh)[^\n]*\n(.*?)^```", re.M | re.S)
SEPARATORS = {"|", "||", "&", "&&", ";", ";;", "(", ")", ">", ">>", "<", "2>", "2>&1", "|&"}
PREFIXES = {"time", "exec", "nohup", "env", "sudo", "run", "uv"}  # `uv run tracerl ...`, `time tracerl ...`


def _readme_commands(text: str) -> list[tuple[int, list[str]]]:
    """``(line number, [command, args...])`` of each ``tracerl``/``python -m sdk.*`` in the shell blocks."""
    found = []
    for block in SHELL_BLOCK.finditer(text):
        first_line = text.count("\n", 0, block.start(2)) + 1
        lines = block.group(2).splitlines()
        i = 0
        while i < len(lines):
            number, line = first_line + i, lines[i]
            while line.rstrip().endswith("\\") and i + 1 < len(lines):  # continued lines are one command
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i]
            i += 1
            stripped = line.strip()
            if block.group(1) == "console":  # a console block shows output too: only `$ ` lines are typed
                if not stripped.startswith("$ "):
                    continue
                stripped = stripped[2:]
            found += [(number, c) for c in _commands_in(stripped)]
    return found


def _commands_in(line: str) -> list[list[str]]:
    import shlex

    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unbalanced quote: read it word by word rather than not at all
        tokens = line.split("#", 1)[0].split()
    commands = []
    for k, tok in enumerate(tokens):
        before = tokens[k - 1] if k else None
        at_start = before is None or before in SEPARATORS or before in PREFIXES or re.match(r"\w+=", before)
        if tok == "tracerl" and at_start:
            start = k
        elif tok == "-m" and k + 1 < len(tokens) and re.match(r"(sdk|trainers)\.", tokens[k + 1]):
            start = k + 1  # python -m sdk.X, accelerate launch -m sdk.train
        else:
            continue
        end = next((j for j in range(start + 1, len(tokens)) if tokens[j] in SEPARATORS), len(tokens))
        commands.append(tokens[start:end])
    return commands


def _module_command(module: str) -> str | None:
    """The subcommand ``python -m MODULE`` runs (``sdk.view`` -> ``view``), or ``None``."""
    for name, command in COMMANDS.items():
        if command.module in (module, f"{module}.__main__"):
            return name
    return None


def _parser_for(argv: list[str]) -> argparse.ArgumentParser:
    """The parser ``tracerl ARGV --help`` prints (subcommand parsers reached through ``ARGV``)."""
    seen: list[argparse.ArgumentParser] = []

    def record(self: argparse.ArgumentParser, file: Any = None) -> None:
        seen.append(self)  # and print nothing

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "print_help", record)
        try:
            cli.main([*argv, "--help"])
        except SystemExit:
            pass
    assert seen, f"tracerl {' '.join(argv)} --help printed no parser"
    return seen[0]


def _unknown_flags(words: list[str]) -> tuple[str, list[str]]:
    """``(the command as named, its flags that its parser does not know)`` for one README command."""
    head, rest = words[0], words[1:]
    if head == "tracerl":
        if not rest or rest[0] in ("-h", "--help"):
            return "tracerl", [w for w in rest if w.startswith("-") and w not in ("-h", "--help")]
        name, rest = rest[0], rest[1:]
        if name.isupper():  # a placeholder (`tracerl COMMAND --help`): only what every command takes
            return f"tracerl {name}", [w for w in rest if w.startswith("-") and w not in ("-h", "--help")]
        if name not in COMMANDS:
            return f"tracerl {name}", [f"(no such command {name!r})"]
    else:
        name = _module_command(head)
        if name is None:
            import importlib.util

            if importlib.util.find_spec(head) is None:
                return f"python -m {head}", [f"(no module {head!r})"]
            return f"python -m {head}", []  # a module that is no tracerl subcommand: it exists
    argv = [name]
    if name == "train" and "--loop" in rest:
        argv.append("--loop")
        rest = [w for w in rest if w != "--loop"]
    if "--backend" in rest and rest.index("--backend") + 1 < len(rest):  # that backend's own settings
        argv += rest[rest.index("--backend") : rest.index("--backend") + 2]
    if name == "serve":
        pytest.importorskip("torch")
    parser = _parser_for(argv)
    for word in rest:  # `tracerl otel export ...`, `tracerl eval compare ...`: the subcommand's parser
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and word in subs[0].choices:
            parser = subs[0].choices[word]
            break
    known = set(parser._option_string_actions)
    flags = [w.split("=", 1)[0] for w in rest if w.startswith("-") and w != "--" and not _is_number(w)]
    return f"tracerl {' '.join(argv)}", [f for f in flags if f not in known]


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def test_the_readmes_commands_and_flags_exist() -> None:
    """Every ``tracerl X --flag`` / ``python -m sdk.X --flag`` in README.md's shell blocks is real."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = _readme_commands(readme)
    # A README without one command in a shell block would pass everything below: that is a failure too.
    assert len(commands) >= 3, f"found only {commands} in README.md's bash/console blocks"
    problems = []
    for number, words in commands:
        named, unknown = _unknown_flags(words)
        if unknown:
            problems.append(f"README.md:{number}: {named}: {', '.join(unknown)}  ({' '.join(words)})")
    assert not problems, "\n".join(problems)


def test_the_readme_check_catches_a_made_up_flag_and_command() -> None:
    """The check above on a README that names a flag and a command that do not exist."""
    readme = """
```bash
tracerl export --store S --out e.parquet --no-such-flag
python -m sdk.view S --out r.html && tracerl frobnicate --x
```

```console
$ tracerl inspect S \\
    --json --bogus
tracerl view: 3 episodes of 1 tasks in 1 task groups
```
"""
    found = {(n, " ".join(w)): _unknown_flags(w)[1] for n, w in _readme_commands(readme)}
    assert found == {
        (3, "tracerl export --store S --out e.parquet --no-such-flag"): ["--no-such-flag"],
        (4, "sdk.view S --out r.html"): [],
        (4, "tracerl frobnicate --x"): ["(no such command 'frobnicate')"],
        (8, "tracerl inspect S --json --bogus"): ["--bogus"],
    }
