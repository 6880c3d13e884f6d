// The operator pages Prometheus has, at Prometheus's paths: targets, service discovery, rules,
// alerts, TSDB status, flags, configuration, runtime & build information. Each reads the public API.
import { h, api, ago, fmtNum, fmtBytes, table, labelChips, errorBox } from "./common.js";

function health(state) {
  const s = String(state || "unknown").toLowerCase();
  return h("span", { class: `badge ${s}` }, s.toUpperCase());
}

function section(title, ...children) { return h("section", { class: "card" }, h("h2", {}, title), ...children); }

function groupBy(items, key) {
  const m = new Map();
  for (const it of items) { const k = key(it); if (!m.has(k)) m.set(k, []); m.get(k).push(it); }
  return m;
}

// ------------------------------------------------------------------ /targets
export async function targetsPage(main) {
  const onlyBad = h("input", { type: "checkbox" });
  const filter = h("input", { type: "search", placeholder: "filter by endpoint or labels" });
  const out = h("div");
  main.append(h("h1", {}, "Targets"), h("div", { class: "toolbar" }, h("label", {}, onlyBad, " unhealthy only"), filter), out);
  const d = await api("/api/v1/targets", { state: "active" });
  const render = () => {
    const f = filter.value.toLowerCase();
    const pools = groupBy(d.activeTargets, t => t.scrapePool);
    const cards = [];
    for (const [pool, targets] of [...pools.entries()].sort()) {
      const up = targets.filter(t => t.health === "up").length;
      const rows = targets.filter(t => (!onlyBad.checked || t.health !== "up") &&
        (!f || (t.scrapeUrl + JSON.stringify(t.labels)).toLowerCase().includes(f)))
        .map(t => [h("a", { href: t.scrapeUrl, class: "mono" }, t.scrapeUrl), health(t.health), labelChips(t.labels),
          ago(t.lastScrape), t.lastScrapeDuration ? `${fmtNum(t.lastScrapeDuration * 1000, 3)} ms` : "–",
          t.lastError ? h("span", { class: "error" }, t.lastError) : ""]);
      if (!rows.length && (onlyBad.checked || f)) continue;
      cards.push(section(`${pool} (${up}/${targets.length} up)`,
        table(["Endpoint", "State", "Labels", "Last scrape", "Scrape duration", "Error"], rows, { cls: "targets" })));
    }
    out.replaceChildren(...(cards.length ? cards : [h("p", { class: "muted" }, d.activeTargets.length ? "no target matches" : "no scrape targets are configured")]));
  };
  onlyBad.addEventListener("change", render);
  filter.addEventListener("input", render);
  render();
}

// ------------------------------------------------------------------ /service-discovery
export async function serviceDiscoveryPage(main) {
  const d = await api("/api/v1/targets");
  main.append(h("h1", {}, "Service discovery"));
  const pools = groupBy([...d.activeTargets.map(t => ({ ...t, kept: true })),
    ...d.droppedTargets.map(t => ({ ...t, kept: false, scrapePool: t.discoveredLabels.job || "" }))], t => t.scrapePool);
  if (!pools.size) main.append(h("p", { class: "muted" }, "no scrape jobs are configured"));
  for (const [pool, ts] of [...pools.entries()].sort()) {
    const kept = ts.filter(t => t.kept).length;
    main.append(section(`${pool} (${kept} / ${ts.length} active targets)`,
      table(["Discovered labels", "Target labels"], ts.map(t => [labelChips(t.discoveredLabels || {}),
        t.kept ? labelChips(t.labels) : h("span", { class: "muted" }, "Dropped")]))));
  }
}

// ------------------------------------------------------------------ /rules and /alerts
function ruleHealth(r) { return health(r.health === "ok" ? "up" : r.health === "err" ? "down" : r.health); }

export async function rulesPage(main) {
  const d = await api("/api/v1/rules");
  main.append(h("h1", {}, "Rules"));
  if (!d.groups.length) main.append(h("p", { class: "muted" }, "no rule files are loaded (rule_files in the configuration)"));
  for (const g of d.groups) {
    main.append(section(`${g.name}`, h("p", { class: "muted" }, `${g.file} · every ${g.interval}s · last evaluation ${ago(g.lastEvaluation)} · took ${fmtNum((g.evaluationTime || 0) * 1000, 3)} ms`),
      table(["Rule", "State", "Error", "Last evaluation", "Evaluation time"], g.rules.map(r => [
        h("div", {}, h("div", { class: "mono" }, `${r.type === "alerting" ? "alert" : "record"}: ${r.name}`),
          h("a", { class: "mono expr", href: `/graph?g0.expr=${encodeURIComponent(r.query)}&g0.tab=1` }, r.query),
          Object.keys(r.labels || {}).length ? labelChips(r.labels) : ""),
        ruleHealth(r), r.lastError ? h("span", { class: "error" }, r.lastError) : "", ago(r.lastEvaluation),
        `${fmtNum((r.evaluationTime || 0) * 1000, 3)} ms`]))));
  }
}

