"""Alerting-rule templates: Prometheus's template functions (``humanize``, ``humanizeDuration``,
``query``, ``first``, ``value``, ``reReplaceAll``, ``graphLink``, ...) and the data an alerting rule
gives its label and annotation templates (``$labels``, ``$value``, ``$externalLabels``,
``$externalURL``), run by the Go template interpreter in planner/go_template.py, so that
``{{ $labels.instance }} is {{ $value | humanize }}`` expands to the bytes Prometheus writes.

``expand(text, name, labels, value, ...)`` is what an alerting rule calls: a failure gives
Prometheus's ``<error expanding template: ...>`` text instead of raising.
"""
from __future__ import annotations

import datetime as _dt
import math
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable

from planner.go_template import TemplateError, go_float_g, go_print, go_time_string, run


def _fmt4(v: float, suffix: str = "") -> str:
    """Go ``fmt.Sprintf("%.4g<suffix>", v)``."""
    return go_float_g(v, 4) + suffix


_BIG = ("k", "M", "G", "T", "P", "E", "Z", "Y")
_BIG_1024 = ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi")
_SMALL = ("m", "u", "n", "p", "f", "a", "z", "y")


def _scaled(v: float, prefixes: tuple[str, ...], base: float, up: bool) -> tuple[float, str]:
    """Divide (``up``) or multiply ``v`` by ``base`` until it is in [1, base); the last prefix used."""
    prefix = ""
    for p in prefixes:
        if (abs(v) < base) if up else (abs(v) >= 1):
            break
        prefix, v = p, (v / base if up else v * base)
    return v, prefix


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _fmt4(v)
    return _fmt4(*_scaled(v, _BIG, 1000, True) if abs(v) >= 1 else _scaled(v, _SMALL, 1000, False))


def humanize1024(v: float) -> str:
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return _fmt4(v)
    return _fmt4(*_scaled(v, _BIG_1024, 1024, True))


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _fmt4(v)
    if v == 0:
        return _fmt4(v, "s")
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = int(v)
        seconds, minutes, hours, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_fmt4(v)}s"
    v, prefix = _scaled(v, _SMALL, 1000, False)
    return _fmt4(v, prefix + "s")


def humanize_percentage(v: float) -> str:
    return _fmt4(v * 100, "%")


def _to_time(v: float) -> _dt.datetime:
    return _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc) + _dt.timedelta(microseconds=round(v * 1e6))


