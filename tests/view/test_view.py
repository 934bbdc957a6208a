"""The episode viewer: data it embeds, the CLI, and the page in a real headless Chromium."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import sdk
from sdk._sources import SourcedEpisode
from sdk.capture import CallRecord, record_call
from sdk.view import build_report, episode_view
from sdk.view.__main__ import main

FEW_SHOT = {"role": "assistant", "content": "2 + 2 = 4."}


def _record(s: sdk.Session, messages: list[Any], response: dict[str, Any], **kw: Any) -> None:
    """One answered call of ``tiny-1`` in session ``s``."""
    t0 = time.time()
    record_call(
        CallRecord(
            framework="custom",
            model="tiny-1",
            messages=messages,
            response_message=response,
            finish_reason="stop",
            started_at=t0,
            ended_at=t0 + 0.2,
            **kw,
        ),
        s,
    )


def _store(path: Path, samples: int = 3) -> Path:
    """One task, ``samples`` episodes; each request starts with a few-shot assistant turn (context)."""
    sdk.configure(store=path)
    for k in range(samples):
        with sdk.session(task_id="gsm8k-17", sample=k) as s:
            messages = [
                {"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "2 + 2?"},
                FEW_SHOT,
                {"role": "user", "content": f"{k} + 1?"},
            ]
            _record(
                s,
                messages,
                {"role": "assistant", "content": f"{k} + 1 = {k + 1}."},
                logprobs=[
                    {"token": f"{k}", "logprob": -0.01},
                    {"token": " + 1 =", "logprob": -0.2},
                    {"token": f" {k + 1}.", "logprob": -2.5 if k else -0.05},
                ],
                completion_token_ids=[100 + k, 7, 200 + k],
            )
            s.reward(1.0 if k == 0 else 0.0)
    sdk.flush()
    return path


def test_viewer_shows_the_trainers_advantages(tmp_path: Path) -> None:
    """A group of 2 with rewards [1, 0]: the page and the trainer both say ±0.707 (TRL's sample std)."""
    pytest.importorskip("transformers")
    import json

    from trainers._tiny import build_tiny_tokenizer
    from trainers.base import TrainerConfig
    from trainers.data import prepare_data

    store = _store(tmp_path / "store", samples=2)
    build_report(store, tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    data = json.loads(page.split('id="data"', 1)[1].split(">", 1)[1].split("</script>", 1)[0])
    shown = {v["id"]: v["adv"] for v in data["episodes"]}
    config = TrainerConfig(model="unused", group_size=2)
    prepared = prepare_data(str(store), config, tokenizer=build_tiny_tokenizer())
    trained = {s.episode_id: s.advantage for s in prepared.groups[0].sequences}
    assert sorted(shown.values()) == [-0.707, 0.707]
    assert shown.keys() == trained.keys()
    assert all(shown[k] == round(trained[k], 4) for k in shown)


def test_trained_tokens_are_the_threads_own_completions(tmp_path: Path) -> None:
    from sdk._sources import episodes_with_calls

    eps = list(episodes_with_calls(_store(tmp_path / "store", samples=1)))
    (view,) = [episode_view(se) for se in eps]
    assert [m["r"] for m in view["msgs"]] == ["system", "user", "assistant", "user", "assistant"]
    # The few-shot assistant message came in the request: context, no token data, not trained.
    assert "2" not in view["turns"]
    turn = view["turns"]["4"]
    assert turn["trained"] is True
    assert turn["ids"] == [100, 7, 200]
    assert turn["lp"] == [-0.01, -0.2, -0.05]
    # The store keeps ids and logprob numbers, not the server's token strings: the page shows the ids,
    # or the text when a tokenizer decodes them (--tokenizer).
    assert turn["toks"] is None
    (decoded,) = [episode_view(se, decode=lambda i: f"<{i}>") for se in eps]
    assert decoded["turns"]["4"]["toks"] == ["<100>", "<7>", "<200>"]


def test_cli_writes_a_self_contained_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _store(tmp_path / "store")
    out = tmp_path / "report.html"
    assert main([str(store), "--out", str(out)]) == 0
    assert "3 episodes of 1 tasks in 1 task groups (3 with token data)" in capsys.readouterr().out
    page = out.read_text()
    # Offline: nothing is loaded from anywhere.
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "</script>" not in page.split('id="data"', 1)[1].split("</script>", 1)[0]


def test_parquet_source(tmp_path: Path) -> None:
    pytest.importorskip("polars")
    from sdk.episodes import export

    export(_store(tmp_path / "store"), tmp_path / "eps.parquet", rejects=False)
    summary = build_report(tmp_path / "eps.parquet", tmp_path / "r.html")
    assert (summary.episodes, summary.groups, summary.token_episodes) == (3, 1, 3)


def test_cli_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "r.html")]) == 2
    bad = tmp_path / "bad.parquet"
    bad.write_text("not parquet")
    assert main([str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_script_in_content_stays_text(tmp_path: Path) -> None:
    ep = {
        "episode_id": "s:0",
        "task_id": "t",
        "messages": [{"role": "user", "content": "</script><script>alert(1)</script>"}],
        "turns": [],
        "rewards": [],
    }
    build_report([SourcedEpisode(ep)], tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "<script>alert(1)" not in page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no chromium (Debian: apt-get install chromium)")
def test_page_in_headless_chromium(tmp_path: Path) -> None:
    store = _store(tmp_path / "store")
    out = tmp_path / "report.html"
    build_report(store, out)
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"]
    url = out.resolve().as_uri()
    dom = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
    assert "3 of 3 episodes · 1 task group" in dom
    assert re.search(r'<span class="r reward">1\.00</span>', dom)
    assert re.search(r'<span class="a pos">A \+1\.15</span>', dom)  # (1 - 1/3) / (sample std + 1e-4), as TRL
    # The first episode is shown: its generated turn's tokens highlighted with their behaviour logprobs
    # (as ids: the store keeps ids and logprob numbers; --tokenizer shows their text).
    trained = re.findall(r'<span class="tok trained" data-logprob="([^"]+)"[^>]*>([^<]*)</span>', dom)
    assert trained == [("-0.01", "⟨100⟩"), ("-0.2", "⟨7⟩"), ("-0.05", "⟨200⟩")]
    assert dom.count(">context<") == 0 and "2 + 2 = 4." in dom  # the few-shot turn: plain text
    shot = tmp_path / "report.png"
    subprocess.run([*browser, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

    # Filters read from the link's hash (the page writes them there as they change).
    def count(fragment: str) -> str:
        dom = subprocess.run(
            [*browser, "--dump-dom", url + fragment], capture_output=True, text=True, timeout=120
        ).stdout
        return re.search(r'<span id="count">([^<]*)</span>', dom).group(1) + (
            " (empty)" if '<div class="empty">No episode matches the filters.</div>' in dom else ""
        )

    assert count("#min=0.5") == "1 of 3 episodes · 1 task group"
    assert count("#max=0&status=ok") == "2 of 3 episodes · 1 task group"
    assert count("#task=nomatch") == "0 of 3 episodes · 0 task groups (empty)"


@pytest.mark.skipif(_chromium() is None, reason="no chromium (Debian: apt-get install chromium)")
def test_10k_episodes_page_and_filter(tmp_path: Path) -> None:
    """10 000 episodes: the page draws one page of 100 rows, and a filter runs over all of them."""
    episodes = []
    for i in range(10_000):
        messages = [{"role": "user", "content": f"{i} + {i}?"}, {"role": "assistant", "content": str(2 * i)}]
        ep = {"episode_id": f"s{i}:0", "session_id": f"s{i}", "task_id": f"t{i // 8}", "sample": i % 8}
        episodes.append(SourcedEpisode({**ep, "messages": messages, "reward": float(i % 4 == 0)}))
    out = tmp_path / "big.html"
    summary = build_report(episodes, out)
    assert summary.episodes == 10_000 and summary.groups == 1250
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"]
    url = out.resolve().as_uri() + "#min=1"
    dom = subprocess.run([*browser, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    assert "2500 of 10000 episodes · 1250 task groups" in dom
    assert dom.count('<div class="row') == 100 and "page 1 / 25" in dom


def _hostile_store(path: Path) -> dict[str, str]:
    """What a real store can hold that a page must survive; returns each episode's id by its case."""
    sdk.configure(store=path)
    ids = {}

    def one(case: str, sample: int, messages: list[Any], response: dict[str, Any], **kw: Any) -> None:
        with sdk.session(task_id="hostile", sample=sample) as s:
            _record(s, messages, response, **kw)
            s.reward(float(sample))
        ids[case] = f"{s.session_id}:0"

    # A server may report -inf for a token; the text is shown beside the token boxes (no --tokenizer).
    one(
        "inf",
        0,
        [{"role": "user", "content": "What is 6 x 7?"}],
        {"role": "assistant", "content": "The answer is 42."},
        logprobs=[-0.1, -math.inf, -0.3],
        completion_token_ids=[11, 12, 13],
    )
    one(
        "tools",
        1,
        [{"role": "user", "content": "Add 2 and 3."}],
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "function": "add(2, 3)"}]},
        tools=[{"type": "function", "function": "add"}, {"type": "function", "function": {"name": "mul"}}],
    )
    # The gateway stores lone surrogates (a client's broken JSON escapes) as they came.
    one(
        "text",
        2,
        [{"role": "user", "content": "caf\ud800e </script><script>document.title='pwned'</script>"}],
        {"role": "assistant", "content": "a lone \udc00 surrogate"},
    )
    sdk.flush()
    return ids


@pytest.mark.skipif(_chromium() is None, reason="no chromium (Debian: apt-get install chromium)")
def test_hostile_store_renders_in_headless_chromium(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _hostile_store(tmp_path / "store")
    out = tmp_path / "report.html"
    title = "mine __DATA__ __TITLE__ </title><script>alert(1)</script>"
    assert main([str(tmp_path / "store"), "--out", str(out), "--title", title]) == 0
    assert (
        "3 episodes of 1 tasks in 1 task groups (1 with token data; 2 malformed message/tool fields shown as-is)"
        in capsys.readouterr().out
    )
    page = out.read_text(encoding="utf-8")
    head = page.split("</title>", 1)[0]
    assert head.endswith("mine __DATA__ __TITLE__ &lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt;")
    assert "<script>alert(1)" not in page and "<script>document.title" not in page
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"]

    def shown(case: str) -> tuple[str, str]:
        url = out.resolve().as_uri() + "#ep=" + ids[case]
        dom = subprocess.run(
            [*browser, "--dump-dom", url], capture_output=True, text=True, timeout=120
        ).stdout
        root = re.search(r"<html[^>]*>", dom).group(0)
        # Drawn to the end (data-ready-ms is set last) and no script error.
        assert "data-ready-ms" in root and "data-error" not in root, (case, root)
        assert "The viewer failed" not in dom.split("<script", 1)[0]
        return dom, dom.split('<section id="detail">', 1)[1]

    dom, detail = shown("inf")
    assert "<title>tracerl episodes: mine __DATA__ __TITLE__ &lt;/title&gt;" in dom
    assert '<div class="content">The answer is 42.</div>' in detail  # the text, and the tokens beside it
    trained = re.findall(r'<span class="tok trained" data-logprob="([^"]+)"[^>]*>([^<]*)</span>', detail)
    assert trained == [("-0.1", "⟨11⟩"), ("-Infinity", "⟨12⟩"), ("-0.3", "⟨13⟩")]
    _, detail = shown("tools")
    assert "mul" in detail
    assert '"function": "add"}, mul</b>' in detail  # the malformed tool as it is stored, beside the good one
    assert "→ (malformed tool call) {" in detail
    _, detail = shown("text")
    assert "caf\ufffde &lt;/script&gt;&lt;script&gt;document.title='pwned'&lt;/script&gt;" in detail
    assert "a lone \ufffd surrogate" in detail
    shot = tmp_path / "report.png"
    url = out.resolve().as_uri() + "#ep=" + ids["inf"]
    subprocess.run([*browser, f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000  # a drawn page, not a blank one


def test_an_unreadable_episode_does_not_stop_the_report(tmp_path: Path) -> None:
    good = {"episode_id": "s:0", "task_id": "t", "messages": [{"role": "user", "content": "hi"}], "turns": []}
    broken = {**good, "episode_id": "b:0", "turns": ["not a turn"]}
    odd = {**good, "episode_id": "o:0", "messages": ["just a string", {"role": 7, "content": "x"}]}
    summary = build_report([SourcedEpisode(e) for e in (good, broken, odd)], tmp_path / "r.html")
    assert (summary.episodes, summary.malformed) == (3, 3)
    views = {v["id"]: v for v in json.loads(_data_of(tmp_path / "r.html"))["episodes"]}
    assert views["b:0"]["status"] == "unreadable" and "could not show" in views["b:0"]["msgs"][0]["c"]
    assert [m["r"] for m in views["o:0"]["msgs"]] == ["(malformed)", "7"]


def _data_of(page: Path) -> str:
    return page.read_text().split('id="data" type="application/json">', 1)[1].split("</script>", 1)[0]


def _data(page: Path) -> dict[str, Any]:
    return json.loads(page.read_text().split('id="data"', 1)[1].split(">", 1)[1].split("</script>", 1)[0])


def test_evaluation_sessions_are_not_in_training_groups_and_one_split_can_be_shown(tmp_path: Path) -> None:
    sdk.configure(store=tmp_path / "store")
    for split, rewards in (("train-round-0", (1.0, 0.0)), ("eval-round-0", (1.0, 1.0))):
        for k, r in enumerate(rewards):
            with sdk.session(task_id="t-1", sample=k, split=split) as s:
                _record(s, [{"role": "user", "content": "q"}], {"role": "assistant", "content": "a"})
                s.reward(r)
    sdk.flush()
    summary = build_report(tmp_path / "store", tmp_path / "all.html")
    groups = {g["task"]: g["n"] for g in _data(tmp_path / "all.html")["groups"]}
    assert summary.groups == 2 and groups == {"t-1 [train-round-0]": 2, "t-1 [eval-round-0]": 2}
    assert main([str(tmp_path / "store"), "--out", str(tmp_path / "train.html"), "--split", "train-*"]) == 0
    data = _data(tmp_path / "train.html")
    assert [g["task"] for g in data["groups"]] == ["t-1"] and len(data["episodes"]) == 2
    assert sorted(v["adv"] for v in data["episodes"]) == [-0.707, 0.707]
