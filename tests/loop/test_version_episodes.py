"""A version's episodes: an invalid one is counted for the row (``episodes_rejected``), never logged between
the loop's table rows."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from sdk.store import StoreReader
from tests.support.sessions import close_store, weather_session
from trainers.loop.driver import _version_episodes


def test_an_invalid_episode_is_counted_for_the_row_not_logged(store, caplog):
    weather_session(task_id="t")
    weather_session(task_id="t", reward=None)  # no reward: not an episode to train on
    close_store()
    sessions = [s for s in StoreReader(store).sessions() if not s.implicit]
    with caplog.at_level(logging.WARNING, logger="tracerl"):
        episodes, rejected = _version_episodes([SimpleNamespace(key="t#r:0", sessions=sessions)])
    assert [e["task_id"] for e in episodes] == ["t#r:0"] and rejected == {"missing_reward": 1}
    assert "skipped" not in caplog.text
