// TurboProm built-in page: expression browser (table + graph), planner and live congestion views.
// Plain JS and a small canvas chart: the page is served by the server itself and must work with no
// network access, so it loads no third-party scripts.
"use strict";

const COLORS = ["#e6522c", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#d62728", "#17becf", "#bcbd22", "#7f7f7f", "#ff7f0e"];

function $(sel) { return document.querySelector(sel); }
function fmtLabels(m) {
  const name = m.__name__ || "";
  const rest = Object.keys(m).filter(k => k !== "__name__").sort().map(k => `${k}="${m[k]}"`);
  return rest.length ? `${name}{${rest.join(", ")}}` : (name || "{}");
}
function fmtNum(x) {
  if (x === null || x === undefined) return "–";
  if (typeof x === "string") return x;
  if (!isFinite(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return x.toExponential(3);
  return (Math.round(x * 1000) / 1000).toString();
}

// ---------------------------------------------------------------- tabs
function showTab(name) {
  document.querySelectorAll(".tab").forEach(s => s.hidden = s.id !== "tab-" + name);
  document.querySelectorAll("header nav a").forEach(a => a.classList.toggle("active", a.dataset.tab === name));
  if (name === "planner") loadPlanner();
  if (name === "congestion") startCongestion(); else stopCongestion();
}
document.querySelectorAll("header nav a").forEach(a => a.addEventListener("click", e => { e.preventDefault(); location.hash = a.dataset.tab; showTab(a.dataset.tab); }));
document.querySelectorAll(".subtabs button").forEach(b => b.addEventListener("click", () => {
  document.querySelectorAll(".subtabs button").forEach(x => x.classList.toggle("active", x === b));
  $("#view-graph").hidden = b.dataset.view !== "graph";
  $("#view-table").hidden = b.dataset.view !== "table";
}));

// ---------------------------------------------------------------- query
async function api(path, params) {
  const body = new URLSearchParams(params);
  const r = await fetch(path, { method: "POST", body, headers: { "Content-Type": "application/x-www-form-urlencoded" } });
  const j = await r.json();
  if (j.status !== "success") throw new Error(`${j.errorType}: ${j.error}`);
  return j;
}

async function runQuery(ev) {
  if (ev) ev.preventDefault();
  const expr = $("#expr").value.trim();
  if (!expr) return;
  const now = Date.now() / 1000;
  const range = +$("#range").value;
  const step = $("#step").value.trim() || String(Math.max(1, Math.round(range / 250)));
  const exact = $("#exact").checked ? "true" : "false";
  $("#query-status").textContent = "running…";
  $("#notes").textContent = "";
  const t0 = performance.now();
  try {
    const [rng, inst] = await Promise.all([
      api("/api/v1/query_range", { query: expr, start: now - range, end: now, step, exact, stats: "all" }),
      api("/api/v1/query", { query: expr, time: now, exact }),
    ]);
    drawChart(rng.data);
    fillTable(inst.data);
    const notes = [...(rng.warnings || []), ...(rng.infos || [])];
    $("#notes").textContent = notes.join("\n");
    $("#query-status").textContent = `${(performance.now() - t0).toFixed(0)} ms, ${(rng.data.result || []).length} series`;
    history.replaceState(null, "", `?expr=${encodeURIComponent(expr)}#query`);
  } catch (e) {
    $("#query-status").innerHTML = `<span class="error">${e.message}</span>`;
  }
}
$("#query-form").addEventListener("submit", runQuery);
$("#expr").addEventListener("keydown", e => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); runQuery(); } });

function fillTable(data) {
  const tb = $("#result-table tbody");
  tb.innerHTML = "";
  const add = (k, v) => { const tr = document.createElement("tr"); tr.innerHTML = `<td></td><td></td>`; tr.children[0].textContent = k; tr.children[1].textContent = v; tb.appendChild(tr); };
  if (data.resultType === "scalar" || data.resultType === "string") { add("scalar", data.result[1]); return; }
  for (const s of data.result) {
    if (s.value) add(fmtLabels(s.metric), s.value[1]);
    else add(fmtLabels(s.metric), (s.values || []).map(v => `${v[1]} @${v[0]}`).join("\n"));
  }
  if (!data.result.length) add("(empty result)", "");
}

