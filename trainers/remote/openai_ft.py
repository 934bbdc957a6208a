"""The ``openai`` backend: OpenAI fine-tuning jobs on the best recorded episodes.

Two methods, both built from task groups (episodes sharing a ``task_id``, as for GRPO):

- ``sft`` (filtered behaviour cloning): the ``top_k`` highest-reward episodes of every group (at least
  ``min_reward`` when set) become supervised examples, one JSONL line each:
  ``{"messages": [...], "tools": [...]}`` in the chat format of the fine-tuning docs (assistant
  ``tool_calls`` with JSON-string ``arguments``, ``tool`` messages with ``tool_call_id``).
- ``dpo`` (preference pairs): the best and worst episode of every group with a reward gap above
  ``min_reward_margin``. OpenAI's DPO takes one shared input and one assistant message per side, so the
  pair is cut where the two conversations first differ: ``{"input": {"messages": common prefix, "tools":
  [...]}, "preferred_output": [best's next assistant message], "non_preferred_output": [worst's]}``.
  Pairs that do not diverge at an assistant message (e.g. different tool results) are skipped and counted.

The JSONL is written to ``OUTPUT_DIR/train.jsonl``, uploaded (``purpose="fine-tune"``), a job is created,
``job.json`` is written, and the job is followed (status, events, ``metrics`` events into
``metrics.jsonl``) until it ends; the fine-tuned model id is recorded in ``job.json`` and
``result.json``. The API key comes from the environment variable ``api_key_env`` (default
``OPENAI_API_KEY``) only; ``base_url`` (or ``OPENAI_BASE_URL``) selects another endpoint (Azure OpenAI,
a proxy, or a loopback test server).

Example:
    >>> from trainers.remote.openai_ft import OpenAIFineTuneConfig, OpenAIFineTuneTrainer
    >>> cfg = OpenAIFineTuneConfig(model="gpt-4.1-mini-2025-04-14", method="sft", output_dir="runs/ft")
    >>> result = OpenAIFineTuneTrainer().train("episodes.parquet", cfg)  # doctest: +SKIP
    >>> result.metrics["fine_tuned_model"]  # doctest: +SKIP
    'ft:gpt-4.1-mini-2025-04-14:org::abc123'
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from trainers.base import TrainerConfig, TrainResult
from trainers.data import (
    ConvertedEpisode,
    DataReport,
    Group,
    PreparedData,
    episodes_by_task,
    load_episodes,
    parse_tools,
)
from trainers.errors import (
    AuthError,
    InvalidDataError,
    RateLimitError,
    RemoteError,
    TransientError,
    UserError,
)
from trainers.remote import (
    RemoteConfig,
    RemoteJob,
    RemoteTrainer,
    episodes_to_send,
    progress,
    with_retries,
)

__all__ = [
    "OpenAIFineTuneConfig",
    "OpenAIFineTuneTrainer",
    "build_dpo_pairs",
    "build_sft_examples",
    "openai_messages",
]

T = TypeVar("T")
_MESSAGE_KEYS = {
    "system": ("content",),
    "user": ("content",),
    "assistant": ("content", "tool_calls"),
    "tool": ("content", "tool_call_id"),
}


@dataclass
class OpenAIFineTuneConfig(RemoteConfig):
    """Configuration of the ``openai`` backend.

    Parameters that select the data:
        method: ``sft`` (top episodes per group) or ``dpo`` (best-vs-worst pair per group).
        top_k: SFT: episodes taken from each group, highest reward first.
        min_reward: SFT: only episodes with at least this reward (``None``: no threshold).
        min_reward_margin: DPO: the best reward must exceed the worst by more than this.
        min_examples: refuse to upload fewer examples (OpenAI requires 10).

    Parameters of the job:
        model: the base model to fine-tune (e.g. ``gpt-4.1-mini-2025-04-14``), inherited field.
        n_epochs, batch_size, learning_rate_multiplier: hyperparameters (``None``: the API's ``auto``).
        beta: DPO: weight of the penalty between the policy and the reference model.
        suffix: up to 64 characters added to the fine-tuned model name.
        base_url: API base URL (default: ``$OPENAI_BASE_URL`` or ``https://api.openai.com/v1``).
        api_key_env: environment variable holding the API key.
        request_timeout: seconds before one request times out.

    Example:
        >>> OpenAIFineTuneConfig(model="gpt-4.1-mini-2025-04-14", method="dpo", beta=0.1).method
        'dpo'
    """

    method: Literal["sft", "dpo"] = field(
        default="sft",
        metadata={"help": "sft: top episodes per task group; dpo: best-vs-worst pair per task group."},
    )
    top_k: int = field(default=1, metadata={"help": "SFT: episodes per group, highest reward first."})
    min_reward: float | None = field(
        default=None, metadata={"help": "SFT: keep only episodes with at least this reward."}
    )
    min_reward_margin: float = field(
        default=0.0, metadata={"help": "DPO: best reward must exceed worst reward by more than this."}
    )
    min_examples: int = field(
        default=10, metadata={"help": "Refuse to upload fewer training examples (OpenAI's minimum is 10)."}
    )
    n_epochs: int | None = field(default=None, metadata={"help": "Epochs (default: the API's auto)."})
    batch_size: int | None = field(default=None, metadata={"help": "Batch size (default: auto)."})
    learning_rate_multiplier: float | None = field(
        default=None, metadata={"help": "Learning-rate multiplier (default: auto)."}
    )
    beta: float | None = field(default=None, metadata={"help": "DPO beta (default: auto)."})
    suffix: str | None = field(default=None, metadata={"help": "Suffix for the fine-tuned model name."})
    base_url: str | None = field(
        default=None, metadata={"help": "API base URL (default: $OPENAI_BASE_URL or api.openai.com)."}
    )
    api_key_env: str = field(
        default="OPENAI_API_KEY", metadata={"help": "Environment variable holding the API key."}
    )
    request_timeout: float = field(default=120.0, metadata={"help": "Seconds before a request times out."})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.method not in ("sft", "dpo"):
            raise UserError(f"method must be sft or dpo, got {self.method!r}")
        if self.top_k < 1:
            raise UserError(f"top_k must be at least 1, got {self.top_k}")


# ------------------------------------------------------------------------------------------ data building


def openai_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Episode messages → the fine-tuning chat format (no ``None`` fields, JSON-string tool arguments).

    Example:
        >>> openai_messages([{"role": "user", "content": "hi", "tool_calls": None},
        ...                  {"role": "assistant", "content": None, "tool_calls": [{"id": "c1",
        ...                   "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}])
        [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'tool_calls': [{'id': 'c1', 'type': 'function', 'function': {'name': 'f', 'arguments': '{"x": 1}'}}]}]
    """  # noqa: E501
    out: list[dict[str, Any]] = []
    for m in messages:
        role = str(m.get("role"))
        msg: dict[str, Any] = {"role": role}
        for key in _MESSAGE_KEYS.get(role, ("content",)):
            value = m.get(key)
            if value is None:
                continue
            if key == "tool_calls":
                if not value:
                    continue
                value = [
                    {
                        "id": c.get("id"),
                        "type": c.get("type") or "function",
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": a
                            if isinstance(a := c["function"].get("arguments"), str)
                            else json.dumps(a if a is not None else {}),
                        },
                    }
                    for c in value
                ]
            msg[key] = value
        if role != "assistant" and "content" not in msg:
            msg["content"] = ""
        out.append(msg)
    return out


def _tools(ep: Mapping[str, Any]) -> list[dict[str, Any]]:
    return parse_tools(ep.get("tools")) or []


def _with_tools(payload: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    if tools:
        payload["tools"] = tools
    return payload


def build_sft_examples(
    episodes: Sequence[Mapping[str, Any]], *, top_k: int = 1, min_reward: float | None = None
) -> tuple[list[dict[str, Any]], list[str]]:
    """Filtered behaviour cloning: the ``top_k`` best episodes of each task group as SFT lines.

    Returns:
        ``(examples, notes)``: JSONL objects ``{"messages", "tools"}`` and what was left out.

    Example:
        >>> eps = [{"task_id": "t", "reward": r, "episode_id": f"e{r}", "messages": [
        ...     {"role": "user", "content": "q"}, {"role": "assistant", "content": f"a{r}"}]} for r in (0, 1)]
        >>> build_sft_examples(eps)[0]
        [{'messages': [{'role': 'user', 'content': 'q'}, {'role': 'assistant', 'content': 'a1'}]}]
    """
    examples: list[dict[str, Any]] = []
    below = 0
    for group in episodes_by_task(episodes).values():
        ranked = sorted(group, key=lambda e: -float(e["reward"]))
        for ep in ranked[:top_k]:
            if min_reward is not None and float(ep["reward"]) < min_reward:
                below += 1
                continue
            examples.append(_with_tools({"messages": openai_messages(ep["messages"])}, _tools(ep)))
    notes = [f"SFT: {len(examples)} examples (top {top_k} per task group)"]
    if below:
        notes.append(f"SFT: {below} top episodes below min_reward={min_reward} left out")
    return examples, notes


def _canonical_ids(messages: list[dict[str, Any]]) -> list[str]:
    """Messages as comparable strings with tool call ids renumbered (ids differ between runs)."""
    ids: dict[str, str] = {}
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "id": ids.setdefault(str(c.get("id")), f"call_{len(ids)}")} for c in m["tool_calls"]
            ]
        if m.get("tool_call_id") is not None:
            m["tool_call_id"] = ids.get(str(m["tool_call_id"]), m["tool_call_id"])
        out.append(json.dumps(m, sort_keys=True))
    return out


