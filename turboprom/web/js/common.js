// Shared helpers of the built-in page: DOM building (text is always set as text, never parsed as
// HTML), API calls that surface Prometheus-style errors, and number/duration/time formatting.

export function $(sel, root = document) { return root.querySelector(sel); }

// h("td", {class: "x", onclick: fn}, "text", childNode, ...)
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export class APIError extends Error {}

// GET (or POST form) an API path; returns the `data` of a success answer, throws APIError otherwise.
export async function api(path, params = null, { post = false, signal } = {}) {
  const qs = params ? new URLSearchParams(params) : null;
  let resp;
  try {
    resp = post
      ? await fetch(path, { method: "POST", body: qs, signal, headers: { "Content-Type": "application/x-www-form-urlencoded" } })
      : await fetch(qs ? `${path}?${qs}` : path, { signal });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new APIError(`cannot reach the server: ${e.message}`);
  }
  let body;
  try { body = await resp.json(); } catch (e) { throw new APIError(`HTTP ${resp.status}: not a JSON answer`); }
  if (body.status !== "success") throw new APIError(`${body.errorType || "error"}: ${body.error || resp.status}`);
  if (body.warnings || body.infos) return Object.assign(body.data, { _warnings: body.warnings || [], _infos: body.infos || [] });
  return body.data;
}

export function fmtLabels(m, withName = true) {
  const name = withName ? (m.__name__ || "") : "";
  const rest = Object.keys(m).filter(k => k !== "__name__").sort().map(k => `${k}="${m[k]}"`);
  return rest.length ? `${name}{${rest.join(", ")}}` : (name || "{}");
}

export function labelChips(m) {
  return h("span", { class: "chips" }, Object.keys(m).sort().map(k => h("span", { class: "chip" }, `${k}="${m[k]}"`)));
}

// ------------------------------------------------------------------ durations (Prometheus syntax)
const UNIT_S = { y: 31536000, w: 604800, d: 86400, h: 3600, m: 60, s: 1, ms: 0.001 };

export function parseDuration(text) {
  const s = String(text || "").trim();
  if (!s) return null;
  if (/^\d+(\.\d+)?$/.test(s)) return parseFloat(s);
  const re = /(\d+(?:\.\d+)?)(ms|y|w|d|h|m|s)/gy;
  let total = 0, m, pos = 0;
  while ((m = re.exec(s)) !== null) { total += parseFloat(m[1]) * UNIT_S[m[2]]; pos = re.lastIndex; }
  return pos === s.length && total > 0 ? total : null;
}

export function formatDuration(seconds) {
  let ms = Math.round(seconds * 1000);
  if (ms <= 0) return "0s";
  let out = "";
  for (const [u, size] of [["y", 31536000000], ["w", 604800000], ["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000], ["ms", 1]]) {
    if ((u === "y" || u === "w") && ms % size) continue;
    if (ms >= size) { out += `${Math.floor(ms / size)}${u}`; ms %= size; }
  }
  return out;
}

export function ago(ts) {
  if (!ts) return "never";
  const t = typeof ts === "number" ? ts * 1000 : Date.parse(ts);
  if (!isFinite(t) || t <= 0) return "never";
  const s = (Date.now() - t) / 1000;
  if (s < 0) return "just now";
  return s < 1 ? `${Math.round(s * 1000)} ms ago` : `${formatDuration(Math.round(s))} ago`;
}

// "YYYY-MM-DD HH:MM:SS" in UTC: what Prometheus's end_input/moment_input carry.
export function formatUTC(seconds) {
  return new Date(seconds * 1000).toISOString().slice(0, 19).replace("T", " ");
}
export function parseUTC(text) {
  const s = String(text || "").trim();
  if (!s) return null;
  if (/^\d+(\.\d+)?$/.test(s)) return parseFloat(s);
  const t = Date.parse(s.replace(" ", "T") + (/[zZ]|[+-]\d\d:?\d\d$/.test(s) ? "" : "Z"));
  return isFinite(t) ? t / 1000 : null;
}

// ------------------------------------------------------------------ numbers
export function fmtNum(x, digits = 4) {
  if (x === null || x === undefined || x === "") return "–";
  if (typeof x === "string") { const f = Number(x); if (!isFinite(f) && x !== "NaN" && !/Inf/.test(x)) return x; x = f; }
  if (!isFinite(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-4 || a >= 1e9)) return x.toExponential(digits - 1);
  return String(parseFloat(x.toPrecision(digits)));
}

export function fmtBytes(b) {
  if (b === null || b === undefined || !isFinite(b)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0, v = Math.abs(b);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${b < 0 ? "-" : ""}${parseFloat(v.toPrecision(3))} ${units[i]}`;
}

// A table: headers and rows of cells (strings or nodes). Empty rows show `empty`.
export function table(headers, rows, { empty = "nothing to show", cls = "" } = {}) {
  const body = rows.length ? rows.map(r => h("tr", {}, r.map(c => h("td", {}, c))))
    : [h("tr", {}, h("td", { colspan: headers.length, class: "muted" }, empty))];
  return h("table", { class: cls }, h("thead", {}, h("tr", {}, headers.map(x => h("th", {}, x)))), h("tbody", {}, body));
}

export function errorBox(e) { return h("div", { class: "error-box" }, e.message || String(e)); }
