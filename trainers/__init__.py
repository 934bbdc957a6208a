"""Training backends for tracerl episodes, registered by name in one place.

``TRAINERS`` maps a backend name to an import string ``"module:Class"``; the module is imported only when
the backend is requested, so ``import trainers`` stays free of torch/TRL. It lists the local ``trl``
backend and the remote ones (:mod:`trainers.remote`; a remote backend's class is a
:class:`~trainers.remote.RemoteTrainer`). Add a backend with :func:`register_trainer` (or by editing
``TRAINERS``); :func:`resolve_backend` maps ``--backend`` (a name or a server URL) to a registered name.

Example:
    >>> from trainers import available_trainers, get_trainer
    >>> "trl" in available_trainers()
    True
    >>> get_trainer("trl").__name__
    'TRLGRPOTrainer'
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from trainers.base import Trainer, TrainerConfig, TrainResult
from trainers.data import PreparedData, TrainingSequence
from trainers.errors import UserError

__all__ = [
    "TRAINERS",
    "PreparedData",
    "TrainResult",
    "Trainer",
    "TrainerConfig",
    "TrainingSequence",
    "UserError",
    "available_trainers",
    "get_trainer",
    "register_trainer",
    "resolve_backend",
]

#: Backend name → ``"module:Class"`` (imported lazily by :func:`get_trainer`).
TRAINERS: dict[str, str] = {
    "trl": "trainers.trl:TRLGRPOTrainer",
    # Remote backends (trainers/remote/): `--backend http://head:8265` selects "ray" (resolve_backend).
    "ray": "trainers.remote.ray_jobs:RayTrainer",
    "openai": "trainers.remote.openai_ft:OpenAIFineTuneTrainer",
    "tinker": "trainers.remote.tinker_backend:TinkerTrainer",
}


def register_trainer(name: str, target: str, *, replace: bool = False) -> None:
    """Register a backend under ``name``.

    Args:
        name: Backend name used by ``--backend``.
        target: Import string ``"package.module:ClassName"``; the class must satisfy :class:`Trainer`.
        replace: Allow overwriting an existing name.

    Raises:
        ValueError: ``name`` exists and ``replace`` is false, or ``target`` is not ``"module:Class"``.

    Example:
        >>> register_trainer("my-remote", "my_pkg.remote:RemoteTrainer")
        >>> "my-remote" in available_trainers()
        True
        >>> del TRAINERS["my-remote"]
    """
    if ":" not in target:
        raise ValueError(f"target must be 'module:Class', got {target!r}")
    if name in TRAINERS and not replace and TRAINERS[name] != target:
        raise ValueError(f"trainer {name!r} is already registered as {TRAINERS[name]!r}")
    TRAINERS[name] = target


def available_trainers() -> list[str]:
    """Names of the registered backends, sorted.

    Example:
        >>> available_trainers()
        ['openai', 'ray', 'tinker', 'trl']
    """
    return sorted(TRAINERS)


def get_trainer(name: str) -> type[Trainer]:
    """Import and return the trainer class registered as ``name``.

    Raises:
        UserError: Unknown name, or the backend's dependencies are not installed.

    Example:
        >>> get_trainer("trl").name
        'trl'
    """
    try:
        target = TRAINERS[name]
    except KeyError:
        raise UserError(f"unknown backend {name!r}; available: {', '.join(available_trainers())}") from None
    module_name, _, attr = target.partition(":")
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise UserError(
            f"backend {name!r} cannot be imported ({exc}); install it with: pip install 'tracerl[train]'"
        ) from exc
    return getattr(module, attr)  # type: ignore[no-any-return]


def resolve_backend(name_or_url: str) -> tuple[str, dict[str, Any]]:
    """Map ``--backend`` to a registered backend name plus config overrides.

    ``http://host:port`` / ``https://...`` select the ``ray`` backend with ``address`` set to the URL (a Ray
    dashboard, whose Jobs API the backend uses); any other value is a backend name and passes through
    (:func:`get_trainer` checks it).

    Example:
        >>> resolve_backend("http://head:8265/")
        ('ray', {'address': 'http://head:8265'})
        >>> resolve_backend("tinker")
        ('tinker', {})
    """
    value = name_or_url.strip()
    if value.startswith(("http://", "https://")):
        return "ray", {"address": value.rstrip("/")}
    return value, {}