def build_dpo_pairs(
    episodes: Sequence[Mapping[str, Any]], *, min_reward_margin: float = 0.0
) -> tuple[list[dict[str, Any]], list[str]]:
    """Best-vs-worst preference pairs per task group, cut at the first differing assistant message.

    Messages are compared with tool call ids renumbered (ids are random per run); the shared input keeps the
    best episode's messages.

    Returns:
        ``(pairs, notes)``: JSONL objects ``{"input": {"messages", "tools"}, "preferred_output",
        "non_preferred_output"}`` and counts of groups without a pair.

    Example:
        >>> def ep(r, text):
        ...     return {"task_id": "t", "reward": r, "episode_id": text, "messages": [
        ...         {"role": "user", "content": "q"}, {"role": "assistant", "content": text}]}
        >>> pairs, _ = build_dpo_pairs([ep(1.0, "good"), ep(0.0, "bad")])
        >>> pairs[0]["preferred_output"], pairs[0]["non_preferred_output"]
        ([{'role': 'assistant', 'content': 'good'}], [{'role': 'assistant', 'content': 'bad'}])
    """
    pairs: list[dict[str, Any]] = []
    no_margin = no_divergence = 0
    for group in episodes_by_task(episodes).values():
        ranked = sorted(group, key=lambda e: -float(e["reward"]))
        best, worst = ranked[0], ranked[-1]
        if float(best["reward"]) - float(worst["reward"]) <= min_reward_margin:
            no_margin += 1
            continue
        a, b = openai_messages(best["messages"]), openai_messages(worst["messages"])
        ca, cb = _canonical_ids(a), _canonical_ids(b)
        k = 0
        while k < min(len(a), len(b)) and ca[k] == cb[k]:
            k += 1
        if k >= len(a) or k >= len(b) or a[k]["role"] != "assistant" or b[k]["role"] != "assistant":
            no_divergence += 1
            continue
        pairs.append(
            {
                "input": _with_tools({"messages": a[:k]}, _tools(best)),
                "preferred_output": [a[k]],
                "non_preferred_output": [b[k]],
            }
        )
    notes = [f"DPO: {len(pairs)} best-vs-worst pairs"]
    if no_margin:
        notes.append(f"DPO: {no_margin} groups without a reward gap above {min_reward_margin} (no pair)")
    if no_divergence:
        notes.append(f"DPO: {no_divergence} pairs that do not first differ at an assistant message (skipped)")
    return pairs, notes


