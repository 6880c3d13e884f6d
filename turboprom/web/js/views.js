// TurboProm's own pages: planner (plans, why adopted/retired, savings over time), query log (top
// queries by CPU), cost report, cardinality explorer, live congestion, KedgeFlow audit.
import { h, api, ago, fmtNum, fmtBytes, table, errorBox, formatDuration } from "./common.js";
import { seconds } from "./units.js";

function section(title, ...children) { return h("section", { class: "card" }, h("h2", {}, title), ...children); }
const when = t => t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–";
const graphLink = (expr, text) => h("a", { class: "mono", href: `/graph?g0.expr=${encodeURIComponent(expr)}&g0.tab=0&g0.range_input=1h` }, text || expr);

// A small uPlot time chart of a few series (x in seconds).
function miniChart(xs, series, fmt) {
  const el = h("div", { class: "chart mini" });
  const colors = ["#e6522c", "#1f77b4", "#2ca02c", "#9467bd"];
  requestAnimationFrame(() => {
    // eslint-disable-next-line no-undef
    new uPlot({
      width: Math.max(300, el.clientWidth || 800), height: 200, padding: [10, 36, 0, 4],
      series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: colors[i % colors.length], width: 1.5, value: (u, v) => v === null ? "–" : fmt(v) }))],
      axes: [{}, { size: 70, values: (u, ss) => ss.map(v => fmt(v)) }],
    }, [xs, ...series.map(s => s.values)], el);
  });
  return el;
}

// ------------------------------------------------------------------ /planner
export async function plannerPage(main) {
  main.append(h("h1", {}, "Planner: summary plans"));
  let p;
  try { p = await api("/api/v1/planner/plans"); } catch (e) { main.append(errorBox(e)); return; }
  const s = p.summarizer || {};
  main.append(h("p", { class: "muted" }, `${p.plans.length} active plans · summarizer: ${fmtNum(s.cpu_seconds || 0, 3)} CPU s over ${s.samples || 0} samples · ` +
    `storage budget ${fmtBytes(p.budget_bytes)} · used ${fmtBytes(p.plans.reduce((a, x) => a + (x.bytes || 0), 0))}`));
  main.append(section("Active plans", table(["Plan", "Scope", "Algorithm", "Pane", "State", "Hits", "Saved", "Cost", "Measured", "Why adopted"],
    p.plans.map(x => {
      const m = x.measured;
      return [h("a", { class: "mono", href: `/api/v1/planner/plans/${encodeURIComponent(x.id)}` }, x.id),
        h("span", { class: "mono" }, `${x.metric}{${(x.matchers || []).join(", ")}}`), x.algorithm,
        formatDuration((x.pane_ms || 0) / 1000), `${(x.backfill && x.backfill.state) || ""} ${x.coverage ? `(${x.coverage.panes} panes)` : ""}`,
        String(x.hits ?? 0), `${x.saved_samples ?? 0} samples`,
        `${fmtBytes(x.bytes)} · ingest ${fmtNum(x.ingest_cpu_seconds || 0, 3)} CPU s`,
        m ? `${m.runs} shadow runs: summary ${seconds(m.served_p50_s)} vs raw ${seconds(m.raw_p50_s)}, saved ${fmtNum(m.cpu_saved_s, 3)} CPU s` : "not measured yet",
        h("div", { class: "reason" }, x.reason || "")];
    }), { empty: "no plan adopted yet: recurring queries become candidates below" })));
  main.append(section("Decisions (why adopted, why retired)", table(["Time", "Action", "Plan", "Reason"],
    [...(p.decisions || [])].reverse().map(d => [when(d.time), h("span", { class: `badge ${d.action === "adopt" ? "up" : "down"}` }, d.action), h("span", { class: "mono" }, d.sds), h("div", { class: "reason" }, d.reason)]))));
  if ((p.retired || []).length) {
    main.append(section("Retired plans", table(["Plan", "Metric", "Algorithm", "Reason"], p.retired.map(r => [h("span", { class: "mono" }, r.id), r.metric, r.algorithm, h("div", { class: "reason" }, r.reason)]))));
  }
  try {
    const c = await api("/api/v1/planner/candidates");
    main.append(section("Recurring query patterns (candidates)", table(["Metric", "Algorithm", "Recent queries", "Mean raw CPU", "Patterns", "Last decision"],
      c.map(x => [h("span", { class: "mono" }, x.metric), x.algorithm, String(x.recent_queries), x.mean_raw_cpu_s === null ? "–" : seconds(x.mean_raw_cpu_s),
        h("div", { class: "mono small" }, (x.patterns || []).map(q => h("div", {}, q))), x.last_decision || ""]))));
  } catch (e) { main.append(errorBox(e)); }
  // Savings over time, from the query log: per minute, queries answered (partly) from summaries and CPU spent.
  try {
    const rows = await api("/api/v1/planner/query_log", { limit: 5000 });
    const buckets = new Map();
    for (const r of rows) {
      const m = Math.floor(r.arrival_ms / 60000) * 60;
      const b = buckets.get(m) || { summary: 0, raw: 0, cpuSummary: 0, cpuRaw: 0 };
      const served = (r.paths || []).some(x => String(x).startsWith("summary"));
      if (served) { b.summary++; b.cpuSummary += r.cpu_s || 0; } else { b.raw++; b.cpuRaw += r.cpu_s || 0; }
      buckets.set(m, b);
    }
    const xs = [...buckets.keys()].sort((a, b) => a - b);
    if (xs.length > 1) {
      main.append(section("Queries per minute by serving path (query log)",
        miniChart(xs, [{ label: "from summaries", values: xs.map(x => buckets.get(x).summary) }, { label: "raw only", values: xs.map(x => buckets.get(x).raw) }], v => fmtNum(v, 3)),
        miniChart(xs, [{ label: "CPU s (summary-served)", values: xs.map(x => buckets.get(x).cpuSummary) }, { label: "CPU s (raw)", values: xs.map(x => buckets.get(x).cpuRaw) }], v => seconds(v, 3))));
    }
  } catch (e) { /* query log disabled: the plans above still show */ }
}

