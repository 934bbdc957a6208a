"""Parquet: exact schema, zstd, round trip, and every reader the dev extra installs."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import sdk
from sdk.capture import record_call
from sdk.episodes import EpisodeError, build_episodes, export, read_episodes, write_parquet
from sdk.episodes._schema import COLUMNS, polars_schema, schema_markdown
from tests.support.sessions import RawStore, assistant, call, close_store, tool_call, user, weather_session


@pytest.fixture
def exported(store: Path, tmp_path: Path) -> tuple[Path, list[dict]]:
    for i, task in enumerate(["a", "a", "b"]):
        weather_session(task_id=task, reward=float(i), split="train")
    with sdk.session(task_id="c", sample=3) as s:
        record_call(
            call([user("q")], assistant("plain", reasoning_content="hmm"), agent="solo", token_ids=False)
        )
        s.reward(0.5, name="reward")
    close_store()
    out = tmp_path / "out" / "episodes.parquet"
    summary = export(store, out)
    assert summary.written == 4 and summary.rejected_total == 0
    return out, list(build_episodes(store))


def test_round_trip_is_exact(exported: tuple[Path, list[dict]]) -> None:
    out, built = exported
    assert read_episodes(out) == built


def test_schema_is_explicit_and_documented(exported: tuple[Path, list[dict]]) -> None:
    out, _ = exported
    assert pl.read_parquet_schema(out) == polars_schema(1)  # no policy versions in this store: version 1
    assert [c for c, _, _ in COLUMNS] == list(polars_schema())
    assert schema_markdown().count("\n") == len(COLUMNS) + 1


def test_null_only_columns_keep_their_types(raw_store: RawStore, tmp_path: Path) -> None:
    # No tools, agents, samples, tool calls or token data anywhere: inference would see only nulls.
    raw_store.session("s1", [user("q")], assistant("a"), task_id=None)
    out = tmp_path / "e.parquet"
    assert export(raw_store.path, out).written == 1
    assert pl.read_parquet_schema(out) == polars_schema(1)
    [ep] = read_episodes(out)
    assert ep["tools"] == "[]" and ep["agent"] is None and ep["turns"][0]["token_ids"] is None


def test_zstd_and_file_metadata(exported: tuple[Path, list[dict]]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    out, _ = exported
    meta = pq.ParquetFile(out).metadata
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
    assert meta.metadata[b"tracerl.schema_version"] == b"1"
    assert pl.read_parquet(out)["schema_version"].to_list() == [1, 1, 1, 1]


def test_row_groups_are_sized_in_bytes_not_batches(raw_store: RawStore, tmp_path: Path) -> None:
    from sdk.episodes._parquet import _row_group_size

    assert _row_group_size(pl.DataFrame({"a": [1] * 10})) == 50_000  # tiny rows: capped
    assert _row_group_size(pl.DataFrame({"a": ["x" * 100_000] * 10})) == 1000  # huge rows: one batch
    for i in range(30):
        raw_store.session(f"s{i}", [user("q")], assistant("a"))
    out = tmp_path / "e.parquet"
    assert export(raw_store.path, out, batch_size=10).written == 30
    pq = pytest.importorskip("pyarrow.parquet")
    assert pq.ParquetFile(out).metadata.num_row_groups == 1  # three batches, one row group


def test_readable_by_pandas(exported: tuple[Path, list[dict]]) -> None:
    pd = pytest.importorskip("pandas")
    out, built = exported
    df = pd.read_parquet(out)
    assert list(df.columns) == list(polars_schema())
    assert df["episode_id"].tolist() == [e["episode_id"] for e in built]
    assert df["messages"].iloc[0][0]["role"] == "system"


def test_readable_by_duckdb(exported: tuple[Path, list[dict]]) -> None:
    duckdb = pytest.importorskip("duckdb")
    out, _ = exported
    rows = duckdb.sql(
        f"select task_id, count(*), avg(reward), max(len(messages)) from '{out}' "
        "group by task_id order by task_id"
    ).fetchall()
    assert rows == [("a", 2, 0.5, 5), ("b", 1, 2.0, 5), ("c", 1, 0.5, 2)]
    [(role, name)] = duckdb.sql(
        f"select messages[3].role, messages[3].tool_calls[1].function.name from '{out}' where task_id = 'b'"
    ).fetchall()
    assert (role, name) == ("assistant", "get_weather")


def test_readable_by_datasets_and_conversational_for_trl(
    exported: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    datasets = pytest.importorskip("datasets")
    out, built = exported
    ds = datasets.load_dataset("parquet", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 4 and ds.column_names == list(polars_schema())
    assert ds[0]["messages"] == built[0]["messages"]
    data_utils = pytest.importorskip("trl.data_utils")
    assert data_utils.is_conversational({"messages": ds[0]["messages"]})


def test_messages_render_with_a_chat_template(exported: tuple[Path, list[dict]]) -> None:
    pytest.importorskip("trl")
    tiny = pytest.importorskip("trainers._tiny")
    out, _ = exported
    tok = tiny.build_tiny_tokenizer()
    for ep in read_episodes(out):
        text = tok.apply_chat_template(ep["messages"], tools=json.loads(ep["tools"]) or None, tokenize=False)
        assert ep["messages"][-1]["content"] in text


def test_empty_export_writes_a_file_with_the_schema(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = tmp_path / "e.parquet"
    summary = export(tmp_path / "empty", out)
    assert summary.written == 0 and pl.read_parquet_schema(out) == polars_schema(1)
    assert read_episodes(out) == []


def test_small_batches_stream_in_order(store: Path, tmp_path: Path) -> None:
    ids = [weather_session(task_id=f"t{i}") for i in range(7)]
    close_store()
    out = tmp_path / "e.parquet"
    assert export(store, out, batch_size=2).written == 7
    assert [e["session_id"] for e in read_episodes(out)] == ids


def test_rejects_file_lifecycle(store: Path, tmp_path: Path) -> None:
    weather_session(task_id="ok")
    weather_session(task_id="bad", reward=None)
    close_store()
    out = tmp_path / "e.parquet"
    summary = export(store, out)
    rejects = tmp_path / "e.rejects.jsonl"
    [line] = rejects.read_text().splitlines()
    record = json.loads(line)
    assert summary.rejects_path == str(rejects)
    assert record["reasons"] == ["missing_reward"] and record["episode"]["task_id"] == "bad"
    assert record["problems"][0]["severity"] == "error"
    # A later run without rejects removes the stale file rather than leave it contradicting the summary.
    export(store, out, require_reward=False)
    assert not rejects.exists()
    export(store, out, rejects=None)
    assert not rejects.exists()
    export(store, out, rejects=tmp_path / "r" / "why.jsonl")
    assert (tmp_path / "r" / "why.jsonl").exists()
    with pytest.raises(ValueError, match="inside the store"):
        export(store, store / "e.parquet")


def test_strict_failure_writes_nothing(store: Path, tmp_path: Path) -> None:
    weather_session(task_id="ok")
    weather_session(task_id="bad", reward=None)
    close_store()
    out = tmp_path / "e.parquet"
    with pytest.raises(EpisodeError, match=r"missing_reward.*\(strict mode\)"):
        export(store, out, strict=True)
    assert not out.exists() and list(tmp_path.glob(".e.parquet.tmp*")) == []


def test_output_path_errors(store: Path, tmp_path: Path) -> None:
    weather_session()
    close_store()
    with pytest.raises(IsADirectoryError):
        export(store, tmp_path)


def test_read_episodes_errors(tmp_path: Path) -> None:
    with pytest.raises(EpisodeError, match="no episode file"):
        read_episodes(tmp_path / "missing.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(EpisodeError, match="not a readable Parquet file"):
        read_episodes(tmp_path / "junk.parquet")
    pl.DataFrame({"a": [1]}).write_parquet(tmp_path / "other.parquet")
    with pytest.raises(EpisodeError, match="not a tracerl episode file"):
        read_episodes(tmp_path / "other.parquet")
    pl.DataFrame(
        {"schema_version": [3], "episode_id": ["x"], "messages": [[{"role": "user"}]]}
    ).write_parquet(tmp_path / "future.parquet")
    with pytest.raises(EpisodeError, match="unknown schema_version 3"):
        read_episodes(tmp_path / "future.parquet")


def test_write_parquet_revalidates_episodes_from_anywhere(
    exported: tuple[Path, list[dict]], tmp_path: Path
) -> None:
    out, built = exported
    eps = read_episodes(out)
    eps.append({**eps[0]})  # duplicate id
    eps.append({**eps[1], "episode_id": "x:0", "schema_version": 7})
    summary = write_parquet(eps, tmp_path / "again.parquet")
    assert summary.written == 4 and summary.rejected == {"duplicate_id": 1, "unknown_schema_version": 1}
    assert read_episodes(tmp_path / "again.parquet") == built


def test_values_parquet_cannot_hold_are_fixed_and_counted(tmp_path: Path) -> None:
    raw = RawStore(tmp_path / "s")
    # Half an emoji (a lone surrogate, as some JSON encoders escape it) and a float among token ids.
    raw.session(
        "s1",
        [user("broken \ud83d emoji")],
        assistant("a"),
        logprobs=[{"token": "a", "logprob": -1.0}],
        completion_token_ids=[1.5],
    )
    out = tmp_path / "e.parquet"
    summary = export(raw.path, out)
    assert summary.written == 1 and summary.token_faithful == 0
    assert summary.warnings == {"invalid_unicode_replaced": 1, "invalid_token_data_dropped": 1}
    [ep] = read_episodes(out)
    assert ep["messages"][0]["content"].startswith("broken \ufffd") and ep["turns"][0]["token_ids"] is None


def test_very_large_messages_round_trip(raw_store: RawStore, tmp_path: Path) -> None:
    big = "x" * (8 * 1024 * 1024)
    raw_store.session(
        "s1", [user(big)], assistant(None, [tool_call("c1", arguments=json.dumps({"q": big[:100000]}))])
    )
    out = tmp_path / "e.parquet"
    summary = export(raw_store.path, out)
    assert summary.written == 1 and summary.warnings == {"trailing_tool_call": 1}
    [ep] = read_episodes(out)
    assert len(ep["messages"][0]["content"]) == len(big)