# -------------------------------------------------------------------------------------------- the backend


class OpenAIFineTuneTrainer(RemoteTrainer):
    """The ``openai`` backend: SFT / DPO fine-tuning jobs through the OpenAI API.

    Example:
        >>> from trainers.remote.openai_ft import OpenAIFineTuneConfig, OpenAIFineTuneTrainer
        >>> cfg = OpenAIFineTuneConfig(model="gpt-4.1-mini-2025-04-14", output_dir="runs/ft")
        >>> OpenAIFineTuneTrainer().train("episodes.parquet", cfg)  # doctest: +SKIP
        >>> OpenAIFineTuneTrainer().attach("runs/ft")  # after a client restart  # doctest: +SKIP
    """

    name: ClassVar[str] = "openai"
    config_class: ClassVar[type[TrainerConfig]] = OpenAIFineTuneConfig
    noun: ClassVar[str] = "fine-tuning job"

    def build_examples(
        self, data: Any, config: OpenAIFineTuneConfig
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Load, validate and convert episodes to JSONL objects for ``config.method``.

        Raises:
            InvalidDataError: Invalid episodes, or fewer than ``min_examples`` examples (with the reasons).

        Example:
            >>> lines, notes = OpenAIFineTuneTrainer().build_examples("e.parquet", cfg)  # doctest: +SKIP
        """
        episodes = episodes_to_send(data)
        if config.method == "dpo":
            examples, notes = build_dpo_pairs(episodes, min_reward_margin=config.min_reward_margin)
        else:
            examples, notes = build_sft_examples(episodes, top_k=config.top_k, min_reward=config.min_reward)
        if len(examples) < config.min_examples:
            raise InvalidDataError(
                f"{len(examples)} {config.method.upper()} examples from {len(episodes)} episodes, fewer than "
                f"min_examples={config.min_examples} (OpenAI requires at least 10)",
                notes,
            )
        return examples, notes

    def prepare(self, data: Any, config: TrainerConfig) -> PreparedData:
        """Build the examples without uploading (``--dry-run``): groups plus example counts in the report.

        Example:
            >>> OpenAIFineTuneTrainer().prepare("e.parquet", cfg).report.notes  # doctest: +SKIP
            ['SFT: 12 examples (top 1 per task group)']
        """
        cfg = self.check_config(config)
        episodes = load_episodes(data)
        examples, notes = self.build_examples(episodes, cfg)
        groups = [
            Group(
                task, task, [ConvertedEpisode(str(e.get("episode_id")), task, e.get("reward")) for e in eps]
            )
            for task, eps in episodes_by_task(episodes).items()
        ]
        report = DataReport(episodes=len(episodes), tasks=len(groups), groups=len(groups), notes=notes)
        return PreparedData(groups=groups, eval_groups=[], report=report)

    # ------------------------------------------------------------------------------ lifecycle steps

    def check_config(self, config: TrainerConfig) -> OpenAIFineTuneConfig:
        """The config, when it is an :class:`OpenAIFineTuneConfig` with a base model."""
        if not isinstance(config, OpenAIFineTuneConfig):
            raise UserError(f"the openai backend needs an OpenAIFineTuneConfig, got {type(config).__name__}")
        if not config.model:
            raise UserError("no base model given: pass --model (e.g. gpt-4.1-mini-2025-04-14)")
        return config

    def check_credentials(self, config: OpenAIFineTuneConfig) -> None:
        """The API key must be in ``api_key_env``."""
        _api_key(config.api_key_env)

    def submit(self, data: Any, config: OpenAIFineTuneConfig, out: Path) -> RemoteJob:
        """Write ``train.jsonl``, upload it, create the fine-tuning job and save ``job.json``."""
        examples, notes = self.build_examples(data, config)
        for note in notes:
            progress(note)
        out.mkdir(parents=True, exist_ok=True)
        train_file = out / "train.jsonl"
        train_file.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples))

        settings = _settings(config)
        with _client(settings) as client:
            upload = _call(
                settings,
                "upload training file",
                lambda: client.files.create(
                    file=(train_file.name, train_file.read_bytes()), purpose="fine-tune"
                ),
            )
            progress(f"uploaded {train_file} as {upload.id} ({len(examples)} examples)")
            create = _job_request(config, upload.id)
            created = _call(
                settings, "create fine-tuning job", lambda: client.fine_tuning.jobs.create(**create)
            )
            endpoint = str(client.base_url)
        job = RemoteJob(
            backend=self.name,
            job_id=created.id,
            endpoint=endpoint,
            status=created.status,
            info={**settings, "training_file": upload.id, "method": config.method, "examples": len(examples)},
        )
        job.save(out)
        progress(f"fine-tuning job {job.job_id} created ({job.status}); saved to {out / 'job.json'}")
        return job

    def connect(self, job: RemoteJob, out: Path) -> Any:
        """An OpenAI client for the job's endpoint (closed when following ends)."""
        return _client(job.info)

    def poll(self, client: Any, job: RemoteJob, out: Path) -> bool:
        """Report new events, refresh the job; once it is final, write ``result.json``."""
        self._stream_events(client, job, out)
        remote = _call(job.info, "get job status", lambda: client.fine_tuning.jobs.retrieve(job.job_id))
        if remote.status != job.status:
            progress(f"fine-tuning job {job.job_id}: {remote.status}")
        job.status = remote.status
        job.result_model = remote.fine_tuned_model
        job.error = remote.error.message if remote.error and remote.error.message else None
        job.info["trained_tokens"] = remote.trained_tokens
        job.info["result_files"] = list(remote.result_files or [])
        if job.terminal:
            self._stream_events(client, job, out)
            _write_result(out, job)
        return False  # _stream_events read every page already

    def cancel_job(self, job: RemoteJob) -> None:
        """Cancel the fine-tuning job."""
        with _client(job.info) as client:
            remote = _call(job.info, "cancel job", lambda: client.fine_tuning.jobs.cancel(job.job_id))
        job.status = remote.status

    def on_success(self, client: Any, job: RemoteJob, out: Path) -> None:
        """Print the fine-tuned model id."""
        progress(f"fine-tuned model: {job.result_model}")

    def result(self, out: Path, job: RemoteJob) -> TrainResult:
        """Job id, status, fine-tuned model and trained tokens as metrics."""
        metrics_path = out / "metrics.jsonl"
        return TrainResult(
            output_dir=out,
            checkpoint=None,
            metrics_path=metrics_path if metrics_path.is_file() else None,
            metrics={
                "job_id": job.job_id,
                "status": job.status,
                "fine_tuned_model": job.result_model,
                "trained_tokens": job.info.get("trained_tokens"),
            },
        )

    # ------------------------------------------------------------------------------------------ internal

    @staticmethod
    def _stream_events(client: Any, job: RemoteJob, out: Path) -> None:
        # The events list is newest first; `after` pages towards older events. Read pages until the last
        # event already seen (job.cursor), then report the new ones oldest first.
        new: list[Any] = []
        after: str | None = None
        for _ in range(100):
            page = _call(
                job.info,
                "list job events",
                lambda a=after: client.fine_tuning.jobs.list_events(
                    job.job_id, limit=100, **({"after": a} if a else {})
                ),
            )
            data = list(page.data)
            seen = next((i for i, ev in enumerate(data) if ev.id == job.cursor), None)
            new += data[:seen] if seen is not None else data
            if seen is not None or not page.has_more or not data:
                break
            after = data[-1].id
        if not new:
            return
        new.reverse()
        # The cursor is saved after the metrics are appended: a client killed in between finds its last
        # events already in metrics.jsonl when it re-attaches. They carry their event id: never written twice.
        written = _metric_event_ids(out / "metrics.jsonl")
        with open(out / "metrics.jsonl", "a") as metrics:
            for ev in new:
                if ev.type == "metrics" and isinstance(ev.data, dict):
                    if ev.id in written:
                        continue
                    row = {"step": ev.data.get("step"), **ev.data, "time": ev.created_at, "event_id": ev.id}
                    metrics.write(json.dumps(row) + "\n")
                    shown = ", ".join(
                        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                        for k, v in ev.data.items()
                        if k != "step"
                    )
                    progress(f"fine-tuning job {job.job_id}: step {ev.data.get('step')}: {shown}")
                else:
                    progress(f"fine-tuning job {job.job_id}: {ev.message}")
        job.cursor = new[-1].id
        job.save(out)


# ----------------------------------------------------------------------------------------------- helpers


def _metric_event_ids(path: Path) -> set[str]:
    """Event ids of the rows already in ``metrics.jsonl``; a row cut short by a kill is removed first."""
    if not path.is_file():
        return set()
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with open(path, "r+b") as fh:
            fh.truncate(len(data))
    ids = set()
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("event_id"), str):
            ids.add(row["event_id"])
    return ids