def humanize_timestamp(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _fmt4(v)
    return go_time_string(_to_time(v))


# --------------------------------------------------------------------------------------- values
@dataclass
@dataclass
class Sample:
    """One element of a ``query`` result, as Prometheus's templates see it (``.Labels``, ``.Value``)."""

    Labels: dict[str, str]
    Value: float



    def __str__(self) -> str:  # Go's %v of Prometheus's sample struct
        return "{" + go_print(self.Labels) + " " + go_print(self.Value) + "}"


def _float(v: Any, fn: str) -> float:
    if isinstance(v, bool):
        raise TemplateError(f"error calling {fn}: can't convert bool to float")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise TemplateError(f'error calling {fn}: strconv.ParseFloat: parsing "{v}": invalid syntax') from None
    if isinstance(v, _dt.datetime):
        return v.timestamp()
    raise TemplateError(f"error calling {fn}: can't convert {type(v).__name__} to float")


def _go_expand(template: str, groups: list[str | None], names: dict[str, int]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        key = m.group(1) or m.group(2)
        idx = int(key) if key.isdigit() else names.get(key)
        if idx is None or idx >= len(groups):
            return ""
        return groups[idx] or ""

    return re.sub(r"\$\$|\$\{(\w+)\}|\$(\w+)", sub, template)


def _re_replace_all(pattern: str, repl: str, text: str) -> str:
    import re2

    try:
        r = re2.compile(pattern)
    except re2.error as e:
        raise TemplateError(f"error calling reReplaceAll: {e}") from None
    names = dict(r.groupindex)
    return r.sub(lambda m: _go_expand(repl, [m.group(0), *m.groups()], names), text)


def _match(pattern: str, s: str) -> bool:
    from storage.regex import RegexError, compile_regex

    try:
        return compile_regex(pattern).search(s) is not None
    except RegexError as e:
        raise TemplateError(f"error calling match: {e}") from None


def _strip_port(hostport: str) -> str:
    if hostport.startswith("["):
        host, sep, rest = hostport[1:].partition("]")
        return host if sep and rest.startswith(":") and ":" not in rest[1:] else hostport
    if hostport.count(":") == 1:
        return hostport.split(":")[0]
    return hostport


def _strip_domain(hostport: str) -> str:
    host, port = hostport, ""
    if hostport.startswith("[") or hostport.count(":") > 1:
        return hostport
    if ":" in hostport:
        host, _, port = hostport.partition(":")
    if re.fullmatch(r"[\d.]+", host):
        return hostport
    host = host.split(".")[0]
    return f"{host}:{port}" if port else host


def _title(s: str) -> str:
    return re.sub(r"(^|(?<=[\s]))(\w)", lambda m: m.group(1) + m.group(2).upper(), s)


def _first(v: Any) -> Sample:
    if not isinstance(v, list) or not v:
        raise TemplateError("error calling first: first() called on vector with no elements")
    return v[0]


def _sort_by_label(label: str, v: list[Sample]) -> list[Sample]:
    return sorted(v, key=lambda s: s.Labels.get(label, ""))


@dataclass
class Context:
    """What one expansion may reach: the query function (instant query at the evaluation time,
    list of Sample) and the external URL."""

    query: Callable[[str], list[Sample]] | None = None
    external_url: str = ""


def _functions(c: Context) -> dict[str, Callable[..., Any]]:
    from planner.planner import parse_duration_ms

    ext = c.external_url.rstrip("/")
    path_prefix = urllib.parse.urlsplit(ext).path if ext else ""

    def query(q: str) -> list[Sample]:
        if c.query is None:
            raise TemplateError("error calling query: no query function")
        try:
            return c.query(q)
        except Exception as e:  # noqa: BLE001 - the query's error becomes the template's
            raise TemplateError(f"error calling query: {e}") from None

    def args(*a: Any) -> dict[str, Any]:
        return {f"arg{i}": x for i, x in enumerate(a)}

    def link(expr: str, tab: int) -> str:
        return f"/graph?g0.expr={urllib.parse.quote_plus(expr)}&g0.tab={tab}"  # no path prefix, as Prometheus

    return {
        # Prometheus's template functions
        "query": query,
        "first": _first,
        "label": lambda name, s: s.Labels.get(name, ""),
        "value": lambda s: s.Value,
        "strvalue": lambda s: s.Labels.get("__value__", ""),
        "sortByLabel": _sort_by_label,
        "args": args,
        "reReplaceAll": _re_replace_all,
        "match": _match,
        "safeHtml": lambda s: s,
        "stripPort": _strip_port,
        "stripDomain": _strip_domain,
        "title": _title,
        "toUpper": lambda s: s.upper(),
        "toLower": lambda s: s.lower(),
        "humanize": lambda v: humanize(_float(v, "humanize")),
        "humanize1024": lambda v: humanize1024(_float(v, "humanize1024")),
        "humanizeDuration": lambda v: humanize_duration(_float(v, "humanizeDuration")),
        "humanizePercentage": lambda v: humanize_percentage(_float(v, "humanizePercentage")),
        "humanizeTimestamp": lambda v: humanize_timestamp(_float(v, "humanizeTimestamp")),
        "toTime": lambda v: _to_time(_float(v, "toTime")),
        "parseDuration": lambda s: parse_duration_ms(str(s)) / 1000.0,
        "graphLink": lambda expr: link(expr, 0),
        "tableLink": lambda expr: link(expr, 1),
        "externalURL": lambda: ext,
        "pathPrefix": lambda: path_prefix,
    }


def execute(src: str, data: Any, variables: dict[str, Any], ctx: Context) -> str:
    """Run template ``src`` with ``data`` as ``.`` and the given ``$`` variables; TemplateError on failure."""
    return run(src, data, variables, _functions(ctx))


def expand(text: str, name: str, labels: dict[str, str], value: float, external_labels: dict[str, str],
           ctx: Context) -> str:
    """An alerting rule's label or annotation template, with ``.Labels``/``$labels``, ``.Value``/
    ``$value``, ``.ExternalLabels``/``$externalLabels`` and ``.ExternalURL``/``$externalURL``;
    a failure expands to Prometheus's ``<error expanding template: ...>``."""
    data = {"Labels": labels, "ExternalLabels": external_labels, "ExternalURL": ctx.external_url, "Value": value}
    variables = {"$labels": labels, "$externalLabels": external_labels, "$externalURL": ctx.external_url, "$value": value}
    try:
        return execute(text, data, variables, ctx)
    except (TemplateError, RecursionError) as e:
        return f"<error expanding template: error executing template __alert_{name}: template: __alert_{name}: {e}>"
