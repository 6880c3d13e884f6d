"""OTLP metric, unit and attribute names -> Prometheus names, as Prometheus 3.x's OTLP receiver builds them
(its ``otlp.translation_strategy``), and OTLP attribute values -> label value strings.

Hand-written because the rules live in Prometheus's Go translator and no Python package carries them;
they are pure string functions called once per metric and once per new attribute name (results are
cached by the caller), never per sample.

Strategies (Prometheus's names):
  UnderscoreEscapingWithSuffixes (default): characters outside ``[a-zA-Z0-9:]`` split the metric name
      into tokens joined by ``_``; unit suffixes (``s`` -> ``_seconds``, ``By/s`` -> ``_bytes_per_second``),
      ``_total`` for monotonic sums and ``_ratio`` for gauges of unit ``1`` are appended; label names get
      every character outside ``[a-zA-Z0-9]`` replaced by ``_`` (runs collapsed, ``key_`` before a digit).
  UnderscoreEscapingWithoutSuffixes: the same escaping, no suffixes.
  NoUTF8EscapingWithSuffixes: names kept as sent (UTF-8), suffixes appended.
  NoTranslation: names and label names kept exactly as sent.
Histogram and summary series always get ``_bucket``/``_sum``/``_count`` (the caller appends them).
"""
from __future__ import annotations

import base64
import json
import re

import numpy as np

STRATEGIES = ("UnderscoreEscapingWithSuffixes", "UnderscoreEscapingWithoutSuffixes", "NoUTF8EscapingWithSuffixes",
              "NoTranslation")

# metric kinds as the name rules see them
GAUGE, COUNTER, UPDOWN, HISTOGRAM, SUMMARY = "gauge", "counter", "updown", "histogram", "summary"

UNIT_MAP = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes",
    "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams",
    "Cel": "celsius", "Hz": "hertz", "1": "", "%": "percent",
}
PER_UNIT_MAP = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}

_NOT_METRIC_CHAR = re.compile(r"[^a-zA-Z0-9:]+")
_NOT_METRIC_OR_UNDERSCORE = re.compile(r"[^a-zA-Z0-9:_]+")
_NOT_LABEL_CHAR = re.compile(r"[^a-zA-Z0-9]+")
_UNDERSCORES = re.compile(r"__+")


def escapes(strategy: str) -> bool:
    return strategy.startswith("UnderscoreEscaping")


def adds_suffixes(strategy: str) -> bool:
    return strategy.endswith("WithSuffixes")


def unit_suffixes(unit: str) -> tuple[str, str]:
    """(main, per) suffixes of an OTLP unit, e.g. ``By/s`` -> (``bytes``, ``per_second``); annotations in
    braces (``{request}``) give none."""
    main_otel, _, per_otel = unit.partition("/")
    main_otel = main_otel.strip()
    main = UNIT_MAP.get(main_otel, main_otel) if main_otel and not any(c in main_otel for c in "{}") else ""
    per = ""
    per_otel = per_otel.strip()
    if per_otel and not any(c in per_otel for c in "{}"):
        per = "per_" + PER_UNIT_MAP.get(per_otel, per_otel)
    return main, per


def _clean_unit(unit: str) -> str:
    return _UNDERSCORES.sub("_", re.sub(r"[^a-zA-Z0-9:]", "_", unit)).removeprefix("_")


def unit_name(unit: str, strategy: str) -> str:
    """The unit as Prometheus's metadata reports it (``By/s`` -> ``bytes_per_second``)."""
    main, per = unit_suffixes(unit)
    if escapes(strategy):
        main, per = _clean_unit(main), _clean_unit(per)
    u = f"{main}_{per}" if main and per else (main or per)
    return u.removeprefix("_").removesuffix("_")


