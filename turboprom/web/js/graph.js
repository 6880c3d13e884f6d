// The /graph page: query panels (expression with autocomplete, metric browser, history; graph or
// table), each drawn with uPlot over exactly the chosen range; state kept in Prometheus-compatible
// URL parameters (g0.expr, g0.tab, g0.range_input, g0.end_input, g0.moment_input, g0.step_input,
// g0.stacked) so Prometheus links open here and links from here open in Prometheus.
import { h, api, fmtLabels, parseDuration, formatDuration, formatUTC, parseUTC, errorBox } from "./common.js";
import { UNITS, formatter, guessUnit } from "./units.js";
import { attachAutocomplete, promqlNames } from "./autocomplete.js";

const PALETTE = ["#e6522c", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#d62728", "#17becf", "#bcbd22", "#7f7f7f",
  "#ff7f0e", "#e377c2", "#3b6e8f", "#6b8e23", "#b8860b", "#4b0082", "#008080"];
const RANGES = [60, 300, 900, 1800, 3600, 7200, 21600, 43200, 86400, 172800, 604800, 1209600, 2419200];
const MAX_SERIES = 500;
const HISTORY_KEY = "turboprom.queryHistory";

// ------------------------------------------------------------------ query history (this browser)
export function queryHistory() {
  try { return JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]"); } catch { return []; }
}
function remember(expr) {
  const list = [expr, ...queryHistory().filter(x => x !== expr)].slice(0, 50);
  try { localStorage.setItem(HISTORY_KEY, JSON.stringify(list)); } catch { /* private mode: no history */ }
}

// ------------------------------------------------------------------ metric browser
async function openMetricBrowser(onPick) {
  const filter = h("input", { type: "search", placeholder: "filter metric names", class: "wide" });
  const body = h("div", { class: "browser-list" }, "loading…");
  const close = () => dlg.remove();
  const dlg = h("div", { class: "modal", onclick: e => { if (e.target === dlg) close(); } },
    h("div", { class: "modal-box" },
      h("div", { class: "modal-head" }, h("strong", {}, "Metric browser"), h("button", { class: "secondary", onclick: close }, "Close")),
      filter, body));
  document.body.append(dlg);
  filter.focus();
  const [n, meta] = await Promise.all([promqlNames(), api("/api/v1/metadata").catch(() => ({}))]);
  function render() {
    const f = filter.value.toLowerCase();
    const rows = n.metrics.filter(m => m.toLowerCase().includes(f)).slice(0, 400).map(m => {
      const md = (meta[m] || meta[m.replace(/_(total|bucket|sum|count)$/, "")] || [])[0] || {};
      return h("div", { class: "browser-row", onclick: () => { close(); onPick(m); } },
        h("code", {}, m), md.type ? h("span", { class: "tag" }, md.type) : "", h("span", { class: "muted" }, md.help || ""));
    });
    body.replaceChildren(...(rows.length ? rows : [h("div", { class: "muted" }, "no metric matches")]));
  }
  filter.addEventListener("input", render);
  filter.addEventListener("keydown", e => { if (e.key === "Escape") close(); });
  render();
}

// ------------------------------------------------------------------ one panel
function closestRange(s) { return RANGES.reduce((a, b) => Math.abs(b - s) < Math.abs(a - s) ? b : a, RANGES[0]); }

