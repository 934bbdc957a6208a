"""Training data: episodes → training sequences → GRPO groups. Pure Python: no torch, polars imported lazily.

:class:`TrainingSequence` is the one record every backend (TRL, Tinker, Ray, OpenAI fine-tuning) consumes:
prompt and completion ids, ``loss_mask`` (1 = a model token, trained), behaviour logprobs, reward and the
group advantage. Modules: ``_load`` (reading episodes), ``_convert`` (one episode → sequences), ``_screen``
(many episodes, screened and counted), ``_groups`` (GRPO groups), ``_report`` (:class:`DataReport`),
``_sequence`` (the records).

The input is the episode Parquet contract (one row per agent thread, OpenAI chat messages, stored rewards,
per-assistant-turn token ids and logprobs). The output is :class:`TrainingSequence` objects rendered with the
*target* tokenizer's chat template, grouped by ``task_id`` into GRPO groups of G samples (the threads of one
session, e.g. of an agent that truncated its context, are one member sharing one advantage).

Reading: Parquet through ``sdk.episodes.read_episodes``, a store through ``sdk.episodes.build_episodes``;
each episode is checked with ``sdk.episodes.validate_episode`` before conversion (invalid ones are counted
and left out).

Conversion:

1. Normalise OpenAI messages for HF chat templates with ``sdk.messages.template_messages``, the rules the
   policy server (``trainers.serve``) renders its prompts with: JSON-string tool arguments → dict, ``name``
   on tool messages from the matching ``tool_call_id``, ``None`` content → ``""``, Arrow's ``None``-valued
   struct keys dropped.
2. Render the whole thread once and every assistant turn's prefix. When each prefix is a token prefix of the
   full rendering (append-only thread, prefix-preserving template) the episode becomes **one** sequence:
   prompt = messages before the first assistant turn (with the generation prompt), completion = the rest,
   ``loss_mask`` = 1 on each assistant turn through its EOS, 0 on tool results and template glue.
   Otherwise (e.g. a template that drops earlier reasoning) every assistant turn becomes its own sequence
   (**per-turn**).
3. Behaviour logprobs are attached only when the episode is *token-faithful*: the stored token ids of every
   assistant turn equal the tokenizer's ids for that span (and the stored prompt ids, when present, equal the
   rendered prompt). A stored turn that lacks only the trailing EOS is accepted; its EOS logprob is ``NaN``
   (the trainer then uses the policy's own log-prob there, i.e. ratio 1).
"""

from trainers.data._convert import PerTurn, Truncation, convert_episode, parse_tools
from trainers.data._groups import build_groups
from trainers.data._load import REQUIRED_COLUMNS, check_task_sizes, load_episodes, recorded_group_size
from trainers.data._report import DataReport
from trainers.data._screen import convert_episodes
from trainers.data._sequence import ConvertedEpisode, Group, TrainingSequence

__all__ = [
    "REQUIRED_COLUMNS",
    "ConvertedEpisode",
    "DataReport",
    "Group",
    "PerTurn",
    "Truncation",
    "TrainingSequence",
    "build_groups",
    "check_task_sizes",
    "convert_episode",
    "convert_episodes",
    "load_episodes",
    "parse_tools",
    "recorded_group_size",
]