def _settings(cfg: OpenAIFineTuneConfig) -> dict[str, Any]:
    """What re-attaching needs (persisted in job.json): never the key itself, only its variable's name."""
    return {
        "base_url": cfg.base_url or os.environ.get("OPENAI_BASE_URL") or None,
        "api_key_env": cfg.api_key_env,
        "poll_interval": cfg.poll_interval,
        "max_retries": cfg.max_retries,
        "retry_base_delay": cfg.retry_base_delay,
        "request_timeout": cfg.request_timeout,
        "cancel_on_interrupt": cfg.cancel_on_interrupt,
    }


def _api_key(env: str) -> str:
    key = os.environ.get(env, "")
    if not key:
        raise AuthError(f"no OpenAI API key: set ${env}")
    return key


def _client(settings: Mapping[str, Any]) -> Any:
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - openai is in the remote extra
        raise UserError("the openai backend needs the openai package: pip install 'tracerl[openai]'") from exc
    # Retries are ours (with_retries: backoff plus a progress line), so the SDK's own are off.
    return openai.OpenAI(
        api_key=_api_key(str(settings.get("api_key_env", "OPENAI_API_KEY"))),
        base_url=settings.get("base_url") or None,
        max_retries=0,
        timeout=float(settings.get("request_timeout", 120.0)),
    )


