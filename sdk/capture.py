"""What an integration needs: the recording path, one install scheme, and the OpenAI-format helpers.

- **Recording.** Build a :class:`CallRecord`, hand it to :func:`record_call`. Resolve the owning session
  when the call *starts* (:func:`capture_target`) and pass it to :func:`record_call` when it ends:
  framework callbacks may fire in another context than the call.
- **Joining.** When a recording transport may see the same call, open a link as the call starts
  (:func:`open_call_link`, in the context the call sends its requests from), put it on the record and
  close it when the call ends: the two records become one call, joined by the request's identity.
- **Installing.** An :class:`Integration` says how to hook into its framework (``setup_once``) and how
  to let go (``teardown``); ``install()`` / ``uninstall()`` run them once, under one lock.
- **Firewall.** Every framework hook is decorated with :func:`firewall`: a tracerl failure inside it
  is counted and reported once, and the user's call proceeds.
- **OpenAI format.** What every integration converts its framework's objects into:
  :func:`openai_logprobs`, :func:`openai_usage`, :func:`tool_call` / :func:`json_arguments` and
  :func:`call_error`.
- **Secrets.** :func:`record_call` stores no credential: every record's params, extra and error message
  go through :func:`redact` when written (keys named like ``api_key``, ``authorization``, ``*_token``,
  ``password``, ``secret``... at any depth; URL passwords and secret query values), and header maps and
  clients passed as params are dropped. Integrations need not filter themselves.

Example:
    >>> from sdk import session
    >>> from sdk.capture import CallRecord, capture_target, record_call
    >>> with session(task_id="t1"):
    ...     target = capture_target()
    ...     record_call(CallRecord(framework="custom", messages=[{"role": "user", "content": "hi"}],
    ...                            response_message={"role": "assistant", "content": "hello"}), target)
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, TypeVar

from sdk import _link
from sdk._internal import MissingDependency, capture_internal_exceptions, count, logger, warn_once
from sdk._records import CallRecord, new_id
from sdk._redact import is_secret_name, redact
from sdk._session import Session, current_session
from sdk._tracer import tracer

__all__ = [
    "MAX_ERROR_MESSAGE",
    "CallRecord",
    "Integration",
    "MissingDependency",
    "Session",
    "call_error",
    "capture_internal_exceptions",
    "capture_target",
    "count",
    "current_session",
    "firewall",
    "is_secret_name",
    "json_arguments",
    "logger",
    "new_id",
    "open_call_link",
    "openai_logprobs",
    "openai_usage",
    "record_call",
    "redact",
    "start_attempt",
    "tool_call",
    "track_open_call",
    "warn_once",
]

_Hook = TypeVar("_Hook", bound=Callable[..., Any])


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------


def capture_target() -> Session | None:
    """The session a call starting now belongs to: the current one, else the process's implicit one.

    ``None`` when capture is disabled or implicit sessions are off and no session is active.

    Example:
        >>> from sdk import session
        >>> with session(task_id="t1") as s:
        ...     capture_target() is s
        True
    """
    with capture_internal_exceptions("capture_target"):
        return tracer.capture_target()
    return None


def record_call(record: CallRecord, session: Session | None = None) -> None:
    """Persist one call in ``session`` (default: the current or implicit one). Never raises.

    The call is in the OS page cache when this returns.

    Example:
        >>> record_call(CallRecord(framework="custom", messages=[{"role": "user", "content": "hi"}]))
    """
    tracer.record_call(record, session)


def track_open_call(session: Session | None, finish: Callable[[str], None]) -> Callable[[], None]:
    """Have ``finish(reason)`` called if ``session`` ends, or the SDK shuts down, while a call is still open.

    For calls whose response the agent may stop reading without closing it (a ``break`` out of a stream):
    ``finish`` records the call with what was read, in its own session and before that session's end, so
    it is never lost nor written after the session ended. Call the returned function when the call
    finishes normally. ``finish`` runs at most once, and never if untracked first.

    Example:
        >>> from sdk import session
        >>> with session(task_id="t1") as s:
        ...     untrack = track_open_call(s, lambda reason: print("recorded:", reason))
        recorded: its session ended
    """
    return tracer.track_open_call(session, finish)


def open_call_link() -> _link.CallLink:
    """From a framework hook, when its model call starts: join the transport's records of it by identity.

    Opens a link in the current context (the one the call's HTTP requests are sent from); a recording
    transport adds each request it sends there to it. Put the link on the hook's record
    (``CallRecord(link=...)``) and ``close()`` it when the call ends: the record is then joined to one of
    those requests (the latest with the same content, else the latest), never to a request another
    sub-agent sent at the same moment. Calls that opened no link fall back to joining by content.

    Example:
        >>> link = open_call_link()
        >>> record = CallRecord(framework="custom", messages=[{"role": "user", "content": "hi"}], link=link)
        >>> link.close()
    """
    return _link.open_link()


def start_attempt(call_id: str) -> _link.Attempt | None:
    """From a recording transport, when it sends a request: add it to the framework calls open here.

    Returns the attempt to put on the transport's record (``record.attempt``, with ``record.call_id``
    set to ``call_id``), or ``None`` when no framework call is open in this context.

    Example:
        >>> start_attempt(new_id()) is None  # no framework call open here
        True
    """
    return _link.start_attempt(call_id)


# ---------------------------------------------------------------------------------------------
# Installing, and the firewall around hooks
# ---------------------------------------------------------------------------------------------

# One lock and one registry for every integration, as in sentry-python's ``setup_integrations``; with
# each installed integration, the undos of the patches its setup made.
_install_lock = threading.RLock()
_installed: dict[str, list[Callable[[], None]]] = {}


class Integration:
    """One framework integration, hooked into its framework at most once per process at a time.

    A subclass names itself (``identifier``) and says how to hook in (``setup_once``: register a
    handler, or patch a class with :meth:`patch_init`) and how to let go of what is not a patch
    (``teardown``). :meth:`install` and :meth:`uninstall` are idempotent and run under one lock shared
    by all integrations, so installing twice, or from two threads at once, hooks in once. The model is
    sentry-python's ``Integration.setup_once``, with an undo added.

    Example:
        >>> class Custom(Integration):
        ...     identifier = "custom"
        ...     @classmethod
        ...     def setup_once(cls) -> None:
        ...         print("hooked in")
        ...     @classmethod
        ...     def teardown(cls) -> None:
        ...         print("let go")
        >>> Custom.install(); Custom.install(); Custom.uninstall(); Custom.uninstall()
        hooked in
        let go
    """

    identifier: ClassVar[str]
    lock: ClassVar[threading.RLock] = _install_lock
    """Held while any integration installs or uninstalls; hold it to change settings atomically."""

    @classmethod
    def setup_once(cls) -> None:
        """Hook into the framework. Runs under :attr:`lock`, never twice without an uninstall between."""
        raise NotImplementedError

    @classmethod
    def teardown(cls) -> None:
        """Undo what :meth:`setup_once` did besides :meth:`patch_init` (whose patches undo themselves)."""

    @classmethod
    def install(cls) -> None:
        """Hook into the framework, unless this integration is installed already.

        Example:
            >>> MyIntegration.install()  # doctest: +SKIP
        """
        with cls.lock:
            if cls.identifier in _installed:
                return
            _installed[cls.identifier] = []
            try:
                cls.setup_once()
            except BaseException:
                cls._undo_patches()
                raise

    @classmethod
    def uninstall(cls) -> None:
        """Let go of the framework, if this integration is installed.

        Example:
            >>> MyIntegration.uninstall()  # doctest: +SKIP
        """
        with cls.lock:
            if cls.identifier in _installed:
                cls.teardown()
                cls._undo_patches()

    @classmethod
    def installed(cls) -> bool:
        """Whether this integration is installed.

        Example:
            >>> MyIntegration.installed()  # doctest: +SKIP
            False
        """
        return cls.identifier in _installed

    @classmethod
    def patch_init(cls, target: type, after: Callable[[Any], None]) -> None:
        """From :meth:`setup_once`: make every ``target(...)`` call ``after(instance)`` once it is built.

        For frameworks with no process-wide hook: patch the class whose instances the integration must
        equip. :meth:`uninstall` restores the original ``__init__``. ``after`` runs on the user's call
        path: decorate it with :func:`firewall`.

        Args:
            target: The class to patch (``target.__init__`` is replaced).
            after: Called with each new instance, after the original ``__init__`` returned.

        Example:
            >>> class Client:
            ...     pass
            >>> class ClientIntegration(Integration):
            ...     identifier = "client"
            ...     @classmethod
            ...     def setup_once(cls) -> None:
            ...         cls.patch_init(Client, lambda client: print("equipped"))
            >>> ClientIntegration.install(); _ = Client()
            equipped
            >>> ClientIntegration.uninstall(); _ = Client()
        """
        original = target.__init__

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            original(self, *args, **kwargs)
            after(self)

        def restore() -> None:
            target.__init__ = original  # type: ignore[misc]

        target.__init__ = __init__  # type: ignore[misc]
        _installed[cls.identifier].append(restore)

    @classmethod
    def _undo_patches(cls) -> None:
        for restore in reversed(_installed.pop(cls.identifier, [])):
            restore()


def firewall(where: str) -> Callable[[_Hook], _Hook]:
    """Run a framework hook behind the internal-error firewall: its failures never reach the agent.

    An exception inside the hook is counted in ``sdk.stats()["internal_errors"]``, reported once per
    ``where``, and the hook returns ``None``. Call the user's own code outside a firewalled hook, so that
    its exceptions pass untouched. A plain ``try`` costs nothing until it raises, so this is cheap
    enough for hooks that run on every streamed token.

    Args:
        where: Names the hook in the report, e.g. ``"langchain.on_llm_end"``.

    Example:
        >>> @firewall("custom.on_end")
        ... def on_end(event: dict) -> None:
        ...     record_call(CallRecord(framework="custom", messages=event["messages"]))
        >>> on_end({})  # a KeyError inside: counted, reported once, not raised (outside tests)
    """

    def decorate(hook: _Hook) -> _Hook:
        @functools.wraps(hook)
        def firewalled(*args: Any, **kwargs: Any) -> Any:
            try:
                return hook(*args, **kwargs)
            except Exception as exc:
                with capture_internal_exceptions(where):
                    raise exc
                return None

        return firewalled  # type: ignore[return-value]

    return decorate


# ---------------------------------------------------------------------------------------------
# The OpenAI format every integration converts into
# ---------------------------------------------------------------------------------------------

MAX_ERROR_MESSAGE = 2000
"""Characters of an error message kept in a record."""


def _field(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


def openai_logprobs(content: Iterable[Any] | None) -> list[dict[str, Any]] | None:
    """Token logprobs in the shape of OpenAI's ``choices[0].logprobs.content``, and nothing else.

    Each entry keeps ``token``, ``logprob`` and, when present, ``top_logprobs`` (each ``token`` and
    ``logprob``); other fields (``bytes``) are dropped. Entries may be dicts or objects (the openai
    client's models). ``None`` stays ``None``.

    Example:
        >>> openai_logprobs([{"token": "4", "logprob": -0.1, "bytes": [52],
        ...                   "top_logprobs": [{"token": "4", "logprob": -0.1, "bytes": [52]}]}])
        [{'token': '4', 'logprob': -0.1, 'top_logprobs': [{'token': '4', 'logprob': -0.1}]}]
    """
    if content is None:
        return None
    out = []
    for entry in content:
        item = {"token": _field(entry, "token"), "logprob": _field(entry, "logprob")}
        top = _field(entry, "top_logprobs")
        if top:
            item["top_logprobs"] = [
                {"token": _field(t, "token"), "logprob": _field(t, "logprob")} for t in top
            ]
        out.append(item)
    return out


def openai_usage(
    prompt_tokens: Any,
    completion_tokens: Any,
    total_tokens: Any,
    *,
    cached_tokens: Any = None,
    cache_write_tokens: Any = None,
    reasoning_tokens: Any = None,
) -> dict[str, Any]:
    """Token usage under OpenAI chat-completions names, from any framework's counts.

    The details (``prompt_tokens_details``, ``completion_tokens_details``) appear only for the counts
    given.

    Example:
        >>> openai_usage(10, 2, 12, cached_tokens=8)["prompt_tokens_details"]
        {'cached_tokens': 8}
    """
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": total_tokens,
    }
    prompt_details = {}
    if cached_tokens is not None:
        prompt_details["cached_tokens"] = cached_tokens
    if cache_write_tokens is not None:
        prompt_details["cache_write_tokens"] = cache_write_tokens
    if prompt_details:
        usage["prompt_tokens_details"] = prompt_details
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage


def tool_call(call_id: Any, name: Any, arguments: str) -> dict[str, Any]:
    """One entry of an assistant message's ``tool_calls``, with the arguments as a JSON string.

    Example:
        >>> tool_call("c1", "add", json_arguments({"a": 1}))
        {'id': 'c1', 'type': 'function', 'function': {'name': 'add', 'arguments': '{"a": 1}'}}
    """
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def json_arguments(args: Any, *, ensure_ascii: bool = True) -> str:
    """Tool-call arguments as the string the wire carries: a string as it is, else JSON (``None``: ``{}``).

    Pass the ``ensure_ascii`` the framework's own client serialises with, so the two views of a call match.

    Example:
        >>> json_arguments({"city": "Zürich"}, ensure_ascii=False), json_arguments(None)
        ('{"city": "Zürich"}', '{}')
    """
    if isinstance(args, str):
        return args
    return json.dumps(args if args is not None else {}, ensure_ascii=ensure_ascii)


def call_error(exc: BaseException, *, status: int | None = None, code: Any = None) -> dict[str, Any]:
    """A record's ``error`` for a call that raised ``exc``: its type, message, HTTP status and code.

    ``code`` (the server's error code) appears only when given.

    Example:
        >>> call_error(TimeoutError("read timed out"), status=504)
        {'type': 'TimeoutError', 'message': 'read timed out', 'status': 504}
    """
    error: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc)[:MAX_ERROR_MESSAGE],
        "status": status,
    }
    if code is not None:
        error["code"] = code
    return error