def _escaped_with_suffixes(name: str, unit: str, kind: str, namespace: str) -> str:
    tokens = [t for t in _NOT_METRIC_CHAR.split(name) if t]
    main, per = unit_suffixes(unit)
    main, per = _clean_unit(main), _clean_unit(per)
    if main in tokens:
        main = ""
    if per == "per_":
        per = ""
    else:
        per = per.removesuffix("_")
        if per in tokens:
            per = ""
    if per:
        main = main.removesuffix("_")
    if main:
        tokens.append(main)
    if per:
        tokens.append(per)
    if kind == COUNTER:
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == GAUGE:
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    if namespace:
        tokens.insert(0, namespace)
    out = "_".join(tokens)
    return "_" + out if out[:1].isdigit() else out


def _trim_suffix(name: str, suffix: str) -> str:
    """Drop ``suffix`` and the one delimiter before it, when the name ends with it."""
    if name.endswith(suffix) and len(name) > len(suffix) + 1:
        return name[:-(len(suffix) + 1)]
    return name


def _utf8_with_suffixes(name: str, unit: str, kind: str) -> str:
    tail = ""
    if unit == "1" and kind == GAUGE:
        name = _trim_suffix(name, "ratio")
        tail = "_ratio"
    if kind == COUNTER:
        name = _trim_suffix(name, "total")
        tail = "_total" + tail
    main, per = unit_suffixes(unit)
    if per:
        name = _trim_suffix(name, per)
        tail = "_" + per + tail
    if main and not name.endswith(main):
        name = name + "_" + main
    return name + tail


def metric_name(name: str, unit: str, kind: str, strategy: str, namespace: str = "") -> str:
    """The Prometheus metric (family) name of an OTLP metric; raises ValueError when nothing valid is left."""
    if not escapes(strategy):
        if namespace:
            name = namespace + "_" + name
        out = _utf8_with_suffixes(name, unit, kind) if adds_suffixes(strategy) else name
        if not out:
            raise ValueError("metric without a name")
        return out
    if adds_suffixes(strategy):
        out = _escaped_with_suffixes(name, unit, kind, namespace)
    else:
        out = "_".join(t for t in _NOT_METRIC_OR_UNDERSCORE.split(name) if t)
        if namespace:
            out = "_".join(t for t in _NOT_METRIC_OR_UNDERSCORE.split(namespace) if t) + "_" + out
        elif out[:1].isdigit():
            out = "_" + out
    if not out:
        raise ValueError(f"normalization for metric {name!r} resulted in an empty name")
    if out != name and not out.strip("_"):
        raise ValueError(f"normalization for metric {name!r} resulted in invalid name {out!r}")
    return out


def label_name(name: str, escape: bool) -> str:
    """The Prometheus label name of an OTLP attribute key; raises ValueError for an empty result."""
    if not name:
        raise ValueError("attribute with an empty key")
    if not escape:
        if not name.strip("_"):
            raise ValueError(f"label name {name!r} contains only underscores")
        return name
    reserved = len(name) >= 4 and name.startswith("__") and name.endswith("__")
    core = name[2:-2] if reserved else name
    out = _NOT_LABEL_CHAR.sub("_", core)
    if reserved:
        out = "__" + out + "__"
    if out[:1].isdigit():
        out = "key_" + out
    if not out.strip("_"):
        raise ValueError(f"normalization for label name {name!r} resulted in invalid name {out!r}")
    return out


def float_string(v: float) -> str:
    """A float attribute value as the OTLP collector's pdata renders it (JavaScript number style)."""
    if v != v or v in (float("inf"), float("-inf")):
        return f"json: unsupported value: {'NaN' if v != v else ('+Inf' if v > 0 else '-Inf')}"
    a = abs(v)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        return np.format_float_scientific(v, unique=True, trim="-", exp_digits=1)
    return np.format_float_positional(v, unique=True, trim="-")


def _raw(v) -> object:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_raw(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _raw(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return getattr(v, kind)


def value_string(v) -> str:
    """An OTLP ``AnyValue`` as a label value: strings as sent, booleans ``true``/``false``, integers in
    decimal, bytes in base64, arrays and maps as compact JSON."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return str(v.int_value)
    if kind == "bool_value":
        return "true" if v.bool_value else "false"
    if kind == "double_value":
        return float_string(v.double_value)
    if kind is None:
        return ""
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return json.dumps(_raw(v), separators=(",", ":"), ensure_ascii=False)
