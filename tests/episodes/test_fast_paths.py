"""orjson and pyarrow only make an export faster: without them the output is the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import sdk._json
import sdk.episodes._frame
from sdk.episodes import export
from tests.support.sessions import RawStore, assistant, system, tool, tool_call, user


def _store(path: Path) -> Path:
    raw = RawStore(path, "20260101T000000-host-0-abcdef")
    ok = [system("s"), user("q")]
    calls = [tool_call("c1")]
    raw.start("s1", task_id="t", metadata={"split": "train", "weight": float("nan")})
    raw.call("s1", ok, assistant(None, calls), completion_token_ids=[1, 2], logprobs=[-0.5, -0.25])
    raw.call("s1", [*ok, assistant(None, calls), tool("c1")], assistant("done \ud83d"), prompt_token_ids=[3])
    raw.reward("s1", 1.0).end("s1")
    raw.session(
        "s2", ok, assistant("a"), completion_token_ids=[2**70], logprobs=[{"token": "a", "logprob": -1}]
    )
    raw.raw(b'{"event":"reward","session_id":"s2","value":NaN}\n')
    return path


def test_without_orjson_and_pyarrow_the_export_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = _store(tmp_path / "store")
    fast = export(store, tmp_path / "fast.parquet")
    assert sdk._json.fast() and sdk.episodes._frame._pyarrow(load=True) is not None  # dev has both
    monkeypatch.setattr(sdk._json, "_orjson", None)
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` fails
    monkeypatch.setattr(sdk.episodes._frame, "_LOAD_PYARROW", [True])
    slow = export(store, tmp_path / "slow.parquet")
    assert pl.read_parquet(tmp_path / "fast.parquet").equals(pl.read_parquet(tmp_path / "slow.parquet"))
    assert fast.written == slow.written == 2
    for key in ("store_problems", "warnings", "rejected"):
        assert getattr(fast, key) == getattr(slow, key)
    assert dict(fast.store_problems) == {"invalid_reward": 1}


def test_orjson_refusals_fall_back_to_the_standard_library() -> None:
    # orjson rejects NaN, lone surrogates and numbers beyond double range; json.loads reads them.
    assert sdk._json.loads(b'{"a": NaN}')["a"] != sdk._json.loads(b'{"a": NaN}')["a"]
    assert sdk._json.loads(b'"\\ud83d"') == "\ud83d"
    assert sdk._json.loads(b"1e400") == float("inf")
    with pytest.raises(UnicodeDecodeError):
        sdk._json.loads(b'"\xff"')
    with pytest.raises(ValueError):
        sdk._json.loads(b"{torn")


def test_gc_paced_restores_the_process_settings() -> None:
    import gc

    from sdk.episodes._pipeline import gc_paced

    before = gc.get_threshold()
    with gc_paced():
        assert gc.get_threshold()[0] > before[0] and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.freeze()  # the caller's own freeze is left alone
    try:
        frozen = gc.get_freeze_count()
        with gc_paced():
            pass
        # Not unfrozen (that would be 0); a few frozen objects may be freed by refcount meanwhile (threads of
        # earlier tests in this process still running), so not exactly equal either.
        assert abs(gc.get_freeze_count() - frozen) <= 64
    finally:
        gc.unfreeze()


def test_pyarrow_is_loaded_only_for_token_data(tmp_path: Path) -> None:
    # It costs ~45 MB per process and speeds up only token-id columns (see _frame._pyarrow).
    plain = tmp_path / "plain"
    RawStore(plain).session("s", [system("s"), user("q")], assistant("a"))
    code = (
        "import sys; from sdk.episodes import export; export(sys.argv[1], sys.argv[2]); "
        "print('pyarrow' in sys.modules)"
    )
    loaded = [
        subprocess.run(
            [sys.executable, "-c", code, str(store), str(tmp_path / f"{i}.parquet")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for i, store in enumerate((plain, _store(tmp_path / "tokens")))
    ]
    assert loaded == ["False", "True"]