// ------------------------------------------------------------------ /query-log
export async function queryLogPage(main) {
  main.append(h("h1", {}, "Query log: top queries"));
  let rows;
  try { rows = await api("/api/v1/planner/query_log", { limit: 5000 }); } catch (e) { main.append(errorBox(e)); return; }
  const by = new Map();
  for (const r of rows) {
    const k = r.pattern || r.expr;
    const g = by.get(k) || { pattern: k, example: r.expr, count: 0, cpu: 0, wall: 0, maxWall: 0, samples: 0, summary: 0, errors: 0, last: 0 };
    g.count++; g.cpu += r.cpu_s || 0; g.wall += r.wall_s || 0; g.maxWall = Math.max(g.maxWall, r.wall_s || 0);
    g.samples += r.samples || 0; g.errors += r.error ? 1 : 0; g.last = Math.max(g.last, r.arrival_ms);
    if ((r.paths || []).some(x => String(x).startsWith("summary"))) g.summary++;
    by.set(k, g);
  }
  const groups = [...by.values()].sort((a, b) => b.cpu - a.cpu);
  main.append(h("p", { class: "muted" }, `${rows.length} most recent queries, ${groups.length} patterns`));
  main.append(section("Top patterns by total CPU", table(["Pattern", "Queries", "Total CPU", "Mean wall", "Max wall", "Samples read", "From summaries", "Errors", "Last"],
    groups.slice(0, 50).map(g => [graphLink(g.example, g.pattern), String(g.count), seconds(g.cpu, 3), seconds(g.wall / g.count, 3), seconds(g.maxWall, 3),
      fmtNum(g.samples, 3), `${Math.round(100 * g.summary / g.count)}%`, String(g.errors), ago(g.last / 1000)]))));
  main.append(section("Slowest recent queries", table(["Query", "Kind", "Origin", "Wall", "CPU", "Samples", "Paths", "Error"],
    [...rows].sort((a, b) => (b.wall_s || 0) - (a.wall_s || 0)).slice(0, 30).map(r => [graphLink(r.expr), r.kind, r.origin || "",
      seconds(r.wall_s || 0, 3), seconds(r.cpu_s || 0, 3), fmtNum(r.samples || 0, 3), (r.paths || []).join(", "), r.error ? h("span", { class: "error" }, r.error) : ""]))));
}

// ------------------------------------------------------------------ /cost
export function costPage(main) {
  const since = h("select", {}, ["1h", "6h", "24h", "7d"].map(x => h("option", { value: x, selected: x === "24h" }, x)));
  const frame = h("iframe", { class: "report", title: "cost report" });
  const load = () => { frame.src = `/api/v1/cost_report?format=html&since=${since.value}`; };
  since.addEventListener("change", load);
  main.append(h("h1", {}, "Cost report"), h("div", { class: "toolbar" }, h("label", {}, "since ", since),
    h("a", { href: "/api/v1/cost_report?format=csv", class: "muted" }, "CSV"), h("a", { href: "/api/v1/cost_report", class: "muted" }, "JSON")), frame);
  load();
}

