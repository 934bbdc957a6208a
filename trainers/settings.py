"""One settings model: every setting is a dataclass field; one rule turns YAML/CLI values into its type.

A setting is defined once, as a field made with :func:`setting`: its name, type (the annotation), default,
help and check (``check`` and the ``rule`` it states). From those fields come the rest: :func:`check_settings`
(run by each config's ``__post_init__``) coerces every value with :func:`coerce` and runs the checks;
:func:`from_mapping` builds a config from YAML keys and answers an unknown key with "did you mean";
:func:`add_flags` makes the CLI flags and their ``--help``; :func:`settings_table` lists the keys of a YAML
file. The configs made this way: :class:`~trainers.base.TrainerConfig` (and each backend's subclass, e.g.
:class:`~trainers.trl.TRLGRPOConfig`), :class:`~trainers.trl.config.GRPOShortcuts` (the ``trl.GRPOConfig``
fields with a flag of their own), :class:`~trainers.loop.LoopConfig` and :class:`PolicySpec` (the loop's
``policy:`` section).

Where a setting's default differs between contexts, :data:`CONTEXT_DEFAULTS` says so with the reason, and the
configs read their default from it (:func:`context_default`); ``tests/unit/test_settings_model.py`` checks
that every other setting of the same name has the same default and type everywhere.

The values a YAML file or a flag can hold, for each field type: an integer field takes an integer or its
digits (``"4"``), never ``1.5`` or ``true``; a float field takes any number or a numeric string (YAML 1.1
reads ``1e-5`` as a string); a boolean field takes ``true/false/yes/no/on/off/1/0``; a string field a string
(or a path); a mapping or a list as they are; ``null`` only where the type allows ``None``. Anything else is
one :class:`~trainers.errors.UserError`: ``learning_rate must be a float, got 'x'``.

``make_config`` builds a backend's trainer and config from a mapping (the keys of ``tracerl train``'s
``--config`` file: ``backend``, every field of the backend's config dataclass, and for ``trl`` a ``grpo:``
mapping of ``trl.GRPOConfig`` fields). Example ``--config`` file::

    model: ./my-model
    group_size: 8
    grpo: {learning_rate: 1e-5, max_steps: 100, beta: 0}

Example:
    >>> coerce("learning_rate", "1e-5", float)
    1e-05
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from trainers.errors import UserError

if TYPE_CHECKING:
    from trainers.base import Trainer, TrainerConfig

__all__ = [
    "CONTEXT_DEFAULTS",
    "PolicySpec",
    "add_flags",
    "check_settings",
    "coerce",
    "context_default",
    "curriculum_settings",
    "from_mapping",
    "make_config",
    "parse_bool",
    "read_yaml",
    "setting",
    "settings_table",
    "unknown_settings",
]

C = TypeVar("C")

# ------------------------------------------------------------------------------------ context defaults

#: The settings whose default differs between contexts: ``{name: {context: (default, reason)}}``. The
#: contexts: ``trainer`` (``tracerl train`` on recorded episodes, :class:`~trainers.base.TrainerConfig`),
#: ``loop`` (``tracerl train --loop``, :class:`~trainers.loop.LoopConfig`; what it hands its trainer is in
#: :func:`trainers.loop.config.train_settings`), ``rollout`` (``sdk.rollout``'s runner) and ``sft`` (``tracerl
#: sft``'s warm start, :class:`~trainers.sft.SFTSettings`).
CONTEXT_DEFAULTS: dict[str, dict[str, tuple[Any, str]]] = {
    "group_size": {
        "trainer": (4, "recorded episodes: the size they were collected with is used when it is not given "
                    "(group_size_from_data); 4 is the smallest group with a useful advantage estimate"),
        "loop": (8, "the loop samples its own groups: 8 samples per task give most tasks a reward spread "
                 "at small models' success rates (the main job's measured setting)"),
        "rollout": (1, "running an agent over tasks (evaluation) takes one sample per task; training "
                    "asks for a group"),
    },
    "concurrency": {
        "loop": (16, "the loop's samples go to its own policy server, which batches them: 16 at once keep "
                 "it busy"),
        "rollout": (8, "an agent run on its own may call a rate-limited endpoint: fewer at once"),
    },
    "seed": {
        "trainer": (42, "transformers' TrainingArguments default: a run trains as TRL's own examples do"),
        "loop": (0, "the loop's published results (RESULTS.md, examples.main --seed S) count seeds from 0"),
        "sft": (0, "the warm start a loop then starts from counts its seeds as the loop does"),
    },
    "eval_fraction": {
        "trainer": (0.0, "held-out groups cost generation at every eval step; the loop validates on "
                    "held-out tasks instead"),
        "sft": (0.1, "the held-out loss and token accuracy before and after are the warm start's only "
                "report, and scoring them is one forward pass"),
    },
    "group_underflow": {
        "trainer": ("resample", "a recorded store's task with fewer than G episodes still trains a full "
                    "group (episodes drawn again), as TRL's equal-sized groups expect"),
        "loop": ("smaller", "a group that lost a sample (no reward, killed) trains as it is: the loop "
                 "never trains one sample twice to fill it"),
    },
    "tis_cap": {
        "trainer": (None, "recorded episodes replayed at once are near on-policy: clip against the "
                    "behaviour logprobs directly"),
        "loop": (2.0, "mode: async trains groups up to max_staleness versions old: truncated importance "
                 "sampling keeps their weight bounded (read in async mode only)"),
    },
    "curriculum_start": {
        "trainer": (0.25, "counted in groups, widening every few optimizer steps: a quarter is already "
                    "several batches"),
        "loop": (0.5, "each round draws tasks_per_round tasks from the share: half the pool keeps a round's "
                 "tasks varied"),
    },
    "curriculum_expand_every": {
        "trainer": (10, "unit: optimizer steps"),
        "loop": (1, "unit: rounds (a run has a few)"),
    },
}  # fmt: skip


def context_default(name: str, context: str) -> Any:
    """The default of ``name`` in ``context``, from :data:`CONTEXT_DEFAULTS`.

    Example:
        >>> context_default("group_size", "loop")
        8
    """
    return CONTEXT_DEFAULTS[name][context][0]


# ---------------------------------------------------------------------------------------- definition


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    check: Callable[[Any], bool] | None = None,
    rule: str = "",
    factory: Callable[[], Any] | None = None,
    **extra: Any,
) -> Any:
    """A dataclass field defining one setting: default, help and the check its values must pass.

    Args:
        default: The default (omit for a required setting, or give ``factory``).
        help: What the setting does, for ``--help`` and the YAML reference (a sentence, unit included).
        check: A test of a coerced, non-null value; failing it is ``NAME must be RULE, got VALUE``.
        rule: The check in words (``">= 1"``).
        factory: Makes a mutable default (a mapping, a list, a spec).
        extra: More metadata: ``flag`` (extra ``add_argument`` keywords), ``aliases`` (more flag names),
            ``kind`` (:class:`PolicySpec`: the server kind it belongs to).

    Example:
        >>> @dataclasses.dataclass
        ... class S:
        ...     rounds: int = setting(4, help="Rounds.", check=lambda v: v >= 0, rule=">= 0")
        ...     def __post_init__(self):
        ...         check_settings(self)
        >>> S(rounds="2").rounds
        2
        >>> S(rounds=-1)
        Traceback (most recent call last):
        trainers.errors.UserError: rounds must be >= 0, got -1
    """
    metadata = {"help": help, **extra}
    if check is not None:
        metadata["check"] = (check, rule)
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def curriculum_settings(context: str, *, items: str, ranked: str, unit: str) -> tuple[Any, Any, Any, Any]:
    """The four curriculum settings (one definition for the trainer and the loop), as dataclass fields.

    ``curriculum``, ``curriculum_start``, ``curriculum_expand_every``, ``curriculum_expand_by``: easy first,
    then wider. Only their unit and what they draw from differ by context (defaults in
    :data:`CONTEXT_DEFAULTS`).

    Args:
        context: ``"trainer"`` or ``"loop"``.
        items: What the share is of (``"groups"``, ``"training tasks"``).
        ranked: How the easy ones are found, a clause.
        unit: What ``curriculum_expand_every`` counts (``"optimizer steps"``, ``"rounds"``).

    Example:
        >>> @dataclasses.dataclass
        ... class S:
        ...     curriculum: bool
        ...     curriculum_start: float
        ...     curriculum_expand_every: int
        ...     curriculum_expand_by: float
        ...     (curriculum, curriculum_start, curriculum_expand_every, curriculum_expand_by) = (
        ...         curriculum_settings("loop", items="tasks", ranked="by mean reward", unit="rounds"))
        >>> S().curriculum_start
        0.5
    """
    share = {"check": lambda v: 0.0 < v <= 1.0, "rule": "in (0, 1]"}
    return (
        setting(False, help=f"Draw from the easiest share of the {items} ({ranked}), then widen it."),
        setting(
            context_default("curriculum_start", context),
            help=f"Share of the {items} (easiest first) available at the start.",
            **share,
        ),
        setting(
            context_default("curriculum_expand_every", context),
            help=f"Widen the share every N {unit}.",
            check=lambda v: v >= 1,
            rule=">= 1",
        ),
        setting(0.25, help=f"Share of all {items} added at each widening.", **share),
    )


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The resolved type of each field of the dataclass ``cls``.

    Example:
        >>> field_types(PolicySpec)["port"]
        <class 'int'>
    """
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def check_settings(config: Any, *, where: str = "") -> None:
    """Coerce every field of the dataclass ``config`` to its type, then run each field's check.

    Args:
        config: A dataclass instance whose fields were made with :func:`setting` (plain fields are coerced
            only).
        where: Prefix of the names in errors (``"policy."``).

    Raises:
        UserError: The first field whose value has the wrong type or fails its check.

    Example:
        >>> check_settings(PolicySpec(kind="vllm", port="80"))
    """
    for f in dataclasses.fields(config):
        name = where + f.name
        value = coerce(name, getattr(config, f.name), field_types(type(config))[f.name])
        setattr(config, f.name, value)
        check, rule = f.metadata.get("check", (None, ""))
        if check is not None and value is not None and not check(value):
            raise UserError(f"{name} must be {rule}, got {value!r}")


