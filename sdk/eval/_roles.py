"""Per-role figures of an evaluation: each agent's own reward, from the store the samples were recorded in.

A role is an agent name recorded on a session's calls (``wrap_openai(agent=...)``, a LangGraph node, a
LlamaIndex or Strands agent, the gateway's ``X-Tracerl-Agent``). A role's reward in a sample is credited as
in training (:func:`sdk.episodes.role_reward`): the session reward named after the role, else the session
reward ``reward``, else the per-call rewards of the role's own calls, summed.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

__all__ = ["role_figures"]


def _session_credit(session: Any) -> dict[str, float]:
    """``{role: reward}`` for one stored session (roles without any reward are left out)."""
    named: dict[str, float] = {}
    per_call: dict[str, float] = {}
    for r in session.rewards:  # in the order given: the last session-level value of a name wins
        if r.get("call_id") is None:
            named[str(r.get("name"))] = float(r["value"])
        else:
            per_call[str(r["call_id"])] = per_call.get(str(r["call_id"]), 0.0) + float(r["value"])
    out: dict[str, float] = {}
    roles: dict[str, list[str]] = defaultdict(list)
    for c in session.calls:
        if c.get("agent"):
            roles[str(c["agent"])].append(str(c.get("call_id")))
    for role, ids in roles.items():
        if role in named:
            out[role] = named[role]
        elif "reward" in named:
            out[role] = named["reward"]
        elif any(i in per_call for i in ids):
            out[role] = sum(per_call.get(i, 0.0) for i in ids)
    return out


def role_figures(sessions: list[Any]) -> dict[str, dict[str, float | int | None]]:
    """Per role: ``{"samples", "mean_reward", "mean_reward_se"}`` over the sessions where it ran.

    Args:
        sessions: Stored sessions (``sdk.store.StoredSession``) of the evaluated samples.

    Returns:
        One entry per role, in name order; ``{}`` when no call names an agent.

    Example:
        >>> from sdk.store import StoredSession
        >>> s = StoredSession("s1", calls=[{"agent": "router", "call_id": "c1"}],
        ...                   rewards=[{"name": "router", "value": 1.0, "call_id": None}])
        >>> role_figures([s])["router"]["mean_reward"]
        1.0
    """
    values: dict[str, list[float]] = defaultdict(list)
    for s in sessions:
        for role, v in _session_credit(s).items():
            values[role].append(v)
    out: dict[str, dict[str, float | int | None]] = {}
    for role in sorted(values):
        v = values[role]
        se = statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else None
        out[role] = {"samples": len(v), "mean_reward": statistics.fmean(v), "mean_reward_se": se}
    return out