export async function alertsPage(main) {
  const d = await api("/api/v1/rules", { type: "alert" });
  const rules = d.groups.flatMap(g => g.rules.map(r => ({ ...r, group: g.name, file: g.file })));
  const count = s => rules.filter(r => r.state === s).length;
  main.append(h("h1", {}, "Alerts"),
    h("div", { class: "toolbar" }, h("span", { class: "badge inactive" }, `Inactive (${count("inactive")})`),
      h("span", { class: "badge pending" }, `Pending (${count("pending")})`), h("span", { class: "badge firing" }, `Firing (${count("firing")})`)));
  if (!rules.length) main.append(h("p", { class: "muted" }, "no alerting rules are loaded"));
  const order = { firing: 0, pending: 1, inactive: 2 };
  for (const r of rules.sort((a, b) => (order[a.state] ?? 3) - (order[b.state] ?? 3) || a.name.localeCompare(b.name))) {
    main.append(h("details", { class: `card alert ${r.state}`, open: r.state !== "inactive" },
      h("summary", {}, h("span", { class: `badge ${r.state}` }, r.state.toUpperCase()), " ", h("b", {}, r.name),
        ` (${(r.alerts || []).length} active)`, h("span", { class: "muted" }, `  ${r.file} › ${r.group}`)),
      h("pre", { class: "rule" }, `alert: ${r.name}\nexpr: ${r.query}` + (r.duration ? `\nfor: ${r.duration}s` : "") +
        (Object.keys(r.labels || {}).length ? `\nlabels: ${JSON.stringify(r.labels)}` : "") +
        (Object.keys(r.annotations || {}).length ? `\nannotations: ${JSON.stringify(r.annotations)}` : "")),
      (r.alerts || []).length ? table(["Labels", "State", "Active since", "Value"], r.alerts.map(a =>
        [labelChips(a.labels), h("span", { class: `badge ${a.state}` }, a.state.toUpperCase()), a.activeAt ? `${a.activeAt} (${ago(a.activeAt)})` : "", a.value])) : ""));
  }
}

// ------------------------------------------------------------------ /tsdb-status
export async function tsdbPage(main) {
  const d = await api("/api/v1/status/tsdb", { limit: 10 });
  const hs = d.headStats;
  const t = ms => ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–";
  main.append(h("h1", {}, "TSDB status"),
    section("Head block", table(["Number of series", "Number of label pairs", "Number of chunks", "Current min time", "Current max time"],
      [[String(hs.numSeries), String(hs.numLabelPairs), String(hs.chunkCount), t(hs.minTime), t(hs.maxTime)]])));
  const lists = [["Top 10 series count by metric names", "seriesCountByMetricName", "Count"],
    ["Top 10 label names with value count", "labelValueCountByLabelName", "Count"],
    ["Top 10 label names with high memory usage", "memoryInBytesByLabelName", "Bytes"],
    ["Top 10 series count by label value pairs", "seriesCountByLabelValuePair", "Count"]];
  for (const [title, key, col] of lists) {
    main.append(section(title, table(["Name", col], (d[key] || []).map(x => [h("span", { class: "mono" }, x.name),
      col === "Bytes" ? fmtBytes(x.value) : String(x.value)]))));
  }
}

// ------------------------------------------------------------------ /flags, /config, /status
export async function flagsPage(main) {
  const d = await api("/api/v1/status/flags");
  const filter = h("input", { type: "search", placeholder: "filter flags" });
  const out = h("div");
  const render = () => {
    const f = filter.value.toLowerCase();
    out.replaceChildren(table(["Flag", "Value"], Object.entries(d).filter(([k, v]) => !f || (k + v).toLowerCase().includes(f))
      .map(([k, v]) => [h("span", { class: "mono" }, `--${k}`), h("span", { class: "mono" }, v)])));
  };
  filter.addEventListener("input", render);
  main.append(h("h1", {}, "Command-line flags"), h("div", { class: "toolbar" }, filter), out);
  render();
}

export async function configPage(main) {
  main.append(h("h1", {}, "Configuration"));
  try {
    const d = await api("/api/v1/status/config");
    const pre = h("pre", { class: "config" }, d.yaml);
    main.append(h("div", { class: "toolbar" }, h("button", { class: "secondary", onclick: () => navigator.clipboard?.writeText(d.yaml) }, "Copy to clipboard")), pre);
  } catch (e) { main.append(errorBox(e)); }
}

export async function statusPage(main) {
  const version = document.getElementById("version").textContent;
  const [rt, bi] = await Promise.all([api("/api/v1/status/runtimeinfo"), api("/api/v1/status/buildinfo")]);
  const kv = obj => table(["", ""], Object.entries(obj).map(([k, v]) => [h("b", {}, k), h("span", { class: "mono" }, String(v))]), { cls: "kv" });
  main.append(h("h1", {}, "Runtime & build information"),
    section("TurboProm", kv({ "TurboProm version": version, "Prometheus HTTP API level (what clients see in buildinfo)": bi.version,
      "Python": bi.goVersion.replace(/^python/, ""), "Revision": bi.revision })),
    section("Runtime information", kv({ "Start time": rt.startTime, "Working directory": rt.CWD,
      "Configuration reload": rt.reloadConfigSuccess ? "successful" : "failed", "Last successful configuration reload": rt.lastConfigTime,
      "Threads": rt.goroutineCount, "CPUs": rt.GOMAXPROCS, "Storage retention": rt.storageRetention })),
    section("Build information (/api/v1/status/buildinfo)", kv(bi)));
}
