"""One way in to episodes: ``open_episodes`` over every source kind, and ``EpisodeOptions``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sdk.episodes import (
    EpisodeError,
    EpisodeOptions,
    ExportSummary,
    build_episodes,
    export,
    open_episodes,
    read_episodes,
)
from sdk.store import StoreReader
from tests.support.sessions import close_store, weather_session


def _three_sessions() -> None:
    weather_session(task_id="t1", split="train")
    weather_session(task_id="t2", split="test", city="Oslo")
    weather_session(task_id="t3", reward=None, split="train", city="Rome")
    close_store()


def _ids(episodes: object) -> list[str]:
    return sorted(ep["episode_id"] for ep in episodes)  # type: ignore[attr-defined]


def test_episode_options_defaults_normalising_and_validation() -> None:
    opts = EpisodeOptions()
    assert opts.is_default and opts.require_reward and opts.reward_name == "reward"
    assert opts.models == opts.agents == opts.splits == opts.split_by == ()
    given = EpisodeOptions(models=["gpt-*"], agents="planner", splits=iter(["train"]), split_by=["agent"])
    assert given.models == ("gpt-*",) and given.agents == ("planner",)  # a string is one pattern
    assert given.splits == ("train",) and given.split_by == ("agent",) and not given.is_default
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.models = ()  # type: ignore[misc]
    with pytest.raises(ValueError, match="split_by accepts 'agent' and 'model'"):
        EpisodeOptions(split_by=["thread"])
    assert given.replace(require_reward=False).require_reward is False and given.require_reward
    with pytest.raises(TypeError):
        given.replace(modle=("x",))


def test_keyword_arguments_map_into_the_options(store: Path) -> None:
    _three_sessions()
    by_options = _ids(build_episodes(store, EpisodeOptions(splits=("train",), require_reward=False)))
    by_keywords = _ids(build_episodes(store, splits=["train"], require_reward=False))
    assert by_options == by_keywords and len(by_options) == 2
    # Keywords apply over the options given.
    both = _ids(build_episodes(store, EpisodeOptions(splits=("train",)), require_reward=False))
    assert both == by_options
    with pytest.raises(TypeError, match="unexpected keyword argument.*modle"):
        build_episodes(store, modle=["x"])
    with pytest.raises(TypeError, match="must be an EpisodeOptions"):
        build_episodes(store, {"splits": ["train"]})  # type: ignore[arg-type]


def test_open_episodes_over_each_local_source_kind(store: Path, tmp_path: Path) -> None:
    _three_sessions()
    built = list(build_episodes(store))
    assert len(built) == 2  # the third has no reward

    # A store directory: built as build_episodes builds them, the same options and counts.
    summary = ExportSummary()
    assert list(open_episodes(store, summary=summary)) == built
    assert summary.sessions == 3 and summary.rejected["missing_reward"] == 1
    assert _ids(open_episodes(store, EpisodeOptions(require_reward=False))) == _ids(
        build_episodes(store, require_reward=False)
    )
    assert _ids(open_episodes(store, EpisodeOptions(splits=["test"]))) == _ids(
        ep for ep in built if json.loads(ep["metadata"])["split"] == "test"
    )
    # A StoreReader and an iterable of its sessions.
    assert _ids(open_episodes(StoreReader(store))) == _ids(built)
    assert _ids(open_episodes(StoreReader(store).sessions())) == _ids(built)

    # One Parquet file: the episodes as read_episodes reads them.
    parts = tmp_path / "parts"
    export(store, parts / "a.parquet", splits=["train"], rejects=False)
    export(store, parts / "b.parquet", splits=["test"], rejects=False)
    assert list(open_episodes(parts / "a.parquet")) == read_episodes(parts / "a.parquet")
    # A directory of Parquet files: every file, in name order.
    every = read_episodes(parts / "a.parquet") + read_episodes(parts / "b.parquet")
    assert list(open_episodes(parts)) == every and _ids(every) == _ids(built)
    assert list(open_episodes(str(parts))) == every

    # Episodes already in memory: dicts as they are (mappings copied to dicts).
    assert list(open_episodes(every)) == every
    assert list(open_episodes(iter(every[:1]))) == every[:1]
    assert list(open_episodes([])) == []
    polars = pytest.importorskip("polars")
    assert _ids(open_episodes(polars.DataFrame(every))) == _ids(every)


def test_open_episodes_refuses_what_it_cannot_do(store: Path, tmp_path: Path) -> None:
    _three_sessions()
    export(store, tmp_path / "eps.parquet", rejects=False)
    # Options would not apply to episodes that are already built: refused, never silently ignored.
    with pytest.raises(ValueError, match="parquet file sources hold built episodes"):
        open_episodes(tmp_path / "eps.parquet", EpisodeOptions(splits=["train"]))
    with pytest.raises(ValueError, match="iterable sources hold built episodes"):
        open_episodes([{"episode_id": "e"}], EpisodeOptions(models=["m"]))
    # Raised at the call, before any iteration.
    with pytest.raises(FileNotFoundError, match="no store directory or episode file"):
        open_episodes(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("not parquet")
    with pytest.raises(EpisodeError, match="not a readable Parquet file"):
        list(open_episodes(tmp_path / "notes.txt"))
    with pytest.raises(TypeError, match="expected an episode Parquet file"):
        open_episodes(42)
