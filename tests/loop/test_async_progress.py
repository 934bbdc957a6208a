"""The asynchronous loop shows, on a terminal, the groups a version still waits for (issue 50: nothing moved
between the validation of version 0 and the first version's line)."""

from __future__ import annotations

import io

import pytest

from trainers.loop.driver import _GroupBar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_version_s_groups_are_a_bar_on_a_terminal_and_nothing_in_a_log(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("tqdm")
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    bar = _GroupBar("collect version 1", 8, quiet=False)
    for n in (0, 3, 3, 9):  # polls: more groups than the version takes count as all of them
        bar.show(n)
    assert bar.shown == 8
    bar.close()
    assert "collect version 1" in term.getvalue() and "8/8" in term.getvalue()

    log = io.StringIO()  # not a terminal: a bar redrawn into a log would fill it
    monkeypatch.setattr("sys.stderr", log)
    quiet_bar = _GroupBar("collect version 2", 8, quiet=False)
    quiet_bar.show(4)
    quiet_bar.close()
    assert log.getvalue() == ""
    _GroupBar("collect version 3", 8, quiet=True).close()  # quiet: no bar at all