# -------------------------------------------------------------------------------------------- coercion


def parse_bool(value: Any, name: str = "value") -> bool:
    """``true/false/yes/no/on/off/1/0`` (any case) or a bool as a bool.

    Example:
        >>> parse_bool("off"), parse_bool(True)
        (False, True)
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, (str, int)) else ""
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise UserError(f"{name} must be a boolean (true or false), got {value!r}")


_WORDS = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", dict: "a mapping"}
_WORDS.update({list: "a list", Mapping: "a mapping"})


def _word(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(hint)))
    return _WORDS.get(origin or hint, getattr(hint, "__name__", str(hint)))


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` already is of ``hint``'s kind (a union then keeps it as it is)."""
    base = typing.get_origin(hint) or hint
    if base is Literal:
        return value in typing.get_args(hint)
    if base in (int, float) and isinstance(value, bool):
        return False
    if base is float:
        return isinstance(value, (int, float))
    return isinstance(base, type) and isinstance(value, base)


def coerce(name: str, value: Any, hint: Any) -> Any:
    """``value`` as the type ``hint`` (the one rule for YAML, flags and Python values; see the module).

    Types it does not know (a class of a framework's config, ``Any``) take the value as it is.

    Raises:
        UserError: ``NAME must be a float, got 'x'`` (the type in words; unions and ``null`` named).

    Example:
        >>> coerce("rounds", "3", int), coerce("timeout", 5, float | None), coerce("plot", "no", bool)
        (3, 5.0, False)
        >>> coerce("rounds", 1.5, int)
        Traceback (most recent call last):
        trainers.errors.UserError: rounds must be an integer, got 1.5
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(arms) < len(typing.get_args(hint))
        if value is None and optional:
            return None
        for arm in sorted(arms, key=lambda a: not _fits(value, a)):  # an arm it already fits first
            try:
                return coerce(name, value, arm)
            except UserError:
                pass
        words = " or ".join(_word(a) for a in arms) + (" or null" if optional else "")
        raise UserError(f"{name} must be {words}, got {value!r}")
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):  # a spec: built from its YAML mapping
        return value if isinstance(value, hint) else hint.from_mapping(_mapping(name, value))  # type: ignore
    base = origin or hint
    if base is Literal:
        if value in typing.get_args(hint):
            return value
    elif base is bool:
        return parse_bool(value, name)
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return int(value)
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif base is str:
        if isinstance(value, (str, os.PathLike)):
            return os.fspath(value)
    elif base in (dict, Mapping):
        return _mapping(name, value)
    elif base is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, str):  # a flag's "A,B" (a str-or-list keeps its str)
            return [part.strip() for part in value.split(",") if part.strip()]
    else:
        return value
    raise UserError(f"{name} must be {_word(hint)}, got {value!r}")


def _mapping(name: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise UserError(f"{name} must be a mapping, got {value!r}")
    return dict(value)


# -------------------------------------------------------------------------------------- from mappings


def unknown_settings(unknown: Iterable[str], known: Iterable[str], what: str, tail: str = "") -> UserError:
    """The error for keys no setting has, each with its closest known name ("did you mean").

    Example:
        >>> print(unknown_settings(["group_sise"], ["group_size"], "loop setting(s)"))
        unknown loop setting(s): group_sise (did you mean group_size?)
    """
    known = list(known)
    named = [
        f"{key} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(key, known, 1)) else key
        for key in sorted(unknown)
    ]
    return UserError(f"unknown {what}: {', '.join(named)}{tail}")


def from_mapping(cls: type[C], data: Mapping[str, Any], *, unknown: str, tail: str = "") -> C:
    """Build the dataclass ``cls`` from the mapping ``data`` (YAML keys), refusing unknown keys.

    Args:
        cls: A config dataclass (its ``__post_init__`` checks the values).
        data: Its settings.
        unknown: What an unknown key is called in the error (``"policy setting(s)"``).
        tail: Added to the unknown-key error (where the keys are listed).

    Example:
        >>> from_mapping(PolicySpec, {"kind": "vllm", "port": "8000"}, unknown="policy setting(s)").port
        8000
    """
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if set(data) - set(names):
        raise unknown_settings(set(data) - set(names), names, unknown, tail)
    return cls(**data)


def yaml_loader() -> Any:
    """A safe YAML loader where only true/false are booleans and ``1e-3`` is a float.

    YAML 1.1 also reads yes/no/on/off as booleans, which turns ``save_strategy: no`` (a TRL value) into
    ``False``; and it reads ``1e-3`` as a string. Both are fixed here.

    Example:
        >>> import yaml
        >>> yaml.load("{a: 1e-3, b: no}", Loader=yaml_loader())
        {'a': 0.001, 'b': 'no'}
    """
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.yaml_implicit_resolvers = {
        k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
        list("-+0123456789."),
    )
    return Loader


def read_yaml(path: str | os.PathLike[str], what: str = "settings") -> dict[str, Any]:
    """A YAML settings file as a mapping (one :class:`UserError` line when it is missing or not a mapping).

    Example:
        >>> read_yaml("examples/arithmetic/loop.yaml")["agent"]  # doctest: +SKIP
        'examples.arithmetic.agent:solve'
    """
    import yaml

    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"config file not found: {p}")
    try:
        data = yaml.load(p.read_text(), Loader=yaml_loader()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"cannot parse {p}: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{p} must hold a mapping of {what}")
    return data


# ------------------------------------------------------------------------------------------ flags, help


def _base(hint: Any) -> Any:
    arms = [a for a in typing.get_args(hint) if a is not type(None)]
    return arms[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) and arms else hint


def add_flags(
    group_of: Callable[[str], Any],
    cls: type,
    *,
    skip: Iterable[str] = (),
    only: Iterable[str] | None = None,
    dest: str = "{}",
) -> list[str]:
    """Add a ``--flag`` for every scalar setting of ``cls``, its help the field's; returns the names added.

    Flags keep values as typed (no ``type=``): the config's own check coerces them, so a flag and a YAML
    key are refused in the same words. Booleans get ``--x/--no-x``, ``Literal`` types their choices.

    Args:
        group_of: The parser or argument group a setting's flag goes in, by name.
        cls: A config dataclass.
        skip: Settings without a flag.
        only: The settings with a flag (default: all).
        dest: Where parsed values land (``"grpo.{}"``: the ``grpo`` mapping's keys).

    Example:
        >>> import argparse
        >>> p = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
        >>> add_flags(lambda name: p, PolicySpec)[:2]
        ['kind', 'model_name']
        >>> p.parse_args(["--port", "80"])
        Namespace(port='80')
    """
    import argparse

    added, skip, only = [], set(skip), None if only is None else set(only)
    for f in dataclasses.fields(cls):
        hint = field_types(cls)[f.name]
        base = _base(hint)
        if (
            f.name in skip
            or (only is not None and f.name not in only)
            or not (base in (bool, int, float, str) or typing.get_origin(base) is Literal)
        ):
            continue
        names = [*f.metadata.get("aliases", ()), "--" + f.name.replace("_", "-")]
        kw: dict[str, Any] = {"dest": dest.format(f.name), "help": f.metadata.get("help", "")}
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(base) is Literal:
            kw["choices"] = typing.get_args(base)
        else:
            kw["metavar"] = {int: "N", float: "X"}.get(base) or f.name.upper().rsplit("_", 1)[-1]
        group_of(f.name).add_argument(*names, **{**kw, **f.metadata.get("flag", {})})
        added.append(f.name)
    return added


def settings_table(cls: type, title: str, *, where: str = "") -> str:
    """The keys of ``cls`` with their defaults and help, one a line (a YAML file's reference).

    Example:
        >>> print(settings_table(PolicySpec, "policy keys:", where="  ").splitlines()[1][:40])
            kind                     'local'  Wh
    """
    rows = [title]
    for f in dataclasses.fields(cls):
        if f.default is f.default_factory is dataclasses.MISSING:
            default = "(required)"
        else:
            made = _default(f)
            default = "{}" if dataclasses.is_dataclass(made) else repr(made)
        text = re.sub(r":\w+:`~?([^`]+)`", r"\1", f.metadata.get("help", "")).replace("``", "")
        rows.append(f"{where}  {f.name:<20}  {default:>10}  {text}")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------- the policy spec


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _one_of(*choices: str) -> dict[str, Any]:
    return {"check": lambda v: v in choices, "rule": f"{', '.join(choices[:-1])} or {choices[-1]}"}


@dataclasses.dataclass
class PolicySpec:
    """The loop's ``policy:`` section: which server serves the weights agents call, and how.

    Each setting belongs to one ``kind`` (or to all); setting one of another kind is refused.
    :func:`trainers.serve.policy.make_policy` builds the server from it.

    Example:
        >>> PolicySpec.from_mapping({"kind": "external", "base_url": "http://127.0.0.1:8000/v1"}).reload
        'admin'
    """

    kind: str = setting(
        "local",
        help="Which server: local (sdk.serve on this machine), vllm (vllm serve, GPUs) or external (one you "
        "run; the loop only reloads it).",
        **_one_of("local", "vllm", "external"),
    )
    model_name: str = setting("policy", help="The model name agents send (the same for the whole run).")
    subprocess: bool = setting(
        False, kind="local", help="Run python -m sdk.serve as a child process instead of a thread here."
    )
    threads: int | None = setting(
        None, kind="local", help="Torch threads of the subprocess.", check=lambda v: v >= 1, rule=">= 1"
    )
    adapters: dict[str, str] | None = setting(
        None, kind="local", help="LoRA adapters served beside the base: {name: adapter directory}."
    )
    device: str = setting("cpu", kind="local", help="Where the model runs: cpu, cuda or cuda:N.")
    dtype: str = setting(
        "float32", kind="local", help="What checkpoints load as: float32, bfloat16, float16 or auto."
    )
    reload_roots: list[str] = setting(
        factory=list,
        kind="local",
        help="More directories the server may reload checkpoints from (the run's own are allowed).",
    )
    lora: bool = setting(False, kind="vllm", help="Serve LoRA adapters on the base model.")
    max_lora_rank: int = setting(
        16, kind="vllm", help="vLLM's --max-lora-rank (at least the adapters' rank).", check=lambda v: v >= 1,
        rule=">= 1",
    )  # fmt: skip
    max_loras: int = setting(
        2, kind="vllm", help="vLLM's --max-loras: adapters in one batch (2: versions N and N+1 overlap).",
        check=lambda v: v >= 1, rule=">= 1",
    )  # fmt: skip
    port: int = setting(
        0, kind="vllm", help="TCP port agents call, the proxy's (0: a free one).", check=lambda v: v >= 0,
        rule=">= 0",
    )  # fmt: skip
    tool_call_parser: str | None = setting(
        None, kind="vllm", help="vLLM's --tool-call-parser (with --enable-auto-tool-choice), e.g. hermes."
    )
    extra_args: list[str] | str | None = setting(
        None, kind="vllm", help="More vllm serve arguments (a list or one shell-quoted string)."
    )
    executable: list[str] | str = setting("vllm", kind="vllm", help="The vllm command.")
    startup_timeout: float = setting(
        900.0, kind="vllm", help="Seconds to wait for the server's /health.", check=lambda v: v > 0,
        rule="> 0",
    )  # fmt: skip
    weight_transfer: bool = setting(
        False, kind="vllm", help="Push full weights into the running server (NCCL) instead of restarting."
    )
    master_address: str = setting(
        "127.0.0.1", kind="vllm", help="Address of the weight-transfer rendezvous (weight_transfer)."
    )
    base_url: str | None = setting(None, kind="external", help="The server's http://host:port/v1.")
    reload: str = setting(
        "admin",
        kind="external",
        help="How new weights reach it: admin (sdk.serve's /admin/reload), vllm-lora (vLLM's adapter API) "
        "or none.",
        **_one_of("admin", "vllm-lora", "none"),
    )
    admin_token_file: str | None = setting(
        None,
        kind="external",
        help="A file holding the server's admin credential (else $TRACERL_ADMIN_TOKEN); never the token "
        "itself: the loop saves its config in the run directory.",
    )

    def __post_init__(self) -> None:
        check_settings(self, where="policy.")
        for f in dataclasses.fields(self):
            kind = f.metadata.get("kind")
            if kind not in (None, self.kind) and getattr(self, f.name) != _default(f):
                raise UserError(f"policy.{f.name} is a setting of kind {kind}, not {self.kind}")
        if self.kind == "external" and not self.base_url:
            raise UserError("policy kind external needs base_url")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> PolicySpec:
        """The spec of a ``policy:`` mapping (``None``: the defaults).

        Example:
            >>> PolicySpec.from_mapping({"thread": 2})
            Traceback (most recent call last):
            trainers.errors.UserError: unknown policy setting(s): thread (did you mean threads?)
        """
        data = dict(data or {})
        if "admin_token" in data:  # the loop saves its config in the run directory, which agents may read
            raise UserError("policy admin_token: use admin_token_file or $TRACERL_ADMIN_TOKEN")
        return from_mapping(cls, data, unknown="policy setting(s)")

    def kwargs(self) -> dict[str, Any]:
        """The settings of its kind, as keyword arguments of the server class (``kind`` left out).

        Example:
            >>> PolicySpec(kind="vllm").kwargs()["port"]
            0
        """
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "kind" and f.metadata.get("kind") in (None, self.kind)
        }


# ---------------------------------------------------------------------------------------- make_config


def make_config(
    settings: Mapping[str, Any], *, backend: str | None = None, source: str = "the settings"
) -> tuple[Trainer, TrainerConfig, str]:
    """The trainer and its config object for ``settings`` (the keys of a ``--config`` file).

    Args:
        settings: Config fields of the backend (and ``grpo``); a ``backend`` key is used when ``backend``
            is not given.
        backend: Backend name or server URL (default: ``settings["backend"]``, else ``trl``).
        source: Where the settings come from, for error messages (e.g. a file name).

    Returns:
        ``(trainer, config, backend)``: a trainer instance, its config, and the backend as given.

    Raises:
        UserError: Unknown keys, values of the wrong type, or settings the config refuses.

    Example:
        >>> trainer, cfg, _ = make_config({"model": "./tiny", "max_length": "512", "grpo": {"beta": 0}})
        >>> type(cfg).__name__, cfg.max_length, cfg.grpo
        ('TRLGRPOConfig', 512, {'beta': 0})
    """
    from trainers import get_trainer, resolve_backend  # trainers imports trainers.base, which imports this

    values = dict(settings)
    given = backend or values.pop("backend", None) or "trl"
    values.pop("backend", None)
    name, overrides = resolve_backend(str(given))  # http://head:8265 -> ("ray", {address})
    trainer_cls = get_trainer(name)
    config = from_mapping(
        trainer_cls.config_class, {**values, **overrides}, unknown=f"setting(s) in {source}"
    )
    return trainer_cls(), config, str(given)
