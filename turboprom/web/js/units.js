// Value units of a graph: the formatter for axis ticks, hover values and table cells, and a guess of
// the unit from the query text (Prometheus's naming conventions: _seconds, _bytes, _ratio, _total).

export const UNITS = {
  auto: "auto",
  short: "number",
  s: "seconds",
  bytes: "bytes",
  percentunit: "percent (0-1)",
  reqps: "per second",
};

const SI = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];

function trim(x, digits) { return String(parseFloat(x.toPrecision(digits))); }

export function short(v, digits = 4) {
  if (v === null || v === undefined || !isFinite(v)) return v === null || v === undefined ? "" : String(v);
  const a = Math.abs(v);
  for (const [size, suffix] of SI) if (a >= size) return trim(v / size, digits) + suffix;
  if (a !== 0 && a < 1e-3) return v.toExponential(2);
  return trim(v, digits);
}

export function seconds(v, digits = 4) {
  if (v === null || v === undefined || !isFinite(v)) return v === null || v === undefined ? "" : String(v);
  const a = Math.abs(v);
  if (a === 0) return "0";
  if (a < 1e-6) return trim(v * 1e9, digits) + " ns";
  if (a < 1e-3) return trim(v * 1e6, digits) + " µs";
  if (a < 1) return trim(v * 1e3, digits) + " ms";
  if (a < 60) return trim(v, digits) + " s";
  if (a < 3600) return trim(v / 60, digits) + " min";
  if (a < 86400) return trim(v / 3600, digits) + " h";
  return trim(v / 86400, digits) + " d";
}

export function bytes(v, digits = 4) {
  if (v === null || v === undefined || !isFinite(v)) return v === null || v === undefined ? "" : String(v);
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let i = 0, x = Math.abs(v);
  while (x >= 1024 && i < units.length - 1) { x /= 1024; i++; }
  return (v < 0 ? "-" : "") + trim(x, digits) + " " + units[i];
}

export function formatter(unit) {
  switch (unit) {
    case "s": return seconds;
    case "bytes": return bytes;
    case "percentunit": return (v, d = 4) => (v === null || v === undefined || !isFinite(v)) ? (v == null ? "" : String(v)) : trim(v * 100, d) + "%";
    case "reqps": return (v, d) => { const s = short(v, d); return s === "" ? s : s + "/s"; };
    default: return short;
  }
}

export function guessUnit(expr) {
  const e = String(expr || "");
  if (/_seconds(_bucket|_sum)?\b/.test(e)) return "s";  // a _seconds_count alone counts events
  if (/_bytes(_total)?\b/.test(e)) return "bytes";
  if (/_(ratio|perc)\b/.test(e)) return "percentunit";
  if (/\b(rate|irate)\s*\(/.test(e) && /_total\b/.test(e)) return "reqps";
  return "short";
}