// ------------------------------------------------------------------ /cardinality
export function cardinalityPage(main) {
  const sel = h("input", { class: "wide mono", value: '{__name__=~".+"}', title: "series selector" });
  const focus = h("input", { class: "mono", placeholder: "focus label (e.g. instance)", size: 24 });
  const out = h("div");
  const run = async () => {
    out.replaceChildren(h("p", { class: "muted" }, "counting…"));
    const s = sel.value.trim() || '{__name__=~".+"}';
    try {
      const q = expr => api("/api/v1/query", { query: expr }, { post: true });
      const [total, byName, labels] = await Promise.all([q(`count(${s})`), q(`topk(20, count by (__name__) (${s}))`),
        api("/api/v1/labels", { "match[]": s })]);
      const parts = [h("p", {}, h("b", {}, total.result.length ? total.result[0].value[1] : "0"), ` series match ${s}`),
        section("Series by metric name", table(["Metric", "Series"], byName.result.map(r => [graphLink(`count by (instance) (${r.metric.__name__ || ""})`, r.metric.__name__), r.value[1]])))];
      const counts = await Promise.all(labels.filter(l => l !== "__name__").slice(0, 40).map(l => q(`count(count by (${l}) (${s}))`).then(r => [l, r.result.length ? +r.result[0].value[1] : 0])));
      parts.push(section("Distinct values per label name", table(["Label", "Values"], counts.sort((a, b) => b[1] - a[1]).map(([l, n]) => [
        h("a", { href: "#", class: "mono", onclick: e => { e.preventDefault(); focus.value = l; run(); } }, l), String(n)]))));
      const f = focus.value.trim();
      if (f) {
        const r = await q(`topk(30, count by (${f}) (${s}))`);
        parts.push(section(`Series by ${f}`, table([f, "Series"], r.result.map(x => [h("span", { class: "mono" }, x.metric[f] ?? ""), x.value[1]]))));
      }
      out.replaceChildren(...parts);
    } catch (e) { out.replaceChildren(errorBox(e)); }
  };
  sel.addEventListener("keydown", e => { if (e.key === "Enter") run(); });
  focus.addEventListener("keydown", e => { if (e.key === "Enter") run(); });
  main.append(h("h1", {}, "Cardinality explorer"), h("div", { class: "toolbar" }, sel, focus, h("button", { class: "exec", onclick: run }, "Count")), out);
  run();
}

// ------------------------------------------------------------------ /congestion
export function congestionPage(main) {
  const age = h("span", { class: "muted" });
  const clusters = h("div"), instances = h("div");
  main.append(h("h1", {}, "Congestion (live) ", age), clusters, instances);
  let snap = null;
  const n = v => fmtNum(v, 3);
  const render = d => {
    snap = d;
    clusters.replaceChildren(section("Clusters", table(["Cluster", "Model", "Instances", "Stale", "Queue", "Backlog tokens", "Utilization", "Price s/token"],
      (d.clusters || []).map(c => [c.cluster, c.model_name ?? c.model, String(c.instances), String(c.stale_instances ?? 0), n(c.queue_length), n(c.backlog_tokens),
        c.utilization === null ? "–" : `${n(c.utilization * 100)}%`, n(c.congestion_price_seconds_per_token)]))));
    instances.replaceChildren(section("Instances", table(["Instance", "Model", "Queue", "Running", "Backlog tokens", "Backlog", "KV usage", "Utilization", "Price s/token", "Data age", ""],
      (d.instances || []).map(i => [h("span", { class: "mono" }, i.instance), i.model_name ?? i.model, n(i.queue_length), n(i.running), n(i.backlog_tokens),
        i.backlog_seconds === null ? "–" : seconds(i.backlog_seconds, 3), i.kv_usage === null ? "–" : `${n(i.kv_usage * 100)}%`,
        i.utilization === null ? "–" : `${n(i.utilization * 100)}%`, n(i.congestion_price_seconds_per_token), i.age_seconds === null ? "–" : seconds(i.age_seconds, 3),
        i.stale ? h("span", { class: "badge down" }, "STALE") : ""]), { empty: "no serving instance reports yet" })));
  };
  const tick = () => { age.textContent = snap && snap.generated_at ? `snapshot ${ago(snap.generated_at)}` : ""; };
  api("/api/v1/congestion").then(render).catch(e => clusters.replaceChildren(errorBox(e)));
  const es = new EventSource("/api/v1/congestion/stream");
  es.addEventListener("congestion", ev => { try { render(JSON.parse(ev.data)); } catch { /* a partial event: wait for the next */ } });
  const timer = setInterval(tick, 500);
  return () => { es.close(); clearInterval(timer); };
}

// ------------------------------------------------------------------ /audit
export async function auditPage(main) {
  main.append(h("h1", {}, "KedgeFlow audit"));
  const verify = h("div");
  main.append(verify);
  api("/api/v1/audit/verify").then(v => verify.replaceChildren(section("Verification",
    h("p", {}, h("span", { class: `badge ${v.ok ? "up" : "down"}` }, v.ok ? "VERIFIED" : "PROBLEMS"), ` ${v.entries} entries, ${v.signed_heads} signed heads`),
    (v.problems || []).length ? h("ul", {}, v.problems.map(p => h("li", { class: "error" }, typeof p === "string" ? p : JSON.stringify(p)))) : "")))
    .catch(e => verify.replaceChildren(errorBox(e)));
  try {
    const entries = await api("/api/v1/audit", { limit: 500 });
    main.append(section("Entries (newest first)", table(["Seq", "Time", "Kind", "Tenant", "Detail", "Hash"], [...entries].reverse().map(e => [
      String(e.seq), e.ts_ms ? new Date(e.ts_ms).toISOString().replace("T", " ").slice(0, 19) : "", h("b", {}, e.kind || ""), e.tenant || "",
      h("code", { class: "small detail" }, JSON.stringify(e.data)), h("span", { class: "mono small", title: e.hash }, String(e.hash || "").slice(0, 12))]),
    { empty: "the audit log is empty: no action has been proposed yet" })));
  } catch (e) { main.append(errorBox(e)); }
}
