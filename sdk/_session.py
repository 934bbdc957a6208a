"""Sessions: the scope every captured call belongs to.

``session(...)`` returns one object with four roles: a ``with`` / ``async with``
context manager and a decorator for ``def``, ``async def``, generator and async generator functions.
Each entry creates a fresh :class:`Session`; the current session lives in a ``ContextVar``, so it
follows asyncio tasks. Plain threads and executors do not carry context in Python: use :func:`wrap`.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sdk._context import Session, _current, current_session
from sdk._internal import warn_once
from sdk._tracer import tracer

__all__ = ["Session", "SessionScope", "current_session", "reward", "session", "wrap"]

F = TypeVar("F", bound=Callable[..., Any])


class SessionScope:
    """What :func:`session` returns: a context manager and decorator that opens fresh sessions."""

    def __init__(
        self,
        task_id: str | Callable[..., Any] | None,
        sample: int | Callable[..., Any] | None,
        session_id: str | None,
        metadata: dict[str, Any],
    ) -> None:
        self.task_id = task_id
        self.sample = sample
        self.session_id = session_id
        self.metadata = metadata

    # -- opening and closing -----------------------------------------------------------------

    def _open(self, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Session:
        task_id, sample = self.task_id, self.sample
        if callable(task_id):
            task_id = task_id(*args, **(kwargs or {}))
        if callable(sample):
            sample = sample(*args, **(kwargs or {}))
        if task_id is not None and not isinstance(task_id, str):
            task_id = str(task_id)
        parent = _current.get()
        if parent is not None and parent.implicit:
            parent = None
        metadata = {**parent.metadata, **self.metadata} if parent is not None else dict(self.metadata)
        if task_id is None and parent is not None:
            task_id = parent.task_id
        s = Session(
            task_id, metadata, sample=sample, parent=parent, session_id=self.session_id, tracer=tracer
        )
        s._scope = self
        tracer.session_started(s)
        s._token = _current.set(s)
        return s

    @staticmethod
    def _close(s: Session, error: BaseException | None) -> None:
        s.ended_at = time.time()
        tracer.session_ended(s, error)
        token, s._token = s._token, None
        if token is not None:
            try:
                _current.reset(token)
            except ValueError:  # closed from another context (e.g. a generator finalised elsewhere)
                pass

    def _entered(self) -> Session:
        s = _current.get()
        if s is None or s._scope is not self:
            raise RuntimeError("session exited that was not entered in this context")
        return s

    def __enter__(self) -> Session:
        if callable(self.task_id) or callable(self.sample):
            raise TypeError("a callable task_id/sample needs the decorator form: @session(task_id=...)")
        return self._open()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._close(self._entered(), exc)

    async def __aenter__(self) -> Session:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    # -- decorator ---------------------------------------------------------------------------

    def __call__(self, fn: F) -> F:
        """Decorate ``fn`` so each call runs in a fresh session."""
        if inspect.isasyncgenfunction(fn):
            return _async_generator_in_session(self, fn)  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):
            return _generator_in_session(self, fn)  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):
            return _coroutine_in_session(self, fn)  # type: ignore[return-value]
        return _function_in_session(self, fn)  # type: ignore[return-value]


def _async_generator_in_session(scope: SessionScope, fn: Callable[..., Any]) -> Callable[..., Any]:
    # The session is current only while the generator runs, not while its consumer holds a value.
    @functools.wraps(fn)
    async def agen_wrapper(*args: Any, **kwargs: Any) -> Any:
        s = scope._open(args, kwargs)
        _current.reset(s._token)  # type: ignore[arg-type]
        s._token = None
        gen = fn(*args, **kwargs)
        error: BaseException | None = None
        try:
            sent: Any = None
            while True:
                token = _current.set(s)
                try:
                    item = await gen.asend(sent)
                except StopAsyncIteration:
                    return
                finally:
                    _current.reset(token)
                sent = yield item
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                error = exc
            raise
        finally:
            await gen.aclose()
            scope._close(s, error)

    return agen_wrapper


def _generator_in_session(scope: SessionScope, fn: Callable[..., Any]) -> Callable[..., Any]:
    # As above: current only while the generator runs.
    @functools.wraps(fn)
    def gen_wrapper(*args: Any, **kwargs: Any) -> Any:
        s = scope._open(args, kwargs)
        _current.reset(s._token)  # type: ignore[arg-type]
        s._token = None
        gen = fn(*args, **kwargs)
        error: BaseException | None = None
        try:
            sent: Any = None
            while True:
                token = _current.set(s)
                try:
                    item = gen.send(sent)
                except StopIteration as stop:
                    return stop.value
                finally:
                    _current.reset(token)
                sent = yield item
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                error = exc
            raise
        finally:
            gen.close()
            scope._close(s, error)

    return gen_wrapper


def _coroutine_in_session(scope: SessionScope, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
        s = scope._open(args, kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            scope._close(s, exc)
            raise
        scope._close(s, None)
        return result

    return async_wrapper


def _function_in_session(scope: SessionScope, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        s = scope._open(args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            scope._close(s, exc)
            raise
        scope._close(s, None)
        return result

    return wrapper


def session(
    task_id: str | Callable[..., Any] | None = None,
    *,
    sample: int | Callable[..., Any] | None = None,
    session_id: str | None = None,
    **metadata: Any,
) -> SessionScope:
    """Open a session: every LLM call made inside it is recorded into it.

    Works as ``with``, ``async with``, and as a decorator on sync, async, generator and async
    generator functions (a fresh session per call). Sessions nest: the inner one's calls belong to
    it, its metadata merges over the outer one's, and it inherits the outer ``task_id`` if given none.

    Args:
        task_id: The task attempted; episodes of one task form a GRPO group. In the decorator form it
            may be a callable receiving the decorated function's arguments.
        sample: Optional sample / rollout index (also may be a callable in the decorator form).
        session_id: Use this id instead of a random one.
        **metadata: Any JSON-serialisable values (others are stored as their repr, with a warning).

    Returns:
        A :class:`SessionScope`.

    Example:
        >>> with session(task_id="gsm8k-17", split="train") as s:
        ...     s.reward(1.0)
        >>> @session(task_id=lambda q: q["id"])
        ... def run(q): return q["id"]
        >>> run({"id": "t3"})
        't3'
    """
    if task_id is not None and not (isinstance(task_id, str) or callable(task_id)):
        task_id = str(task_id)
    if sample is not None and not (isinstance(sample, int) or callable(sample)):
        raise TypeError(f"sample must be an int or a callable, got {type(sample).__name__}")
    return SessionScope(task_id, sample, session_id, metadata)


def reward(value: float, name: str = "reward", *, call_id: str | None = None) -> None:
    """Record a reward for the current session.

    Raises ``ValueError`` outside a session, or for a non-finite or non-numeric value.

    Example:
        >>> with session(task_id="t1"):
        ...     reward(1.0)
    """
    s = _current.get()
    if s is None or s.implicit:
        raise ValueError(
            "reward() called outside a session: wrap the agent code in `with session(task_id=...)` "
            "or call reward() on the session object"
        )
    s.reward(value, name, call_id=call_id)


def wrap(fn: F) -> F:
    """Carry the current session into another thread or executor.

    Python does not copy context into plain threads or ``run_in_executor``; ``wrap`` captures it now
    and runs each call of ``fn`` in a copy of it.

    Example:
        >>> import concurrent.futures
        >>> with session(task_id="t1") as s:
        ...     with concurrent.futures.ThreadPoolExecutor() as pool:
        ...         got = pool.submit(wrap(current_session)).result()
        >>> got is s
        True
    """
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return ctx.copy().run(fn, *args, **kwargs)

    if ctx.get(_current) is None:
        warn_once("wrap-no-session", "sdk.wrap() was called outside any session; it carries no session")
    return run  # type: ignore[return-value]