def _call(settings: Mapping[str, Any], what: str, fn: Callable[[], T]) -> T:
    import openai

    env = settings.get("api_key_env", "OPENAI_API_KEY")

    def once() -> T:
        try:
            return fn()
        except openai.AuthenticationError as exc:
            raise AuthError(f"{what}: the API refused the key in ${env} (HTTP 401: {_message(exc)})") from exc
        except openai.PermissionDeniedError as exc:
            raise AuthError(f"{what}: permission denied (HTTP 403: {_message(exc)})") from exc
        except openai.RateLimitError as exc:
            raise RateLimitError(f"HTTP 429: {_message(exc)}", retry_after=_retry_after(exc)) from exc
        except openai.InternalServerError as exc:
            raise TransientError(f"HTTP {exc.status_code}: {_message(exc)}") from exc
        except openai.APIConnectionError as exc:
            raise TransientError(f"cannot reach the API: {exc}") from exc
        except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
            raise InvalidDataError(f"{what}: the API rejected the request ({_message(exc)})") from exc
        except openai.APIStatusError as exc:
            raise RemoteError(f"{what}: HTTP {exc.status_code}: {_message(exc)}") from exc

    return with_retries(
        once,
        what=what,
        attempts=int(settings.get("max_retries", 6)),
        base_delay=float(settings.get("retry_base_delay", 1.0)),
    )


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
    return str(getattr(exc, "message", exc)).splitlines()[0]


