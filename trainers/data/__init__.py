"""Training data: episodes → training sequences → GRPO groups. Pure Python: no torch, polars imported lazily.

:class:`TrainingSequence` is the one record every backend (TRL, Tinker, Ray, OpenAI fine-tuning) consumes:
prompt and completion ids, ``loss_mask`` (1 = a model token, trained), behaviour logprobs, reward and the
group advantage. Modules: ``_load`` (reading episodes, by task), ``_convert`` (one episode → sequences),
``_screen`` (many episodes, screened and counted or refused), ``_groups`` (GRPO groups), ``_prepare``
(:func:`prepare_data`, all of it for a backend, and the target tokenizer), ``_report`` (:class:`DataReport`),
``_sequence`` (the records).

The input is the episode Parquet contract (one row per agent thread, OpenAI chat messages, stored rewards,
per-assistant-turn token ids and logprobs). The output is :class:`TrainingSequence` objects rendered with the
*target* tokenizer's chat template, grouped by ``task_id`` into GRPO groups of G samples (the threads of one
session, e.g. of an agent that truncated its context, are one member sharing one advantage).

Reading: Parquet through ``sdk.episodes.read_episodes``, a store through ``sdk.episodes.build_episodes``;
each episode is checked with ``sdk.episodes.validate_episode`` and ``ValidationPolicy.TRAINING`` before
conversion (invalid ones are counted and left out); :func:`refuse_invalid` refuses a whole batch with reasons
instead (the remote backends, before they send anything).

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

Which tokens a sequence trains. Each episode takes one of three paths, counted in the data report
(``tracerl train --dry-run`` prints it) and per episode in ``episode_paths.jsonl``:

- **Exact ids** ("episodes trained from the exact stored token ids"): every call of the thread has its prompt
  and completion ids in the store (vLLM's ``return_token_ids``; ``wrap_openai(client, token_data=True)``).
  No chat template is applied: the episode is one sequence when each call's prompt ids extend the previous
  call's prompt + completion ids, else one sequence per call; loss falls exactly on the completion ids the
  thread's own calls produced, and the stored logprobs are the behaviour logprobs.
- **Re-render matching the ids**: only completion ids were stored; the rendered turns equal them, so the
  stored logprobs are used.
- **Re-render differing** (with the reason, e.g. ``completion ids differ from the re-render``): another
  tokenizer, or a word sampled in unusual tokens; trained on the re-rendered text without behaviour
  logprobs. Episodes without token ids take the template path too ("no stored token ids").

Stored ids outside the tokenizer's vocabulary (another model's) are not used (re-rendered); a negative id
(a server's ``-1``) rejects the episode (``invalid_token_ids``), in the export as here; logprobs of another
length than their ids leave the episode without behaviour logprobs (``logprobs_length_mismatch``). On
every path, assistant messages the thread did not generate (a hand-off, few-shot examples, edited history)
and turns cut short (``incomplete_stream``) are context: no loss ("assistant turns kept as context").

What each shape of agent run becomes (every generation trained once, on the prompt the server received;
what is not trained is counted):

- **Compaction** (e.g. LangChain's ``SummarizationMiddleware``): the call after the summary starts a new
  thread of the same sample; each call is trained once, and the sample's threads are one group member.
- **Retries**: every HTTP attempt is a stored call; the attempt whose answer the agent got is trained once
  (a retry of the same messages continues the thread); failed attempts generate nothing (``failed_calls``
  in the episode's ``metadata.tracerl``).
- **Sub-agents**: each sub-agent's conversation is a thread of its own, trained once; a hook's record and
  the transport's record of one call are joined by the request's identity, never by content alone.
- **Parallel tool calls**: one assistant turn with all its ``tool_calls``; tool results are context.
- **n > 1 choices**: the choice the agent continued with is trained; the others are counted
  (``other_choices_left_out``).
- **Forced tool calls** (``tool_choice`` named or ``"required"``): with token ids, the ids the server
  generated; without them (a framework hook only) the turn is context (``forced_tool_turn``), since a
  re-render would train markup the server never generated.
- **The Responses API**: input items merged into messages as the serving engine renders them;
  ``previous_response_id`` is a counted rejection (the conversation before it is on the server).
"""

from trainers.data._convert import PerTurn, Truncation, convert_episode, parse_tools
from trainers.data._groups import build_groups
from trainers.data._load import (
    REQUIRED_COLUMNS,
    check_task_sizes,
    episodes_by_task,
    load_episodes,
    recorded_group_size,
)
from trainers.data._prepare import PreparedData, load_tokenizer, prepare_data
from trainers.data._report import DataReport
from trainers.data._screen import convert_episodes, refuse_invalid
from trainers.data._sequence import ConvertedEpisode, Group, TrainingSequence

__all__ = [
    "REQUIRED_COLUMNS",
    "ConvertedEpisode",
    "DataReport",
    "Group",
    "PerTurn",
    "PreparedData",
    "Truncation",
    "TrainingSequence",
    "build_groups",
    "check_task_sizes",
    "convert_episode",
    "convert_episodes",
    "episodes_by_task",
    "load_episodes",
    "load_tokenizer",
    "parse_tools",
    "prepare_data",
    "recorded_group_size",
    "refuse_invalid",
]
