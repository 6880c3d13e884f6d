// PromQL autocomplete for an expression box: function names (the engine's own table), aggregation
// operators and keywords, metric names, label names inside {...} and by/without/on/ignoring (...),
// and label values after `label="`. Names come from the API and are cached for the page's life.
import { api, h } from "./common.js";

const KEYWORDS = ["sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
  "quantile", "limitk", "limit_ratio", "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
  "and", "or", "unless"];
const AGGREGATIONS = new Set(KEYWORDS.slice(0, 15));

let names = null;
export function promqlNames() {
  if (!names) {
    names = Promise.all([
      api("/ui/promql-functions").catch(() => []),
      api("/api/v1/label/__name__/values").catch(() => []),
      api("/api/v1/labels").catch(() => []),
    ]).then(([functions, metrics, labels]) => ({ functions, metrics, labels }));
  }
  return names;
}

const values = new Map();
function labelValues(label) {
  if (!values.has(label)) values.set(label, api(`/api/v1/label/${encodeURIComponent(label)}/values`).catch(() => []));
  return values.get(label);
}

function insideBraces(s) { return s.lastIndexOf("{") > s.lastIndexOf("}"); }

// What is being typed at the caret: {kind: "name"|"label"|"value", prefix, label?}
export function caretContext(text, caret) {
  const before = text.slice(0, caret);
  let m = /([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)$/.exec(before);
  if (m && insideBraces(before)) return { kind: "value", label: m[1], prefix: m[3] };
  m = /([a-zA-Z_:][a-zA-Z0-9_:]*)$/.exec(before);
  const prefix = m ? m[1] : "";
  if (insideBraces(before) || /\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*$/.test(before)) {
    return { kind: "label", prefix };
  }
  return { kind: "name", prefix };
}

function rank(list, prefix, kind, limit = 14) {
  const p = prefix.toLowerCase();
  const starts = [], contains = [];
  for (const x of list) {
    const l = x.toLowerCase();
    if (l.startsWith(p)) starts.push(x); else if (p && l.includes(p)) contains.push(x);
    if (starts.length >= limit) break;
  }
  return [...starts, ...contains].slice(0, limit).map(text => ({ text, kind }));
}

export async function suggestions(text, caret) {
  const ctx = caretContext(text, caret);
  const n = await promqlNames();
  const fresh = items => items.filter(i => i.text !== ctx.prefix); // nothing left to complete
  if (ctx.kind === "value") return { ctx, items: fresh(rank(await labelValues(ctx.label), ctx.prefix, "value")) };
  if (ctx.kind === "label") return { ctx, items: fresh(rank(n.labels.filter(x => x !== "__name__"), ctx.prefix, "label")) };
  if (!ctx.prefix) return { ctx, items: [] };
  const items = [
    ...rank(n.functions, ctx.prefix, "function", 6),
    ...rank(KEYWORDS, ctx.prefix, "keyword", 4),
    ...rank(n.metrics, ctx.prefix, "metric", 14),
  ];
  return { ctx, items: fresh(items).slice(0, 16) };
}

// Wire a textarea: a suggestion list below it; ArrowUp/Down move, Tab/Enter accept, Escape closes.
// `onEnter` runs when Enter is pressed with no open list (Shift+Enter inserts a newline).
export function attachAutocomplete(input, onEnter) {
  const list = h("ul", { class: "ac-list", hidden: true, role: "listbox" });
  input.after(list);
  let items = [], active = 0, ctx = null, seq = 0;

  function close() { list.hidden = true; items = []; }
  function render() {
    list.replaceChildren(...items.map((it, i) => h("li", {
      class: i === active ? "active" : "", dataset: { kind: it.kind },
      onmousedown: e => { e.preventDefault(); accept(i); },
    }, h("span", { class: "ac-text" }, it.text), h("span", { class: "ac-kind" }, it.kind))));
    list.hidden = items.length === 0;
  }
  function accept(i) {
    const it = items[i];
    if (!it) return;
    const caret = input.selectionStart;
    const start = caret - ctx.prefix.length;
    let ins = it.text;
    if (it.kind === "function" || (it.kind === "keyword" && AGGREGATIONS.has(it.text))) ins += "(";
    if (it.kind === "value") ins += '"';
    input.value = input.value.slice(0, start) + ins + input.value.slice(caret);
    input.selectionStart = input.selectionEnd = start + ins.length;
    close();
    input.dispatchEvent(new Event("input"));
  }
  async function update() {
    const my = ++seq;
    const r = await suggestions(input.value, input.selectionStart);
    if (my !== seq || document.activeElement !== input) return;
    ctx = r.ctx; items = r.items; active = 0;
    render();
  }
  input.addEventListener("input", update);
  input.addEventListener("blur", () => setTimeout(close, 100));
  input.addEventListener("keydown", e => {
    if (!list.hidden && items.length) {
      if (e.key === "ArrowDown") { active = (active + 1) % items.length; render(); e.preventDefault(); return; }
      if (e.key === "ArrowUp") { active = (active - 1 + items.length) % items.length; render(); e.preventDefault(); return; }
      if (e.key === "Tab" || (e.key === "Enter" && !e.shiftKey)) { accept(active); e.preventDefault(); return; }
      if (e.key === "Escape") { close(); e.preventDefault(); return; }
    }
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); close(); onEnter(); }
  });
  return { close };
}
