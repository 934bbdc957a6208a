"""``start_policy``: the trainer's imports run while a server process loads, never beside an in-process one."""

from __future__ import annotations

import threading

import pytest

from trainers.loop.training import start_policy


class _Trainer:
    def __init__(self) -> None:
        self.server_starting, self.warming = threading.Event(), threading.Event()
        self.warmed_in: str | None = None
        self.overlapped = False

    def warm(self) -> None:
        self.warmed_in = threading.current_thread().name
        self.warming.set()
        self.overlapped = self.server_starting.wait(5)  # the server starts meanwhile (not before, not after)


class _Policy:
    def __init__(self, trainer: _Trainer, use_subprocess: bool, warms: bool = True) -> None:
        self.trainer, self.use_subprocess, self.warms = trainer, use_subprocess, warms and use_subprocess
        self.started = self.saw_warming = False

    def start(self) -> None:
        self.trainer.server_starting.set()
        self.saw_warming = self.trainer.warming.wait(5 if self.warms else 0)
        self.started = True


def test_a_server_process_starts_while_the_trainer_imports() -> None:
    trainer = _Trainer()
    policy = _Policy(trainer, use_subprocess=True)
    start_policy(policy, trainer)  # type: ignore[arg-type]
    assert policy.started and trainer.overlapped and policy.saw_warming
    assert trainer.warmed_in == "tracerl-trainer-imports"  # returned after the imports: joined


def test_an_in_process_server_starts_alone_and_no_trainer_means_no_imports() -> None:
    trainer = _Trainer()
    policy = _Policy(trainer, use_subprocess=False)
    start_policy(policy, trainer)  # type: ignore[arg-type]
    assert policy.started and trainer.warmed_in is None
    start_policy(_Policy(trainer, use_subprocess=True, warms=False), None)
    assert trainer.warmed_in is None


def test_a_server_that_fails_to_start_still_joins_the_imports() -> None:
    trainer = _Trainer()

    class _Broken(_Policy):
        def start(self) -> None:
            self.trainer.server_starting.set()
            raise RuntimeError("no port")

    with pytest.raises(RuntimeError, match="no port"):
        start_policy(_Broken(trainer, use_subprocess=True), trainer)  # type: ignore[arg-type]
    assert trainer.overlapped and trainer.warmed_in == "tracerl-trainer-imports"
