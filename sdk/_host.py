"""Questions about this host: is an address its loopback, is a process on it alive (standard library only)."""

from __future__ import annotations

import ipaddress
import os

__all__ = ["is_loopback", "pid_alive"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bare host: no scheme, port or brackets) is reachable from this machine only.

    Example:
        >>> is_loopback("localhost"), is_loopback("::1"), is_loopback("0.0.0.0"), is_loopback("example.com")
        (True, True, False, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host, whoever owns it; an id below 1 names no one process.

    Example:
        >>> pid_alive(os.getpid()), pid_alive(0)
        (True, False)
    """
    if pid < 1:  # kill() would signal a process group, and answer for it
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # exists, owned by someone else
        return True
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond any pid this system has
        return False
    return True
