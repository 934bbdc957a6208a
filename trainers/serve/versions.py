"""The policy server's versions: they only move forward, and ``@v<N>`` names one.

Each set of served weights (the base, each LoRA adapter) has a ``policy_version``. A reload or push sets it
to the version it names, or to the current one + 1 when it names none; naming a lower version than the
current one is refused (:class:`StaleVersion`, HTTP 409) and changes nothing. The same version again is
accepted (a loop re-publishing a version after a restart or a retried request). New base weights (a base
reload or a base push) move every adapter's version up by one, since what an adapter serves is base +
adapter.

A served name never ends in ``@v<N>``: that suffix names a version (a request's ``model`` may carry it; the
loop serves version N as ``name@vN`` where a server has no versions of its own, vLLM).

Example:
    >>> next_version("base", 3, None), next_version("base", 3, 5)
    (4, 5)
    >>> next_version("base", 3, 2)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    trainers.serve.versions.StaleVersion: 'base' is served as version 3; version 2 would go back
"""

from __future__ import annotations

import re

__all__ = ["StaleVersion", "check_name", "next_version", "unversioned"]

_SUFFIX = re.compile(r"@v\d+$")


class StaleVersion(ValueError):
    """A reload or push names a version lower than the one the weights are served as (HTTP 409).

    Example:
        >>> isinstance(StaleVersion("version 2 would go back"), ValueError)
        True
    """


def next_version(name: str, current: int, requested: int | None) -> int:
    """The version new weights for ``name`` (served as ``current``) get: ``requested``, never lower.

    Example:
        >>> next_version("router", 0, None)
        1
    """
    if requested is None:
        return current + 1
    if int(requested) < current:
        raise StaleVersion(
            f"{name!r} is served as version {current}; version {requested} would go back "
            "(versions only move forward)"
        )
    return int(requested)


def unversioned(model: str) -> str:
    """A request's ``model`` without its ``@v<N>`` suffix: the served name it routes to.

    Example:
        >>> unversioned("router@v3"), unversioned("router")
        ('router', 'router')
    """
    return _SUFFIX.sub("", model)


def check_name(name: str) -> str:
    """``name``, when it may name served weights (a ``ValueError`` when it ends in ``@v<N>``).

    Example:
        >>> check_name("router@v2")
        Traceback (most recent call last):
        ValueError: the name 'router@v2' must not end in @v<N> (that suffix names a version)
    """
    if _SUFFIX.search(name):
        raise ValueError(f"the name {name!r} must not end in @v<N> (that suffix names a version)")
    return name
