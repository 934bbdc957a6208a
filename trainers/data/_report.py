"""DataReport: counts of everything the data preparation did, dropped or changed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DataReport"]


@dataclass
class DataReport:
    """Counts of everything the data preparation did, dropped or changed (printed and saved).

    Example:
        >>> DataReport(episodes=3).episodes
        3
    """

    episodes: int = 0
    store_problems: dict[str, int] = field(default_factory=dict)
    superseded: int = 0
    no_reward: int = 0
    no_task: int = 0
    no_assistant: int = 0
    invalid: int = 0
    invalid_problems: dict[str, int] = field(default_factory=dict)
    unicode_replaced: int = 0
    sequences: int = 0
    per_turn_episodes: int = 0
    non_append_only_skipped: int = 0
    faithful: int = 0
    unfaithful: int = 0
    unfaithful_no_token_ids: int = 0
    unfaithful_mismatch: int = 0
    unfaithful_logprobs_length_mismatch: int = 0
    exact_ids: int = 0
    rerender_match: int = 0
    rerender_differs: int = 0
    rerender_differs_why: dict[str, int] = field(default_factory=dict)
    template_no_ids: int = 0
    context_turns: int = 0
    other_choices_left_out: int = 0
    truncated: int = 0
    cut_at_length: int = 0
    skipped_too_long: int = 0
    multi_thread_samples: int = 0
    tasks: int = 0
    tasks_too_small: int = 0
    groups: int = 0
    groups_split: int = 0
    episodes_trimmed: int = 0
    groups_resampled: int = 0
    duplicates_added: int = 0
    groups_dropped_small: int = 0
    groups_smaller: int = 0
    groups_zero_std_filtered: int = 0
    eval_groups: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """Plain ``dict`` (JSON/YAML friendly)."""
        return asdict(self)

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line, zero counts omitted."""
        labels = {
            "episodes": "episodes loaded",
            "store_problems": "store problems (lines skipped)",
            "superseded": "sessions superseded by a re-run of their (task, sample) (left out)",
            "no_reward": "episodes without a reward (dropped)",
            "no_task": "episodes without a task_id (dropped)",
            "no_assistant": "episodes without an assistant turn (dropped)",
            "invalid": "invalid episodes (dropped; sdk.episodes.validate_episode)",
            "unicode_replaced": "episodes with invalid unicode (lone surrogates replaced)",
            "sequences": "training sequences",
            "per_turn_episodes": "episodes split per turn (not append-only under this template)",
            "non_append_only_skipped": "non-append-only episodes skipped (per_turn=never)",
            "faithful": "token-faithful episodes (behaviour logprobs used)",
            "unfaithful": "episodes not token-faithful (no behaviour logprobs)",
            "unfaithful_no_token_ids": "  of which: no stored token ids/logprobs",
            "unfaithful_mismatch": "  of which: stored ids differ from this tokenizer",
            "unfaithful_logprobs_length_mismatch": "  of which: logprobs of another length than their ids",
            "exact_ids": "episodes trained from the exact stored token ids (no chat template)",
            "rerender_match": "episodes re-rendered with the chat template, matching the stored ids",
            "rerender_differs": "episodes re-rendered with the chat template, differing from the stored ids",
            "template_no_ids": "episodes re-rendered with the chat template (no stored token ids)",
            "context_turns": "assistant turns kept as context, not trained (hand-offs, few-shot, cut off, "
            "forced tool calls without token ids)",
            "other_choices_left_out": "choices of n > 1 calls left out (only the one the agent continued is "
            "trained)",
            "truncated": "episodes truncated to max length",
            "cut_at_length": "episodes cut before a message that starts past max length (not tokenized)",
            "skipped_too_long": "episodes skipped: longer than max length",
            "multi_thread_samples": "samples of several threads (a truncated context, ...): one group member",
            "tasks": "tasks",
            "tasks_too_small": "tasks with < 2 usable episodes (dropped)",
            "groups": "training groups",
            "groups_split": "tasks split into several groups",
            "episodes_trimmed": "episodes left out by group sizing",
            "groups_resampled": "groups filled up by resampling",
            "duplicates_added": "duplicate episodes added by resampling",
            "groups_dropped_small": "groups dropped: fewer than group_size episodes",
            "groups_smaller": "groups trained with fewer than group_size episodes (none twice)",
            "groups_zero_std_filtered": "groups dropped: all rewards equal (zero advantage)",
            "eval_groups": "held-out evaluation groups",
        }

        def value(key: str) -> Any:
            v = getattr(self, key)
            return sum(v.values()) if isinstance(v, dict) else v

        out = [f"{label}: {value(key)}" for key, label in labels.items() if value(key)]
        if self.store_problems:
            at = out.index(f"{labels['store_problems']}: {value('store_problems')}") + 1
            out[at:at] = [f"  {code}: {n}" for code, n in sorted(self.store_problems.items())]
        if self.invalid_problems:
            at = out.index(f"{labels['invalid']}: {self.invalid}") + 1
            out[at:at] = [f"  {code}: {n}" for code, n in sorted(self.invalid_problems.items())]
        if self.rerender_differs_why:
            at = out.index(f"{labels['rerender_differs']}: {self.rerender_differs}") + 1
            out[at:at] = [f"  {why}: {n}" for why, n in sorted(self.rerender_differs_why.items())]
        return out + list(self.notes)
