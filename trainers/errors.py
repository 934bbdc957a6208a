"""The errors of the trainers, in one place.

Every error here is a :class:`UserError`: a problem with the user's input, configuration, credentials or a
remote service, not a bug. The training CLI (``python -m sdk.train``) prints it as one ``error: ...`` line
on stderr and exits with code 2; the training server answers 422 with it.

Example:
    >>> from trainers.errors import AuthError, UserError
    >>> issubclass(AuthError, UserError)
    True
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "AuthError",
    "InvalidDataError",
    "RateLimitError",
    "RemoteError",
    "TransientError",
    "UserError",
]


class UserError(Exception):
    """A problem with the user's input or configuration (not a bug): reported in one line, exit code 2.

    Example:
        >>> raise UserError("data path not found: x.parquet")
        Traceback (most recent call last):
        ...
        trainers.errors.UserError: data path not found: x.parquet
    """


class InvalidDataError(UserError):
    """The episodes cannot be sent: rejected before upload, with one reason per problem kind.

    Example:
        >>> err = InvalidDataError("2 of 8 episodes are invalid", ["missing_reward: 2 (e.g. ep-1)"])
        >>> str(err)
        '2 of 8 episodes are invalid: missing_reward: 2 (e.g. ep-1)'
    """

    def __init__(self, summary: str, reasons: Iterable[str] = ()) -> None:
        self.reasons = list(reasons)
        super().__init__(summary + (": " + "; ".join(self.reasons) if self.reasons else ""))


class RemoteError(UserError):
    """A remote service refused or failed a request (reported in one line, exit code 2).

    Example:
        >>> str(RemoteError("job job-1 failed: out of memory"))
        'job job-1 failed: out of memory'
    """


class AuthError(RemoteError):
    """Authentication failed (missing, wrong or expired key/token); never retried.

    Example:
        >>> isinstance(AuthError("401"), RemoteError)
        True
    """


class TransientError(RemoteError):
    """A failure worth retrying: connection refused/reset, timeouts, HTTP 5xx.

    Example:
        >>> TransientError("HTTP 503").retry_after is None
        True
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class RateLimitError(TransientError):
    """HTTP 429: retried with backoff, honouring ``Retry-After`` when the service sends it.

    Example:
        >>> RateLimitError("slow down", retry_after=2.0).retry_after
        2.0
    """