function tooltipPlugin(panel) {
  let tip;
  return {
    hooks: {
      init: u => { tip = h("div", { class: "tooltip", hidden: true }); u.over.append(tip); },
      setCursor: u => {
        const idx = u.cursor.idx;
        if (idx === null || idx === undefined || u.cursor.left < 0) { tip.hidden = true; return; }
        const fmt = panel.fmt;
        const rows = [];
        for (let si = 1; si < u.series.length; si++) {
          const s = u.series[si];
          const v = panel.raw[si - 1][idx];
          if (!s.show || v === null || v === undefined) continue;
          rows.push([v, si]);
        }
        rows.sort((a, b) => b[0] - a[0]);
        if (!rows.length) { tip.hidden = true; return; }
        tip.replaceChildren(
          h("div", { class: "tip-time" }, new Date(u.data[0][idx] * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC"),
          ...rows.slice(0, 12).map(([v, si]) => h("div", { class: "tip-row" },
            h("span", { class: "swatch", style: `background:${PALETTE[(si - 1) % PALETTE.length]}` }),
            h("span", { class: "tip-label" }, u.series[si].label), h("b", {}, fmt(v)))),
          rows.length > 12 ? h("div", { class: "muted" }, `… ${rows.length - 12} more`) : "");
        tip.hidden = false;
        const left = u.cursor.left + 16, w = tip.offsetWidth;
        tip.style.left = `${left + w > u.over.clientWidth ? Math.max(0, u.cursor.left - w - 16) : left}px`;
        tip.style.top = `${Math.max(0, u.cursor.top - tip.offsetHeight / 2)}px`;
      },
    },
  };
}

// Time tick labels in UTC (as the end-time picker and the tooltip), 24-hour; the date under the first
// label and wherever the day changes.
function timeTicks(u, splits) {
  const incr = splits.length > 1 ? splits[1] - splits[0] : 60;
  let day = null;
  return splits.map(v => {
    const iso = new Date(v * 1000).toISOString();
    const date = iso.slice(5, 10);
    const time = incr < 60 ? iso.slice(11, 19) : iso.slice(11, 16);
    if (incr >= 86400) return incr % 86400 ? `${date} ${time}` : date;
    const label = date !== day ? `${time}\n${date}` : time;
    day = date;
    return label;
  });
}

class Panel {
  constructor(opts, { onChange, onRemove }) {
    this.onChange = onChange;
    this.range = opts.range || 3600;
    this.end = opts.end || null; // null: now
    this.step = opts.step || null; // null: automatic
    this.stacked = !!opts.stacked;
    this.tab = opts.tab || "graph";
    this.unit = opts.unit || "auto";
    this.raw = [];
    this.fmt = formatter("short");

    this.expr = h("textarea", { class: "expr", rows: 1, spellcheck: false, placeholder: "Expression (press Enter to run, Shift+Enter for a new line)" });
    this.expr.value = opts.expr || "";
    this.status = h("div", { class: "panel-status muted" });
    this.rangeInput = h("input", { class: "range-input", size: 6, value: formatDuration(this.range), title: "range (Prometheus durations: 30m, 1h, 2d)",
      onchange: () => { const r = parseDuration(this.rangeInput.value); if (r) { this.range = r; this.run(); } else this.rangeInput.classList.add("bad"); } });
    this.endInput = h("input", { class: "end-input", size: 19, placeholder: "now", value: this.end ? formatUTC(this.end) : "",
      title: "end time, UTC (YYYY-MM-DD HH:MM:SS); empty for now",
      onchange: () => { const v = this.endInput.value.trim(); const t = v ? parseUTC(v) : null; if (v && t === null) { this.endInput.classList.add("bad"); return; } this.end = t; this.run(); } });
    this.stepInput = h("input", { class: "step-input", size: 5, placeholder: "auto", value: this.step ? formatDuration(this.step) : "", title: "resolution (step)",
      onchange: () => { const v = this.stepInput.value.trim(); this.step = v ? parseDuration(v) : null; this.run(); } });
    this.unitSelect = h("select", { class: "unit-select", title: "unit of the values",
      onchange: () => { this.unit = this.unitSelect.value; this.run(); } },
      Object.entries(UNITS).map(([k, label]) => h("option", { value: k, selected: k === this.unit }, label)));
    this.stackedBox = h("input", { type: "checkbox", class: "stacked-box", checked: this.stacked,
      onchange: () => { this.stacked = this.stackedBox.checked; this.run(); } });
    this.chart = h("div", { class: "chart" });
    this.tableView = h("div", { class: "table-view" });
    this.historyList = h("ul", { class: "history-list", hidden: true });
    this.tabButtons = ["graph", "table"].map(t => h("button", { class: "tab-btn", dataset: { tab: t }, onclick: () => { this.tab = t; this.showTab(); this.run(); } }, t === "graph" ? "Graph" : "Table"));

    const shift = f => { const end = this.end ?? Date.now() / 1000; this.end = Math.round(end + f * this.range); if (this.end > Date.now() / 1000) this.end = null; this.endInput.value = this.end ? formatUTC(this.end) : ""; this.run(); };
    const zoom = dir => {
      const i = RANGES.indexOf(closestRange(this.range));
      this.range = RANGES[Math.min(RANGES.length - 1, Math.max(0, i + dir))];
      this.rangeInput.value = formatDuration(this.range); this.run();
    };
    this.el = h("section", { class: "panel" },
      h("div", { class: "expr-row" },
        h("div", { class: "expr-wrap" }, this.expr),
        h("button", { class: "exec", onclick: () => this.run() }, "Execute"),
        h("button", { class: "secondary", title: "browse metric names", onclick: () => openMetricBrowser(m => this.insert(m)) }, "Metrics"),
        h("div", { class: "history-wrap" }, h("button", { class: "secondary", title: "queries run from this browser", onclick: () => this.toggleHistory() }, "History"), this.historyList),
        h("button", { class: "secondary remove", title: "remove this panel", onclick: () => { this.destroy(); onRemove(this); } }, "✕")),
      this.status,
      h("div", { class: "panel-tabs" }, this.tabButtons,
        h("div", { class: "graph-controls" },
          h("span", { class: "ctl" }, h("button", { class: "secondary small", title: "shorter range", onclick: () => zoom(-1) }, "−"), this.rangeInput,
            h("button", { class: "secondary small", title: "longer range", onclick: () => zoom(1) }, "+")),
          h("span", { class: "ctl" }, h("button", { class: "secondary small", title: "earlier", onclick: () => shift(-0.5) }, "«"), this.endInput,
            h("button", { class: "secondary small", title: "later", onclick: () => shift(0.5) }, "»"),
            h("button", { class: "secondary small", title: "end now", onclick: () => { this.end = null; this.endInput.value = ""; this.run(); } }, "now")),
          h("label", { class: "ctl" }, "step ", this.stepInput),
          h("label", { class: "ctl" }, "unit ", this.unitSelect),
          h("label", { class: "ctl" }, this.stackedBox, " stacked"))),
      this.chart, this.tableView);
    attachAutocomplete(this.expr, () => this.run());
    this.expr.addEventListener("input", () => { this.expr.rows = Math.min(8, Math.max(1, this.expr.value.split("\n").length)); });
    this.showTab();
  }

  insert(text) {
    const e = this.expr, a = e.selectionStart ?? e.value.length, b = e.selectionEnd ?? e.value.length;
    e.value = e.value.slice(0, a) + text + e.value.slice(b);
    e.focus(); e.selectionStart = e.selectionEnd = a + text.length;
  }

  toggleHistory() {
    const items = queryHistory();
    this.historyList.replaceChildren(...(items.length ? items.map(q => h("li", { onclick: () => { this.expr.value = q; this.historyList.hidden = true; this.run(); } }, q))
      : [h("li", { class: "muted" }, "no queries yet")]));
    this.historyList.hidden = !this.historyList.hidden;
  }

  showTab() {
    this.tabButtons.forEach(b => b.classList.toggle("active", b.dataset.tab === this.tab));
    this.chart.hidden = this.tab !== "graph";
    this.tableView.hidden = this.tab !== "table";
    this.el.querySelectorAll(".graph-controls .ctl").forEach((c, i) => { c.hidden = this.tab === "table" && i !== 1; });
  }

  toParams(i, qs) {
    const p = `g${i}.`;
    qs.set(p + "expr", this.expr.value);
    qs.set(p + "tab", this.tab === "graph" ? "0" : "1");
    qs.set(p + "stacked", this.stacked ? "1" : "0");
    qs.set(p + "range_input", formatDuration(this.range));
    if (this.end) { qs.set(p + "end_input", formatUTC(this.end)); qs.set(p + "moment_input", formatUTC(this.end)); }
    if (this.step) qs.set(p + "step_input", String(this.step));
    if (this.unit !== "auto") qs.set(p + "unit", this.unit);
  }

  destroy() { if (this.plot) this.plot.destroy(); this.plot = null; this.abort?.abort(); this.el.remove(); }

  async run() {
    const expr = this.expr.value.trim();
    [this.rangeInput, this.endInput].forEach(x => x.classList.remove("bad"));
    this.onChange();
    if (!expr) return;
    remember(expr);
    this.abort?.abort();
    const abort = this.abort = new AbortController();
    const end = this.end ?? Math.floor(Date.now() / 1000);
    const start = end - this.range;
    const step = this.step || Math.max(Math.floor(this.range / 250), 1);
    this.fmt = formatter(this.unit === "auto" ? guessUnit(expr) : this.unit);
    this.status.textContent = "running…";
    const t0 = performance.now();
    try {
      let data, count;
      if (this.tab === "graph") {
        data = await api("/api/v1/query_range", { query: expr, start, end, step }, { post: true, signal: abort.signal });
        count = this.draw(data, start, end, step);
      } else {
        data = await api("/api/v1/query", { query: expr, time: end }, { post: true, signal: abort.signal });
        count = this.fillTable(data);
      }
      const notes = [...(data._warnings || []), ...(data._infos || [])];
      this.status.replaceChildren(`Load time: ${Math.round(performance.now() - t0)} ms · ` +
        (this.tab === "graph" ? `Resolution: ${formatDuration(step)} · ` : "") + `Result series: ${count}`,
        ...notes.map(n => h("div", { class: "note" }, n)));
    } catch (e) {
      if (e.name === "AbortError") return;
      this.status.replaceChildren(errorBox(e));
      if (this.tab === "graph") { this.plot?.destroy(); this.plot = null; this.chart.replaceChildren(); this.chart.dataset.series = "0"; }
    }
  }

  draw(data, start, end, step) {
    const result = data.resultType === "matrix" ? data.result : [];
    const shown = result.slice(0, MAX_SERIES);
    const n = Math.floor((end - start) / step) + 1;
    const xs = Array.from({ length: n }, (_, i) => start + i * step);
    this.raw = shown.map(s => {
      const arr = new Array(n).fill(null);
      for (const [t, v] of s.values || []) {
        const i = Math.round((t - start) / step);
        const f = parseFloat(v);
        if (i >= 0 && i < n && isFinite(f)) arr[i] = f;
      }
      return arr;
    });
    let plotted = this.raw;
    if (this.stacked) {
      const acc = new Array(n).fill(0);
      plotted = this.raw.map(arr => arr.map((v, i) => (v === null ? (acc[i] === 0 ? null : acc[i]) : (acc[i] += v))));
    }
    const fmt = this.fmt;
    const color = i => PALETTE[i % PALETTE.length];
    const series = [{ value: (u, v) => v === null ? "–" : new Date(v * 1000).toISOString().replace("T", " ").slice(0, 19) }];
    shown.forEach((s, i) => series.push({
      label: fmtLabels(s.metric), stroke: color(i), width: 1.5, spanGaps: false,
      fill: this.stacked && i === 0 ? color(i) + "55" : undefined,
      value: (u, v, si, idx) => (idx === null || idx === undefined || this.raw[si - 1][idx] === null) ? "–" : fmt(this.raw[si - 1][idx]),
      points: { show: false },
    }));
    const width = Math.max(300, this.chart.clientWidth || this.el.clientWidth || 900);
    const opts = {
      width, height: 340,
      padding: [14, 36, 0, 4], // room on the right: the last time label is never clipped
      scales: { x: { time: true, range: () => [start, end] }, y: this.stacked ? { range: (u, min, max) => [0, max > 0 ? max * 1.05 : 1] } : {} },
      axes: [
        { stroke: "#57606a", grid: { stroke: "#eaeef2" }, ticks: { stroke: "#d0d7de" }, values: timeTicks },
        { stroke: "#57606a", grid: { stroke: "#eaeef2" }, ticks: { stroke: "#d0d7de" }, size: 78, values: (u, splits) => splits.map(v => fmt(v, 3)) },
      ],
      series,
      bands: this.stacked ? shown.slice(1).map((_, i) => ({ series: [i + 2, i + 1], fill: color(i + 1) + "55" })) : [],
      cursor: { drag: { x: true, y: false, setScale: false }, points: { size: 6 } },
      legend: { live: true },
      plugins: [tooltipPlugin(this)],
      hooks: {
        setSelect: [u => {
          if (u.select.width < 4) return;
          const a = u.posToVal(u.select.left, "x"), b = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, width: 0, top: 0, height: 0 }, false);
          this.range = Math.max(10, Math.round(b - a));
          this.end = Math.round(b);
          this.rangeInput.value = formatDuration(this.range);
          this.endInput.value = formatUTC(this.end);
          this.run();
        }],
      },
    };
    this.plot?.destroy();
    this.chart.replaceChildren();
    if (!shown.length) {
      this.chart.append(h("div", { class: "empty-chart muted" }, "Empty query result"));
      this.plot = null;
    } else {
      this.plot = new uPlot(opts, [xs, ...plotted], this.chart);
      this.chart.uplot = this.plot; // for the browser console and the browser test
    }
    if (result.length > MAX_SERIES) this.chart.append(h("div", { class: "note" }, `showing the first ${MAX_SERIES} of ${result.length} series`));
    this.chart.dataset.series = String(shown.length);
    return result.length;
  }

  resize() {
    if (this.plot && !this.chart.hidden) this.plot.setSize({ width: Math.max(300, this.chart.clientWidth), height: 340 });
  }

  fillTable(data) {
    const rows = [];
    const fmtv = v => `${v}`;
    if (data.resultType === "scalar" || data.resultType === "string") rows.push([h("i", {}, data.resultType), fmtv(data.result[1])]);
    else if (data.resultType === "vector") {
      for (const s of data.result.slice(0, 10000)) rows.push([fmtLabels(s.metric), s.value ? fmtv(s.value[1]) : "histogram"]);
    } else {
      for (const s of data.result.slice(0, 10000)) {
        rows.push([fmtLabels(s.metric), h("pre", { class: "values" }, (s.values || []).map(v => `${v[1]} @${v[0]}`).join("\n"))]);
      }
    }
    const tbl = h("table", { class: "result-table" }, h("tbody", {}, rows.length ? rows.map(r => h("tr", {}, r.map(c => h("td", {}, c))))
      : h("tr", {}, h("td", { class: "muted" }, "Empty query result"))));
    this.tableView.replaceChildren(tbl);
    return data.resultType === "vector" || data.resultType === "matrix" ? data.result.length : 1;
  }
}

