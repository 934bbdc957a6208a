"""Feasibility prototype of the main job: SFT warm start → [collect → GRPO (TRL replay) → reload → eval]×R.

Each stage maps onto the SDK pipeline the lead will wire in:

- **collect**: the agent (``agent.py``, raw openai client or LangChain) calls the policy served by
  ``sdk.serve`` at temperature 1, G episodes per training task, many episodes concurrently (the
  server batches them). Here the raw responses (token ids, logprobs) are kept in memory; later this is
  ``with session(task_id=...)`` + capture into the store.
- **export**: ``episode_to_sample`` turns an episode's responses into one token-faithful sequence
  (prompt ids of the first call; completion = generated ids + tool/template glue with ``env_mask`` 0);
  later ``python -m sdk.export``.
- **train**: one GRPO round with TRL's ``GRPOTrainer`` and a ``rollout_func`` that replays the stored
  samples (trl-replay.md §4); groups without reward spread are dropped; later ``python -m sdk.train``.
- **reload**: save the checkpoint, ``server.reload(path)``.
- **evaluate**: held-out tasks (never trained on), success at temperature 1 (the policy as it is run)
  and greedy.

Run: ``python -m examples.arithmetic.prototype_loop --seed 0 --out /tmp/proto0``.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import math
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from examples.arithmetic.agent import make_langchain_agent, run_langchain, run_openai
from examples.arithmetic.policy import build_policy, save_policy, sft
from examples.arithmetic.task import Task, make_splits
from sdk.serve import PolicyServer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

_RECORD: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar("_RECORD", default=None)


def _recording_http_client() -> Any:
    """An httpx client whose transport appends each chat-completion response body to ``_RECORD``."""
    import httpx
    import openai

    class Rec(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.HTTPTransport()

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            resp = self.inner.handle_request(request)
            body = resp.read()
            sink = _RECORD.get()
            if sink is not None and request.url.path.endswith("/chat/completions"):
                try:
                    sink.append(json.loads(body))
                except json.JSONDecodeError:
                    pass
            return httpx.Response(resp.status_code, headers=resp.headers, content=body, request=request)

    return openai.DefaultHttpxClient(transport=Rec())


# ----------------------------------------------------------------------------------------------------
# collect / evaluate
# ----------------------------------------------------------------------------------------------------


def run_episodes(
    base_url: str, tasks: list[Task], temperature: float, agent_kind: str = "openai", workers: int = 64
) -> list[dict[str, Any]]:
    """Run the agent once per task (tasks may repeat), concurrently; each result has ``responses``."""
    if agent_kind == "openai":
        import openai

        client = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)

        def one(t: Task) -> dict[str, Any]:
            return {"task": t, **run_openai(client, t, temperature=temperature)}
    else:
        agent = make_langchain_agent(base_url, temperature=temperature, http_client=_recording_http_client())

        def one(t: Task) -> dict[str, Any]:
            sink: list[dict[str, Any]] = []
            _RECORD.set(sink)
            res = run_langchain(agent, t)
            return {"task": t, **res, "responses": sink}

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(lambda t: contextvars.copy_context().run(one, t), tasks))


def evaluate(base_url: str, tasks: list[Task], agent_kind: str, samples: int = 2) -> dict[str, float]:
    """Held-out success: mean reward at temperature 1 (``samples`` per task) and greedy."""
    sampled = run_episodes(base_url, [t for t in tasks for _ in range(samples)], 1.0, agent_kind)
    greedy = run_episodes(base_url, tasks, 0.0, agent_kind)
    return {
        "success_t1": statistics.mean(e["reward"] for e in sampled),
        "success_greedy": statistics.mean(e["reward"] for e in greedy),
        "tool_use_t1": statistics.mean(
            any(r["choices"][0]["message"].get("tool_calls") for r in e["responses"]) for e in sampled
        ),
    }


# ----------------------------------------------------------------------------------------------------
# export: episode -> token-faithful sample
# ----------------------------------------------------------------------------------------------------


def episode_to_sample(ep: dict[str, Any]) -> dict[str, Any] | None:
    """One masked sequence from the per-call token ids; None when a later prompt does not extend the
    previous prompt + completion (not token-faithful / not append-only)."""
    resps = ep["responses"]
    if not resps:
        return None
    prompt = list(resps[0]["prompt_token_ids"])
    seq = list(prompt)
    completion: list[int] = []
    mask: list[int] = []
    logps: list[float] = []
    for k, r in enumerate(resps):
        if k > 0:
            p = r["prompt_token_ids"]
            if p[: len(seq)] != seq:
                return None
            glue = p[len(seq) :]
            completion += glue
            mask += [0] * len(glue)
            logps += [0.0] * len(glue)
            seq = list(p)
        ch = r["choices"][0]
        ids = ch["token_ids"]
        completion += ids
        mask += [1] * len(ids)
        logps += [e["logprob"] for e in (ch["logprobs"] or {}).get("content") or [0.0] * len(ids)]
        seq += ids
    return {
        "prompt_ids": prompt,
        "completion_ids": completion,
        "env_mask": mask,
        "logprobs": logps,
        "reward": float(ep["reward"]),
        "task_id": ep["task"].task_id,
    }


# ----------------------------------------------------------------------------------------------------
# train: one GRPO round through TRL (replay)
# ----------------------------------------------------------------------------------------------------


def grpo_round(
    model: Any,
    tok: Any,
    samples: list[dict[str, Any]],
    G: int,
    lr: float,
    tasks_per_step: int,
    epochs: int,
    out_dir: str,
    loss_type: str = "grpo",
    beta: float = 0.0,
    pos_only: bool = False,
) -> dict[str, Any]:
    """Replay ``samples`` (G per task, contiguous) through ``GRPOTrainer`` with ``rollout_func``.

    ``pos_only`` clamps advantages at 0 (private-API subclass): only better-than-group episodes are
    reinforced; failures are not pushed down (on this tiny model pushing them down spreads mass onto
    other wrong tokens and lowered T=1 success).
    """
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    by_task: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        by_task.setdefault(s["task_id"], []).append(s)
    groups = {k: v[:G] for k, v in by_task.items() if len(v) >= G and len({s["reward"] for s in v[:G]}) > 1}
    if not groups:
        return {"steps": 0, "groups": 0}
    n_tasks = len(groups)
    tps = min(tasks_per_step, n_tasks)
    steps = max(1, math.ceil(n_tasks / tps) * epochs)
    counters: dict[str, int] = {}

    def rollout_func(prompts: list[str], trainer: Any) -> dict[str, Any]:
        out: dict[str, list[Any]] = {
            k: [] for k in ("prompt_ids", "completion_ids", "env_mask", "logprobs", "stored_reward")
        }
        for p in prompts:
            i = counters.get(p, 0)
            counters[p] = i + 1
            s = groups[p][i % G]
            out["prompt_ids"].append(s["prompt_ids"])
            out["completion_ids"].append(s["completion_ids"])
            out["env_mask"].append(s["env_mask"])
            out["logprobs"].append(s["logprobs"])
            out["stored_reward"].append(s["reward"])
        return out

    def stored_reward(
        prompts: list[Any], completions: list[Any], stored_reward: list[float], **kw: Any
    ) -> list[float]:
        return [float(r) for r in stored_reward]

    cfg = GRPOConfig(
        output_dir=out_dir,
        num_generations=G,
        per_device_train_batch_size=G * tps,
        max_steps=steps,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=beta,
        loss_type=loss_type,
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        temperature=1.0,
        max_grad_norm=1.0,
        seed=0,
    )
    ds = Dataset.from_list([{"prompt": k} for k in groups])
    cls = GRPOTrainer
    if pos_only:

        class PosOnly(GRPOTrainer):
            def _generate_and_score_completions(self, inputs: Any) -> Any:
                out = super()._generate_and_score_completions(inputs)
                out["advantages"] = out["advantages"].clamp(min=0)
                return out

        cls = PosOnly
    trainer = cls(
        model=model,
        reward_funcs=stored_reward,
        args=cfg,
        train_dataset=ds,
        processing_class=tok,
        rollout_func=rollout_func,
    )
    trainer.train()
    model.eval()
    return {"steps": steps, "groups": n_tasks}


# ----------------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the prototype; prints one JSON line per round and returns the summary."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="/tmp/tracerl-proto")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--sft-batch", type=int, default=16)
    p.add_argument("--p-good", type=float, default=1.0, help="fraction of correct demonstrations")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n-train", type=int, default=64)
    p.add_argument("--n-eval", type=int, default=100)
    p.add_argument(
        "--per-round",
        type=int,
        default=0,
        help="fresh training tasks per round from the --n-train pool (0 = all tasks every round)",
    )
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--tasks-per-step", type=int, default=8)
    p.add_argument("--loss-type", default="grpo")
    p.add_argument("--pos-only", action="store_true", help="clamp advantages at 0")
    p.add_argument("--agent", choices=("openai", "langchain"), default="openai")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    t_start, c_start = time.time(), time.process_time()
    random.seed(a.seed)
    splits = make_splits(seed=a.seed, n_train=a.n_train, n_eval=a.n_eval)
    tok, model = build_policy(hidden=a.hidden, layers=a.layers, seed=a.seed)
    n_params = sum(x.numel() for x in model.parameters())
    sft(
        model,
        tok,
        splits["sft"],
        steps=a.sft_steps,
        batch_size=a.sft_batch,
        lr=a.sft_lr,
        p_good=a.p_good,
        seed=a.seed,
        log_every=100,
    )
    out = Path(a.out)
    path = save_policy(model, tok, out / "round-0")
    history: list[dict[str, Any]] = []

    def log(rec: dict[str, Any]) -> None:
        rec.update(wall_s=round(time.time() - t_start, 1), cpu_s=round(time.process_time() - c_start, 1))
        history.append(rec)
        print(json.dumps(rec), flush=True)

    with PolicyServer(path, model_name="policy") as srv:
        log(
            {
                "round": 0,
                "stage": "sft",
                "params": n_params,
                **evaluate(srv.base_url, splits["eval"], a.agent),
            }
        )
        for r in range(1, a.rounds + 1):
            t0 = time.time()
            pool = splits["train"]
            if a.per_round:
                k = (r - 1) * a.per_round % len(pool)
                pool = (pool + pool)[k : k + a.per_round]
            eps = run_episodes(srv.base_url, [t for t in pool for _ in range(a.G)], 1.0, a.agent)
            t_collect = time.time() - t0
            samples = [s for s in (episode_to_sample(e) for e in eps) if s is not None]
            t0 = time.time()
            info = grpo_round(
                model,
                tok,
                samples,
                a.G,
                a.lr,
                a.tasks_per_step,
                a.epochs,
                str(out / "trl"),
                a.loss_type,
                pos_only=a.pos_only,
            )
            t_train = time.time() - t0
            srv.reload(save_policy(model, tok, out / f"round-{r}"))
            log(
                {
                    "round": r,
                    "train_reward": round(statistics.mean(e["reward"] for e in eps), 3),
                    "faithful": len(samples),
                    "episodes": len(eps),
                    **info,
                    "collect_s": round(t_collect, 1),
                    "train_s": round(t_train, 1),
                    **evaluate(srv.base_url, splits["eval"], a.agent),
                }
            )
    summary = {
        "seed": a.seed,
        "pre": history[0]["success_t1"],
        "post": history[-1]["success_t1"],
        "pre_greedy": history[0]["success_greedy"],
        "post_greedy": history[-1]["success_greedy"],
        "wall_s": history[-1]["wall_s"],
        "cpu_s": history[-1]["cpu_s"],
        "params": n_params,
    }
    print("SUMMARY " + json.dumps(summary), flush=True)
    (out / "history.json").write_text(json.dumps({"args": vars(a), "history": history, "summary": summary}))
    return summary


if __name__ == "__main__":
    main()
