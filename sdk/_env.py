"""The name of every environment variable tracerl reads or sets, in one place.

The modules that read a variable import its name from here (``tests/unit/test_cli.py`` checks that no
other module under ``sdk``, ``trainers`` or ``integrations`` spells one out). The defaults and the parsing
stay with the code that reads the variable, documented there; this module only names them. It imports
nothing, so any module may use it, the store included.

Example:
    >>> from sdk import _env
    >>> _env.TRACERL_STORE
    'TRACERL_STORE'
    >>> _env.TRACERL_POLICY_BASE_URL.startswith(_env.PREFIX)
    True
"""

from __future__ import annotations

__all__ = [
    "PREFIX",
    "TRACERL_ADMIN_TOKEN",
    "TRACERL_DISABLED",
    "TRACERL_FSYNC",
    "TRACERL_GATEWAY_CONFIG",
    "TRACERL_GATEWAY_CONTROL_TOKEN",
    "TRACERL_GATEWAY_TOKEN",
    "TRACERL_IMPLICIT_SESSIONS",
    "TRACERL_POLICY_BASE_URL",
    "TRACERL_POLICY_MODEL",
    "TRACERL_RAISE_INTERNAL",
    "TRACERL_SHIP_INTERVAL",
    "TRACERL_SPOOL",
    "TRACERL_STORE",
    "TRAINER_ONLY",
]

PREFIX = "TRACERL_"
"""What every tracerl variable starts with (rollout passes the ``TRACERL_*`` variables on to Ray tasks)."""

# Capture (sdk._config.Config.from_env).
TRACERL_STORE = "TRACERL_STORE"
"""Store directory (default ``./.tracerl``) or object-store URI (``s3://bucket/prefix``)."""
TRACERL_SHIP_INTERVAL = "TRACERL_SHIP_INTERVAL"
"""Seconds between uploads of the growing segment to an object-store store (default 5)."""
TRACERL_FSYNC = "TRACERL_FSYNC"
"""fsync policy: ``never`` (default), ``interval`` or ``always``."""
TRACERL_IMPLICIT_SESSIONS = "TRACERL_IMPLICIT_SESSIONS"
"""What happens to calls outside any session: ``process`` (default) or ``off``."""
TRACERL_DISABLED = "TRACERL_DISABLED"
"""Set to 1 to turn capture off entirely."""
TRACERL_RAISE_INTERNAL = "TRACERL_RAISE_INTERNAL"
"""Set to 1 to re-raise SDK-internal errors instead of counting them (tests set it)."""

# Stores on object storage (sdk.store._remote).
TRACERL_SPOOL = "TRACERL_SPOOL"
"""Directory under which local segments of object-store stores are kept (default ``~/.cache/tracerl``)."""

# The gateway (sdk.gateway): how its command line hands the configuration to worker processes.
TRACERL_GATEWAY_CONFIG = "TRACERL_GATEWAY_CONFIG"
"""JSON of the gateway's ``GatewayConfig``, set by ``python -m sdk.gateway`` for its workers."""
TRACERL_GATEWAY_TOKEN = "TRACERL_GATEWAY_TOKEN"
"""The gateway token every route then needs (``X-Tracerl-Gateway-Token`` or a ``/token/<token>/`` prefix)."""
TRACERL_GATEWAY_CONTROL_TOKEN = "TRACERL_GATEWAY_CONTROL_TOKEN"
"""The token the gateway's reward and end routes then need (``X-Tracerl-Control-Token``); not an agent's."""

# The policy an agent calls during the loop (trainers.serve.policy.export_env sets both).
TRACERL_POLICY_BASE_URL = "TRACERL_POLICY_BASE_URL"
"""The policy's OpenAI base URL (``http://127.0.0.1:PORT/v1``)."""
TRACERL_POLICY_MODEL = "TRACERL_POLICY_MODEL"
"""The model name agents send (a LoRA adapter's name under vLLM)."""

# The policy server's admin credential (trainers.serve.app): the trainer's alone, never an agent's.
TRACERL_ADMIN_TOKEN = "TRACERL_ADMIN_TOKEN"
"""The credential ``sdk.serve``'s ``/admin/weights`` and ``/admin/reload`` need (a ``Bearer`` token)."""

TRAINER_ONLY = (TRACERL_ADMIN_TOKEN, TRACERL_GATEWAY_CONTROL_TOKEN)
"""Variables never passed on to agents (rollout's Ray tasks get the other ``TRACERL_*`` ones)."""
