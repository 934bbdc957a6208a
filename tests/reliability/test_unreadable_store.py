"""An unreadable store or segment is one ``error:`` line and exit 2 in inspect, export and train; never empty.

Root ignores file modes, and CI runs as root: the CLIs run in a child process that drops to ``nobody``
after its imports (so the test never skips), against a store under a directory ``nobody`` can reach.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import contextlib, io, json, os, sys
    import polars  # noqa: F401  (imported before privileges drop: /root may be private)
    import sdk.episodes, sdk.episodes._parallel, sdk.episodes._worker  # noqa: F401
    from sdk import export, inspect
    from trainers import cli, get_trainer

    get_trainer("trl")  # the backend module, imported before privileges drop

    store, out, model = sys.argv[1], sys.argv[2], sys.argv[3]
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    results = {}
    for name, run in {
        "inspect": lambda: inspect.main([store]),
        "export": lambda: export.main(["--store", store, "--out", out, "-q"]),
        "train": lambda: cli.main(["--data", store, "--model", model, "--dry-run"]),
    }.items():
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = run()
            except BaseException as exc:  # a traceback: reported to the test, not raised
                rc, err = repr(exc), io.StringIO(repr(exc))
        results[name] = {"rc": rc, "err": err.getvalue()}
    print(json.dumps(results))
    """
)


@pytest.fixture
def base() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tracerl-perm-"))
    d.chmod(0o777)  # nobody writes the export's output here
    try:
        yield d
    finally:
        for p in d.rglob("*"):
            if not p.is_symlink():
                p.chmod(0o755)
        shutil.rmtree(d)


def _store(base: Path) -> Path:
    import sdk

    store = base / "store"
    sdk.configure(store=store)
    with sdk.session(task_id="t") as s:
        s.reward(1.0)
    sdk.shutdown()
    return store


def _run(store: Path, base: Path, model: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(store), str(base / "e.parquet"), str(model)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=180,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _check(results: dict) -> None:
    for name, r in results.items():
        lines = r["err"].strip().splitlines()
        assert r["rc"] == 2, (name, r)
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Permission denied" in lines[0], (
            name,
            r,
        )


def test_an_unreadable_store_directory_is_an_error_not_an_empty_store(base: Path, tmp_path: Path) -> None:
    store = _store(base)
    store.chmod(0o311)  # can be entered, not listed
    _check(_run(store, base, base))


def test_an_unreadable_segment_is_an_error(base: Path) -> None:
    store = _store(base)
    [segment] = store.glob("*.jsonl")
    segment.chmod(0o000)
    _check(_run(store, base, base))
