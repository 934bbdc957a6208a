"""Per-agent training: roles from the recorded agent names, per-role credit, one policy per role.

The store is built by real sessions: two ``openai`` clients wrapped with different agent names (a router and
a math specialist) talk to the scripted OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

import sdk
from integrations.openai import wrap_openai
from sdk.episodes import role_reward
from sdk.testing import ScriptedOpenAIServer
from sdk.train import main
from trainers.data import build_groups, convert_episodes, load_episodes
from trainers.per_agent import role_episodes, train_per_agent
from trainers.settings import make_config


def _clients(base_url: str) -> tuple[openai.OpenAI, openai.OpenAI]:
    router = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0), agent="router")
    math = wrap_openai(openai.OpenAI(base_url=base_url, api_key="x", max_retries=0), agent="math")
    return router, math


def _ask(client: openai.OpenAI, system: str, question: str) -> str:
    reply = client.chat.completions.create(
        model="policy",
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
    )
    return reply.choices[0].message.content or ""


def _record(store: Path, sessions: list[dict]) -> Path:
    """One session per entry: the router call, then the math call; rewards as the entry says."""
    sdk.configure(store=store)
    try:
        with ScriptedOpenAIServer() as server:
            router, math = _clients(server.base_url)
            for spec in sessions:
                with sdk.session(task_id=spec["task"], sample=spec["sample"]) as s:
                    _ask(router, "Pick a specialist.", f"route: {spec['task']} #{spec['sample']}")
                    _ask(math, "Compute.", f"compute: {spec['task']} #{spec['sample']}")
                    if "call_reward" in spec:  # a per-call reward on the math call
                        s.reward(spec["call_reward"], call_id=s.last_call_id)
                    if "reward" in spec:
                        s.reward(spec["reward"])
                    if "router" in spec:
                        s.reward(spec["router"], name="router")
    finally:
        sdk.shutdown()
    return store


def _sessions() -> list[dict]:
    # Task a: the router is scored on its own (named reward), the math agent by the session reward.
    # Task b: no named reward, so both roles get the session reward.
    out = [{"task": "a", "sample": i, "reward": float(i % 2), "router": float(i // 2)} for i in range(4)]
    out += [{"task": "b", "sample": i, "reward": float(i >= 2)} for i in range(4)]
    return out


def test_roles_come_from_the_agent_names_and_each_role_gets_its_credit(tmp_path, tiny_tokenizer):
    rows = load_episodes(_record(tmp_path / "store", _sessions()))
    assert sorted({r["agent"] for r in rows}) == ["math", "router"]
    assert len(rows) == 16  # one thread per agent per session

    router = {(r["task_id"], r["sample"]): r["reward"] for r in role_episodes(rows, "router")}
    math = {(r["task_id"], r["sample"]): r["reward"] for r in role_episodes(rows, "math")}
    assert router == {("a", 0): 0.0, ("a", 1): 0.0, ("a", 2): 1.0, ("a", 3): 1.0} | {
        ("b", i): float(i >= 2) for i in range(4)
    }
    assert math == {("a", i): float(i % 2) for i in range(4)} | {("b", i): float(i >= 2) for i in range(4)}

    # GRPO groups per (task, role): a router reply is compared only with router replies of the same task.
    converted, _ = convert_episodes(
        role_episodes(rows, "router") + role_episodes(rows, "math"), tiny_tokenizer
    )
    groups, report = build_groups(converted, 4)
    assert sorted(g.group_id for g in groups) == ["a|math", "a|router", "b|math", "b|router"]
    assert report.tasks == 2
    for g in groups:
        role = g.group_id.split("|")[1]
        assert {s.role for s in g.sequences} == {role}
        assert {s.group_id for s in g.sequences} == {g.group_id}
    a_router = next(g for g in groups if g.group_id == "a|router")
    assert sorted(g_ep.reward for g_ep in a_router.episodes) == [0.0, 0.0, 1.0, 1.0]


def test_a_per_call_reward_credits_only_the_thread_of_that_call(tmp_path):
    sessions = [{"task": "c", "sample": i, "call_reward": float(i % 2)} for i in range(4)]
    rows = load_episodes(_record(tmp_path / "store", sessions))
    by_role = {r["agent"]: [] for r in rows}
    for r in rows:
        by_role[r["agent"]].append(role_reward(r))
    assert sorted(by_role["math"]) == [0.0, 0.0, 1.0, 1.0]
    assert "router" not in by_role  # its calls got no reward: left out (counted as missing_reward)


def test_single_agent_data_keeps_task_groups(tiny_tokenizer):
    from trainers.data import ConvertedEpisode, TrainingSequence

    eps = [
        ConvertedEpisode(f"e{i}", "t", float(i % 2), [TrainingSequence("t", f"e{i}")], role="solo")
        for i in range(4)
    ]
    groups, _ = build_groups(eps, 4)
    assert [g.group_id for g in groups] == ["t"]
    assert {s.role for s in groups[0].sequences} == {"solo"}


@pytest.mark.slow
def test_cli_per_agent_trains_one_policy_per_role_and_skips_a_role_without_signal(
    tmp_path, tiny_model_dir, capsys
):
    # The router's named reward is the same in every session: no signal for it, so it is skipped.
    sessions = [
        {"task": t, "sample": i, "reward": float(i % 2), "router": 1.0} for t in ("a", "b") for i in range(4)
    ]
    store = _record(tmp_path / "store", sessions)
    out = tmp_path / "out"
    args = ["--data", store, "--model", tiny_model_dir, "--output", out, "--group-size", 4]
    args += ["--max-steps", 1, "--per-device-train-batch-size", 4, "--grpo", "use_cpu=true"]
    args += ["--grpo", "report_to=none", "--grpo", "disable_tqdm=true", "--per-agent"]
    rc = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = json.loads((out / "roles.json").read_text())
    status = {r["role"]: r for r in summary["roles"]}
    assert status["math"]["status"] == "trained" and status["math"]["steps"] == 1
    assert status["router"]["status"] == "skipped" and "too little data" in status["router"]["skipped"]
    assert status["router"]["named_rewards"] == 8
    assert (out / "math" / "final" / "model.safetensors").is_file()
    assert not (out / "router").exists()
    assert "router: 8 episodes" in captured.out and "skipped" in captured.out

    # --roles picks roles; an unknown one is one line on stderr, exit 2.
    rc = main([str(a) for a in [*args, "--roles", "planner"]])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "no episodes of role(s) planner" in err[0]
    assert "math (8)" in err[0] and "router (8)" in err[0]


def test_per_agent_dry_run_and_data_without_agent_names(tmp_path, tiny_model_dir):
    store = _record(tmp_path / "store", _sessions())
    _, cfg, _ = make_config(
        {"model": str(tiny_model_dir), "output_dir": str(tmp_path / "o"), "group_size": 4}
    )
    result = train_per_agent(store, cfg, roles="router", dry_run=True)
    assert [(r.role, r.status, r.tasks_with_spread, r.named_rewards) for r in result.roles] == [
        ("router", "planned", 2, 4)
    ]
    rows = [{**r, "agent": None} for r in load_episodes(store)]
    with pytest.raises(Exception, match="no episode has an agent name"):
        train_per_agent(rows, cfg)


def test_eval_summary_by_role_reads_each_agents_reward_from_the_store(tmp_path, capsys):
    from sdk.eval._cli import main as eval_main
    from sdk.store import StoreReader

    store = _record(tmp_path / "store", _sessions())
    results = tmp_path / "eval.jsonl"
    lines = [
        {
            "task_id": s.task_id,
            "sample": s.sample,
            "status": "ok",
            "success": True,
            "session_id": s.session_id,
        }
        for s in StoreReader(store).sessions()
    ]
    results.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert eval_main(["summarize", str(results), "--store", str(store), "--by-role", "--json"]) == 0
    per_role = json.loads(capsys.readouterr().out)["per_role"]
    # router: task a by its named reward (0, 0, 1, 1), task b by the session reward (0, 0, 1, 1)
    assert per_role["router"]["samples"] == 8 and per_role["router"]["mean_reward"] == 0.5
    assert per_role["math"]["samples"] == 8 and per_role["math"]["mean_reward"] == 0.5
    assert eval_main(["summarize", str(results), "--store", str(store), "--by-role", "--no-tasks"]) == 0
    assert "role router: mean reward" in capsys.readouterr().out
    assert eval_main(["summarize", str(results), "--by-role"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pass --store" in err[0]


def _page_data(page: Path) -> dict:
    text = page.read_text()
    return json.loads(text.split('id="data"', 1)[1].split(">", 1)[1].split("</script>", 1)[0])


def test_viewer_groups_a_multi_agent_task_per_role_on_the_roles_reward(tmp_path):
    import re
    import shutil
    import subprocess

    from sdk.view import build_report

    store = _record(tmp_path / "store", _sessions())
    out = tmp_path / "report.html"
    summary = build_report(store, out)
    assert summary.groups == 4
    data = _page_data(out)
    groups = {g["task"]: g for g in data["groups"]}
    assert sorted(groups) == ["a|math", "a|router", "b|math", "b|router"]
    # Router of task a: its named reward (0, 0, 1, 1), not the session reward (0, 1, 0, 1).
    shown = sorted((e["sample"], e["credit"], e["adv"]) for e in data["episodes"] if e["group"] == "a|router")
    assert [(s, c) for s, c, _ in shown] == [(0, 0.0), (1, 0.0), (2, 1.0), (3, 1.0)]
    assert [a > 0 for _, _, a in shown] == [False, False, True, True]

    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("no chromium for the page check")
    browser = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"]
    url = out.resolve().as_uri() + "#agent=router"
    dom = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert re.search(r'<span id="count">8 of 16 episodes · 2 task groups</span>', dom), dom[:2000]
    assert "<b>a|router</b>" in dom and "<b>a|math</b>" not in dom


@pytest.mark.slow
def test_per_agent_lora_adapters_are_served_side_by_side_by_model_name(tmp_path, tiny_model_dir):
    """--per-agent --lora: one adapter per role on one base, served together; each role asks by its name."""
    pytest.importorskip("peft")
    from trainers.serve import LocalPolicyServer

    store = _record(tmp_path / "store", _sessions())
    settings = {"model": str(tiny_model_dir), "output_dir": str(tmp_path / "out"), "group_size": 4}
    settings |= {"lora": True, "max_length": 256}
    settings["grpo"] = {"max_steps": 2, "learning_rate": 0.05, "use_cpu": True, "report_to": "none"}
    settings["grpo"] |= {"per_device_train_batch_size": 4, "disable_tqdm": True, "beta": 0}
    trainer, cfg, _ = make_config(settings)
    result = train_per_agent(store, cfg, trainer=trainer)
    adapters = {role: str(path) for role, path in result.checkpoints().items()}
    assert sorted(adapters) == ["math", "router"]
    assert all((Path(p) / "adapter_config.json").is_file() for p in adapters.values())

    def first_logprob(client: openai.OpenAI, model: str) -> float:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "route: a #0"}], temperature=0,
            max_tokens=3, logprobs=True,
        )  # fmt: skip
        return reply.choices[0].logprobs.content[0].logprob

    with LocalPolicyServer(str(tiny_model_dir), model_name="base", adapters=adapters) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        router, math, base = (first_logprob(client, m) for m in ("router", "math", "base"))
        assert len({router, math, base}) == 3  # three different sets of weights answer
        server.reload_adapter("router", adapters["math"])  # one role reloaded; the other keeps its weights
        assert first_logprob(client, "router") == pytest.approx(math)
        assert first_logprob(client, "math") == pytest.approx(math)


def test_roles_differing_only_in_escaped_characters_train_into_their_own_directories(
    tmp_path, tiny_model_dir, capsys
):
    """Issue 38 item 17: 'a b', 'a/b' and 'roles.json' are three roles, three directories, one summary file."""
    from trainers.per_agent import role_dir, role_of_dir

    names = ["a b", "a/b", "roles.json"]
    sdk.configure(store=tmp_path / "store")
    try:
        with ScriptedOpenAIServer() as server:
            clients = {
                n: wrap_openai(openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0), agent=n)
                for n in names
            }
            for i in range(4):
                with sdk.session(task_id="t", sample=i) as s:
                    for n in names:
                        _ask(clients[n], "Answer.", f"{n} #{i}")
                    s.reward(float(i % 2))
    finally:
        sdk.shutdown()
    out = tmp_path / "out"
    args = ["--data", tmp_path / "store", "--model", tiny_model_dir, "--output", out, "--group-size", 4]
    args += ["--max-steps", 1, "--per-device-train-batch-size", 4, "--grpo", "use_cpu=true"]
    args += ["--grpo", "report_to=none", "--grpo", "disable_tqdm=true", "--per-agent"]
    rc = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    summary = {r["role"]: r for r in json.loads((out / "roles.json").read_text())["roles"]}
    assert sorted(summary) == sorted(names) and all(r["status"] == "trained" for r in summary.values())
    dirs = {n: Path(summary[n]["output_dir"]) for n in names}
    assert [d.name for d in dirs.values()] == ["a%20b", "a%2Fb", "roles%2Ejson"]
    for n, d in dirs.items():
        assert d.parent == out and role_of_dir(d.name) == n
        assert (d / "final" / "model.safetensors").is_file()  # each role's own weights, none overwritten
        assert Path(summary[n]["checkpoint"]).is_relative_to(d)
        assert f"(directory {d.name})" in captured.out

    # Names with no safe character at all: distinct, reversible, never '.', '..' or the summary file.
    tricky = ["路由", "数学", ".", "..", "%", "%25", "a.b", "a_b", "A-b"]
    escaped = [role_dir(out, n).name for n in tricky]
    assert len(set(escaped)) == len(tricky) and [role_of_dir(e) for e in escaped] == tricky
    assert not {".", "..", "roles.json"} & set(escaped) and all(
        role_dir(out, n).parent == out for n in tricky
    )
    with pytest.raises(ValueError, match="must not be empty"):
        role_dir(out, "")