// ------------------------------------------------------------------ the page and its URL
export function readPanelsFromURL(search) {
  const qs = new URLSearchParams(search);
  const byIndex = new Map();
  for (const [k, v] of qs) {
    const m = /^g(\d+)\.(\w+)$/.exec(k);
    if (!m) continue;
    if (!byIndex.has(+m[1])) byIndex.set(+m[1], {});
    byIndex.get(+m[1])[m[2]] = v;
  }
  const panels = [...byIndex.entries()].sort((a, b) => a[0] - b[0]).map(([, p]) => ({
    expr: p.expr || "",
    tab: p.tab === "1" || p.tab === "table" ? "table" : "graph",
    range: parseDuration(p.range_input) || 3600,
    end: parseUTC(p.end_input || (p.tab === "1" || p.tab === "table" ? p.moment_input : "")) || null,
    step: parseDuration(p.step_input) || null,
    stacked: p.stacked === "1",
    unit: UNITS[p.unit] ? p.unit : "auto",
  }));
  if (!panels.length && qs.get("expr")) panels.push({ expr: qs.get("expr"), tab: "graph" });
  return panels;
}

export function graphPage(main) {
  const panels = [];
  const list = h("div", { id: "panels" });
  const writeURL = () => {
    const qs = new URLSearchParams();
    panels.forEach((p, i) => p.toParams(i, qs));
    history.replaceState(null, "", `/graph?${qs}`);
  };
  const add = (opts, run) => {
    const p = new Panel(opts, { onChange: writeURL, onRemove: x => { panels.splice(panels.indexOf(x), 1); writeURL(); } });
    panels.push(p);
    list.append(p.el);
    if (run && opts.expr) p.run();
    return p;
  };
  main.append(list, h("button", { class: "secondary add-panel", onclick: () => add({}, false).expr.focus() }, "Add panel"));
  const initial = readPanelsFromURL(location.search);
  if (!initial.length) add({}, false).expr.focus();
  for (const o of initial) add(o, true);
  let t = null;
  window.addEventListener("resize", () => { clearTimeout(t); t = setTimeout(() => panels.forEach(p => p.resize()), 150); });
}