// A small line chart: shared time axis, auto-scaled value axis, gaps where a series has no point.
function drawChart(data) {
  const c = $("#chart"), ctx = c.getContext("2d");
  const W = c.width, H = c.height, L = 70, R = 12, T = 12, B = 28;
  ctx.clearRect(0, 0, W, H);
  const series = (data.result || []).map(s => ({ m: s.metric, pts: (s.values || []).map(v => [v[0], parseFloat(v[1])]).filter(p => isFinite(p[1])) }));
  let t0 = Infinity, t1 = -Infinity, v0 = Infinity, v1 = -Infinity;
  for (const s of series) for (const [t, v] of s.pts) { t0 = Math.min(t0, t); t1 = Math.max(t1, t); v0 = Math.min(v0, v); v1 = Math.max(v1, v); }
  const legend = $("#legend");
  legend.innerHTML = "";
  if (!isFinite(t0)) { ctx.fillStyle = "#8b949e"; ctx.font = "14px sans-serif"; ctx.fillText("no data", W / 2 - 24, H / 2); return; }
  if (v0 === v1) { v0 -= 1; v1 += 1; }
  if (t0 === t1) { t0 -= 1; t1 += 1; }
  const x = t => L + (t - t0) / (t1 - t0) * (W - L - R);
  const y = v => T + (1 - (v - v0) / (v1 - v0)) * (H - T - B);
  ctx.strokeStyle = "#d0d7de"; ctx.fillStyle = "#57606a"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
  for (let i = 0; i <= 5; i++) {
    const v = v0 + (v1 - v0) * i / 5, yy = y(v);
    ctx.beginPath(); ctx.moveTo(L, yy); ctx.lineTo(W - R, yy); ctx.stroke();
    ctx.fillText(fmtNum(v), 4, yy + 4);
  }
  for (let i = 0; i <= 6; i++) {
    const t = t0 + (t1 - t0) * i / 6, xx = x(t);
    ctx.fillText(new Date(t * 1000).toLocaleTimeString(), xx - 24, H - 8);
  }
  const step = series.length && series[0].pts.length > 1 ? series[0].pts[1][0] - series[0].pts[0][0] : 0;
  series.forEach((s, i) => {
    const col = COLORS[i % COLORS.length];
    ctx.strokeStyle = col; ctx.lineWidth = 1.6; ctx.beginPath();
    let prev = null;
    for (const [t, v] of s.pts) {
      if (prev === null || (step && t - prev > step * 1.5)) ctx.moveTo(x(t), y(v)); else ctx.lineTo(x(t), y(v));
      prev = t;
    }
    ctx.stroke();
    if (i < 50) { const d = document.createElement("div"); d.innerHTML = `<span class="swatch" style="background:${col}"></span>`; d.append(fmtLabels(s.m)); legend.appendChild(d); }
  });
  c.dataset.rendered = String(series.length);
}

// ---------------------------------------------------------------- planner
function cellRow(tb, values) {
  const tr = document.createElement("tr");
  for (const v of values) { const td = document.createElement("td"); td.textContent = v === null || v === undefined ? "" : (typeof v === "object" ? JSON.stringify(v) : String(v)); tr.appendChild(td); }
  tb.appendChild(tr);
}
async function loadPlanner() {
  try {
    const j = await (await fetch("/api/v1/planner/plans")).json();
    const tb = $("#plans tbody"); tb.innerHTML = "";
    for (const p of (j.data && j.data.plans) || []) {
      const scope = `${p.metric || ""}{${(p.matchers || []).map(m => typeof m === "string" ? m : JSON.stringify(m)).join(", ")}}`;
      cellRow(tb, [p.id, scope, p.algorithm, p.pane_ms ? `${p.pane_ms / 1000}s` : "", (p.backfill && p.backfill.state) || "",
        p.hits, p.bytes !== undefined ? `${(p.bytes / 1024).toFixed(1)} KiB` : "",
        `${p.saved_samples ?? 0} samples saved, ingest ${fmtNum(p.ingest_cpu_seconds)} CPU s`]);
    }
    const k = await (await fetch("/api/v1/planner/candidates")).json();
    const tc = $("#candidates tbody"); tc.innerHTML = "";
    for (const c of k.data || []) {
      cellRow(tc, [(c.patterns || []).join("  |  ") || c.metric, c.recent_queries, fmtNum(c.mean_raw_cpu_s), c.last_decision || c.algorithm]);
    }
  } catch (e) { console.error(e); }
}

// ---------------------------------------------------------------- congestion (server-sent events)
let es = null;
function renderCongestion(d) {
  const rows = (sel, items, cols) => {
    const tb = $(sel + " tbody"); tb.innerHTML = "";
    for (const it of items) { const tr = document.createElement("tr"); for (const c of cols) { const td = document.createElement("td"); td.textContent = fmtNum(it[c]); tr.appendChild(td); } tb.appendChild(tr); }
  };
  rows("#clusters", d.clusters || [], ["cluster", "model", "instances", "utilization", "backlog_tokens", "congestion_price_seconds_per_token"]);
  rows("#instances", d.instances || [], ["instance", "queue_length", "running", "backlog_tokens", "backlog_seconds", "kv_usage", "utilization", "congestion_price_seconds_per_token", "age_seconds"]);
  $("#cong-age").textContent = d.generated_at ? `updated ${new Date(d.generated_at * 1000).toLocaleTimeString()}` : "";
}
function startCongestion() {
  if (es) return;
  fetch("/api/v1/congestion").then(r => r.json()).then(j => renderCongestion(j.data || j)).catch(() => {});
  es = new EventSource("/api/v1/congestion/stream");
  const on = ev => { try { const j = JSON.parse(ev.data); renderCongestion(j.data || j); } catch (e) { } };
  es.addEventListener("congestion", on);
  es.onmessage = on;
}
function stopCongestion() { if (es) { es.close(); es = null; } }

// ---------------------------------------------------------------- start
fetch("/api/v1/status/buildinfo").then(r => r.json()).then(j => { $("#build").textContent = `version ${j.data.version}`; }).catch(() => {});
const qs = new URLSearchParams(location.search);
if (qs.get("expr")) { $("#expr").value = qs.get("expr"); runQuery(); }
showTab((location.hash || "#query").slice(1) || "query");
