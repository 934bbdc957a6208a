"""The viewer page: HTML, CSS and JavaScript in one string (``__TITLE__`` and ``__DATA__`` filled in).

No external resource: the file opens offline. Data goes into the DOM through ``textContent`` only. A script
error is shown on the page and kept in ``<html data-error>``; a page drawn to the end has ``data-ready-ms``.
"""

from __future__ import annotations

__all__ = ["PAGE"]

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root { --bg:#f7f7f8; --panel:#fff; --line:#e3e3e8; --ink:#1d1d22; --muted:#6b6b76; --accent:#3b5bdb;
        --good:#2b8a3e; --bad:#c92a2a; --sys:#f1f3f5; --user:#e7f5ff; --asst:#fff; --tool:#fff9db; }
* { box-sizing: border-box; }
body { margin:0; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:var(--ink); background:var(--bg); }
header { display:flex; gap:16px; align-items:center; flex-wrap:wrap; padding:10px 16px; background:var(--panel);
         border-bottom:1px solid var(--line); position:sticky; top:0; z-index:2; }
header h1 { font-size:16px; margin:0 8px 0 0; }
header label { color:var(--muted); font-size:12px; display:flex; gap:6px; align-items:center; }
header input, header select { font:inherit; padding:3px 6px; border:1px solid var(--line); border-radius:4px; }
header input[type=number] { width:70px; }
#count { font-weight:600; }
main { display:grid; grid-template-columns: minmax(340px, 36%) 1fr; height: calc(100vh - 54px); }
#list { overflow:auto; border-right:1px solid var(--line); background:var(--panel); }
#detail { overflow:auto; padding:16px 22px; }
.group { padding:8px 12px; background:#eef0f4; border-top:1px solid var(--line); font-size:12px; color:var(--muted);
         display:flex; justify-content:space-between; position:sticky; top:0; }
.group b { color:var(--ink); font-size:13px; }
.row { display:grid; grid-template-columns: 1fr 64px 70px 80px; gap:6px; padding:6px 12px; cursor:pointer;
       border-top:1px solid #f0f0f3; font-variant-numeric: tabular-nums; }
.row:hover { background:#f5f7ff; }
.row.sel { background:#e5ebff; }
.row .r, .row .a { text-align:right; }
.pos { color:var(--good); } .neg { color:var(--bad); }
.status { font-size:11px; padding:1px 6px; border-radius:8px; background:#eee; justify-self:end; }
.status.error, .status.incomplete { background:#ffe3e3; color:var(--bad); }
#pager { display:flex; gap:8px; align-items:center; padding:8px 12px; border-top:1px solid var(--line); }
#pager button { font:inherit; padding:2px 10px; }
.meta { display:flex; flex-wrap:wrap; gap:8px 18px; margin:4px 0 14px; color:var(--muted); font-size:13px; }
.meta b { color:var(--ink); }
.msg { border:1px solid var(--line); border-radius:8px; margin:10px 0; padding:8px 12px; background:var(--asst); }
.msg.system { background:var(--sys); } .msg.user { background:var(--user); } .msg.tool { background:var(--tool); }
.role { font-size:11px; text-transform:uppercase; letter-spacing:.05em; color:var(--muted); margin-bottom:4px;
        display:flex; justify-content:space-between; }
.content { white-space:pre-wrap; word-break:break-word; }
.call { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size:12.5px; background:#f8f9fa;
        border:1px solid var(--line); border-radius:6px; padding:6px 8px; margin-top:6px; white-space:pre-wrap; }
.reason { color:var(--muted); font-style:italic; white-space:pre-wrap; border-left:3px solid var(--line);
          padding-left:8px; margin-bottom:6px; }
.turn { display:grid; grid-template-columns: repeat(auto-fit, minmax(260px, 1fr)); gap:6px 16px; }
.fatal { color:var(--bad); background:#fff5f5; border:1px solid #ffc9c9; padding:8px 12px; white-space:pre-wrap; }
.tokens { white-space:pre-wrap; word-break:break-word; font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
          font-size:12.5px; line-height:1.9; }
.tok { border-radius:3px; padding:1px 0; }
.tok.trained { outline:1px solid rgba(59,91,219,.35); }
.legend { font-size:12px; color:var(--muted); margin:2px 0 8px; }
.legend .tok { padding:1px 4px; }
.empty { color:var(--muted); padding:24px; }
.call.bad { border-color:#ffc9c9; background:#fff5f5; color:var(--bad); }
#toolcalls.bad { color:var(--bad); }
h2 { font-size:15px; margin:0; }
</style>
</head>
<body>
<header>
  <h1 id="title"></h1>
  <span id="count"></span>
  <span id="toolcalls"></span>
  <label>task <input id="f-task" type="search" placeholder="contains…"></label>
  <label>agent <input id="f-agent" type="search" placeholder="contains…"></label>
  <label>reward ≥ <input id="f-min" type="number" step="any"></label>
  <label>≤ <input id="f-max" type="number" step="any"></label>
  <label>status <select id="f-status"><option value="">all</option></select></label>
  <label><input id="f-tokens" type="checkbox"> token data only</label>
  <label><input id="f-badcalls" type="checkbox"> malformed tool calls only</label>
</header>
<main>
  <section id="list"><div id="rows"></div><div id="pager"></div></section>
  <section id="detail"><div class="empty">Select an episode.</div></section>
</main>
<script>
// Any script error is shown, not a blank page (and kept in the root element's data-error, for tests).
window.addEventListener("error", ev => {
  document.documentElement.dataset.error = String(ev.message);
  const box = document.createElement("div");
  box.className = "fatal";
  box.textContent = "The viewer failed: " + ev.message;
  document.body.prepend(box);
});
</script>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const EPS = DATA.episodes, GROUPS = new Map(DATA.groups.map(g => [String(g.task), g]));
const PAGE_SIZE = 100;
let filtered = EPS, page = 0, selected = null;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function num(x, d = 2) { return x === null || x === undefined ? "–" : Number(x).toFixed(d); }
function signed(x) { return x === null || x === undefined ? "–" : (x > 0 ? "+" : "") + Number(x).toFixed(2); }

document.getElementById("title").textContent = DATA.title;
{
  // Malformed: an answer that opened a tool call the server could not parse (returned as text, not run).
  const tc = DATA.tool_calls || {parsed: 0, malformed: 0}, n = tc.parsed + tc.malformed;
  const box = document.getElementById("toolcalls");
  box.textContent = n ? `tool calls: ${tc.parsed} parsed · ${tc.malformed} malformed (${(100 * tc.malformed / n).toFixed(1)}%)` : "";
  box.className = tc.malformed ? "bad" : "";
}
for (const s of [...new Set(EPS.map(e => e.status))].sort()) {
  const o = el("option", null, s); o.value = s; document.getElementById("f-status").appendChild(o);
}

function applyFilters() {
  const task = document.getElementById("f-task").value.trim().toLowerCase();
  const agent = document.getElementById("f-agent").value.trim().toLowerCase();
  const min = parseFloat(document.getElementById("f-min").value), max = parseFloat(document.getElementById("f-max").value);
  const status = document.getElementById("f-status").value, tokens = document.getElementById("f-tokens").checked;
  const badcalls = document.getElementById("f-badcalls").checked;
  filtered = EPS.filter(e =>
    (!task || String(e.task ?? "").toLowerCase().includes(task)) &&
    (!agent || String(e.agent ?? "").toLowerCase().includes(agent)) &&
    (isNaN(min) || (e.reward !== null && e.reward >= min)) &&
    (isNaN(max) || (e.reward !== null && e.reward <= max)) &&
    (!status || e.status === status) &&
    (!tokens || Object.keys(e.turns).length > 0) &&
    (!badcalls || e.malformed_tool_calls > 0));
  page = 0;
  renderList();
  if (!selected || !filtered.includes(selected)) select(filtered[0] || null);
  else writeHash();
}

// The filters and the selected episode live in the URL's hash (#task=…&min=…&ep=…): a link shows the same view.
const FILTERS = [["task", "f-task"], ["agent", "f-agent"], ["min", "f-min"], ["max", "f-max"], ["status", "f-status"]];
function writeHash() {
  const q = new URLSearchParams();
  for (const [k, id] of FILTERS) { const v = document.getElementById(id).value.trim(); if (v) q.set(k, v); }
  if (document.getElementById("f-tokens").checked) q.set("tokens", "1");
  if (document.getElementById("f-badcalls").checked) q.set("badcalls", "1");
  if (selected) q.set("ep", selected.id);
  const hash = "#" + q.toString();
  if (location.hash !== hash) history.replaceState(null, "", hash);
}
function readHash() {
  const q = new URLSearchParams(location.hash.slice(1));
  for (const [k, id] of FILTERS) if (q.has(k)) document.getElementById(id).value = q.get(k);
  document.getElementById("f-tokens").checked = q.get("tokens") === "1";
  document.getElementById("f-badcalls").checked = q.get("badcalls") === "1";
  return q.get("ep") || "";
}

function renderList() {
  const rows = document.getElementById("rows");
  rows.replaceChildren();
  const tasks = new Set(filtered.map(e => e.group));
  document.getElementById("count").textContent =
    `${filtered.length} of ${EPS.length} episodes · ${tasks.size} task group${tasks.size === 1 ? "" : "s"}`;
  const slice = filtered.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
  let last;
  for (const e of slice) {
    if (e.group !== last) {
      last = e.group;
      const g = GROUPS.get(String(e.group)) || {};
      const h = el("div", "group");
      const left = el("span"); left.appendChild(el("b", null, e.group ?? "(no task)"));
      h.appendChild(left);
      h.appendChild(el("span", null, `n=${g.n ?? "?"} · mean ${num(g.mean)} · std ${num(g.std)}`));
      rows.appendChild(h);
    }
    const r = el("div", "row" + (e === selected ? " sel" : ""));
    r.dataset.id = e.id;
    const bad = e.malformed_tool_calls ? ` · ${e.malformed_tool_calls} malformed tool call${e.malformed_tool_calls === 1 ? "" : "s"}` : "";
    r.appendChild(el("span", bad ? "neg" : null, `sample ${e.sample ?? "–"} · ${e.calls} call${e.calls === 1 ? "" : "s"}` + bad));
    r.appendChild(el("span", "r reward", num(e.credit)));
    r.appendChild(el("span", "a " + (e.adv > 0 ? "pos" : e.adv < 0 ? "neg" : ""), "A " + signed(e.adv)));
    r.appendChild(el("span", "status " + e.status, e.status));
    r.addEventListener("click", () => select(e));
    rows.appendChild(r);
  }
  const pager = document.getElementById("pager");
  pager.replaceChildren();
  const pages = Math.max(1, Math.ceil(filtered.length / PAGE_SIZE));
  const prev = el("button", null, "‹ prev"), next = el("button", null, "next ›");
  prev.disabled = page === 0; next.disabled = page >= pages - 1;
  prev.onclick = () => { page--; renderList(); }; next.onclick = () => { page++; renderList(); };
  pager.append(prev, el("span", null, `page ${page + 1} / ${pages}`), next);
}

function lpColor(lp) {
  // Behaviour probability exp(lp): confident tokens pale blue, unlikely ones orange-red.
  const p = Math.exp(Math.max(-20, Math.min(0, lp)));
  const hue = 20 + 200 * p;
  return `hsla(${hue}, 85%, 62%, ${0.25 + 0.35 * (1 - p)})`;
}

function tokensView(turn) {
  const box = el("div", "tokens");
  const n = Math.max((turn.ids || []).length, (turn.lp || []).length);
  for (let i = 0; i < n; i++) {
    // Non-finite logprobs arrive as the strings "-Infinity", "Infinity", "NaN" (strict JSON has no such numbers).
    const lp = turn.lp && turn.lp[i] !== null && turn.lp[i] !== undefined ? Number(turn.lp[i]) : null;
    const id = turn.ids ? turn.ids[i] : null;
    const text = turn.toks && turn.toks[i] !== null && turn.toks[i] !== undefined ? turn.toks[i] : `⟨${id}⟩`;
    const t = el("span", "tok" + (turn.trained ? " trained" : ""), text);
    if (lp !== null && lp !== undefined) {
      t.dataset.logprob = lp;
      if (turn.trained) t.style.background = lpColor(lp);
    }
    t.title = `token ${id ?? "?"} · logprob ${lp === null || lp === undefined ? "–" : Number(lp).toFixed(4)}` +
              (turn.trained ? " · trained" : " · context (not trained)");
    box.appendChild(t);
  }
  return box;
}

function select(e) {
  selected = e;
  for (const r of document.querySelectorAll(".row")) r.classList.toggle("sel", e !== null && r.dataset.id === e.id);
  const d = document.getElementById("detail");
  d.replaceChildren();
  writeHash();
  if (!e) { d.appendChild(el("div", "empty", "No episode matches the filters.")); return; }
  d.appendChild(el("h2", null, e.id));
  const m = el("div", "meta");
  const add = (k, v) => { const s = el("span", null, k + " "); s.appendChild(el("b", null, v)); m.appendChild(s); };
  add("task", e.task ?? "–"); add("sample", e.sample ?? "–");
  add("reward", num(e.reward)); add("advantage", signed(e.adv));
  for (const [name, value] of e.rewards) if (name !== "reward") add(name, num(value));
  add("status", e.status); add("calls", e.calls); add("model", e.model ?? "–");
  if (e.malformed_tool_calls) add("malformed tool calls", e.malformed_tool_calls);
  if (e.agent) add("agent", e.agent);
  add("token-faithful", e.faithful ? "yes" : "no");
  if (e.tools.length) add("tools", e.tools.join(", "));
  d.appendChild(m);
  if (Object.keys(e.turns).length) {
    const lg = el("div", "legend");
    lg.appendChild(el("span", "tok trained", "token"));
    lg.appendChild(document.createTextNode(" trained (gets gradient), coloured by behaviour probability: "));
    const hi = el("span", "tok trained", "likely"); hi.style.background = lpColor(-0.01);
    const lo = el("span", "tok trained", "unlikely"); lo.style.background = lpColor(-4);
    lg.append(hi, document.createTextNode(" … "), lo, document.createTextNode(" · hover a token for its logprob"));
    d.appendChild(lg);
  }
  e.msgs.forEach((msg, i) => {
    const box = el("div", "msg " + msg.r);
    const role = el("div", "role");
    role.appendChild(el("span", null, msg.r + (msg.n ? ` · ${msg.n}` : "") + (msg.tid ? ` · ${msg.tid}` : "")));
    const turn = e.turns[String(i)];
    if (msg.r === "assistant") role.appendChild(el("span", null, turn ? (turn.trained ? "generated · trained" : "context") : ""));
    box.appendChild(role);
    if (msg.rc) box.appendChild(el("div", "reason", msg.rc));
    // The text always; a generated turn's tokens beside it.
    const text = msg.c !== null && msg.c !== undefined && msg.c !== "" ? el("div", "content", msg.c) : null;
    if (turn && (turn.ids || turn.lp)) {
      const row = el("div", "turn");
      if (text) row.appendChild(text);
      row.appendChild(tokensView(turn));
      box.appendChild(row);
    } else if (text) box.appendChild(text);
    if (msg.mt) box.appendChild(el("div", "call bad",
      "⚠ malformed tool call: this answer opened a tool call the server could not parse, so it came back as text and no tool ran"));
    for (const [name, args, id] of msg.tc || []) {
      if (name === null) {  // not an OpenAI tool call: shown as it is stored
        box.appendChild(el("div", "call", `→ (malformed tool call) ${args}`));
        continue;
      }
      let pretty = args;
      try { pretty = JSON.stringify(JSON.parse(args), null, 1).replace(/\n\s*/g, " "); } catch (_) {}
      box.appendChild(el("div", "call", `→ ${name}(${pretty})` + (id ? `   [${id}]` : "")));
    }
    d.appendChild(box);
  });
}

for (const id of ["f-task", "f-agent", "f-min", "f-max", "f-status", "f-tokens", "f-badcalls"]) document.getElementById(id).addEventListener("input", applyFilters);
const fromHash = readHash();
applyFilters();
if (fromHash) {
  const i = filtered.findIndex(e => e.id === fromHash);
  if (i >= 0) { page = Math.floor(i / PAGE_SIZE); renderList(); select(filtered[i]); }
}
// Time from navigation to the first page drawn (read by tests/bench/view.py).
document.documentElement.dataset.readyMs = Math.round(performance.now());
</script>
</body>
</html>
"""