def _retry_after(exc: Any) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None) or {}
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _job_request(cfg: OpenAIFineTuneConfig, training_file: str) -> dict[str, Any]:
    """The body of ``POST /fine_tuning/jobs``: model, file, method with its hyperparameters, seed, suffix."""
    hyper: dict[str, Any] = {
        k: v
        for k, v in {
            "n_epochs": cfg.n_epochs,
            "batch_size": cfg.batch_size,
            "learning_rate_multiplier": cfg.learning_rate_multiplier,
        }.items()
        if v is not None
    }
    if cfg.method == "dpo":
        if cfg.beta is not None:
            hyper["beta"] = cfg.beta
        method = {"type": "dpo", "dpo": {"hyperparameters": hyper}}
    else:
        method = {"type": "supervised", "supervised": {"hyperparameters": hyper}}
    create: dict[str, Any] = {
        "model": cfg.model,
        "training_file": training_file,
        "method": method,
        "seed": cfg.seed,
    }
    if cfg.suffix:
        create["suffix"] = cfg.suffix
    return create


def _write_result(out: Path, job: RemoteJob) -> None:
    (out / "result.json").write_text(
        json.dumps(
            {
                "job_id": job.job_id,
                "status": job.status,
                "fine_tuned_model": job.result_model,
                "error": job.error,
                "trained_tokens": job.info.get("trained_tokens"),
                "result_files": job.info.get("result_files"),
            },
            indent=2,
        )
    )
