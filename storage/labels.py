"""Canonical label sets.

A series is identified by its label set sorted by name (``__name__`` included). Inside the
process a label set is a tuple of ``(name, value)`` pairs sorted by name: hashable, cheap to
compare, and the same object can key dicts in every stage.
"""
from __future__ import annotations

from typing import Iterable, Mapping

Labels = tuple[tuple[str, str], ...]

METRIC_NAME = "__name__"
# Tenancy (turboprom/tenancy.py): the default tenant's series carry no tenant label; every other
# tenant's carry this reserved one, by which storage partitions its index (storage/index.py).
TENANT_LABEL = "__tenant__"
DEFAULT_TENANT = "default"
EMPTY: Labels = ()


def make_labels(pairs: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """Build canonical labels; pairs with an empty value are dropped (Prometheus semantics)."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return tuple(sorted((n, v) for n, v in items if v != ""))


# One shared (name, value) tuple per distinct pair: label sets of a fleet repeat the same names and
# mostly the same values (cluster, job, model, le, mode, ...), so a series built from decoded
# strings would otherwise hold its own copy of every pair (~160 bytes per label). Bounded: past the
# cap the table starts over (later series share less; nothing else changes).
_PAIRS: dict[tuple[str, str], tuple[str, str]] = {}
MAX_INTERNED_PAIRS = 1 << 20


def intern_pairs(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``pairs`` with every pair replaced by the shared tuple equal to it (empty values dropped)."""
    if len(_PAIRS) >= MAX_INTERNED_PAIRS:
        _PAIRS.clear()
    shared = _PAIRS.setdefault
    return [shared(p, p) for p in pairs if p[1] != ""]


def get(labels: Labels, name: str, default: str = "") -> str:
    for n, v in labels:
        if n == name:
            return v
    return default


def metric_name(labels: Labels) -> str:
    return get(labels, METRIC_NAME)


def without(labels: Labels, names: Iterable[str]) -> Labels:
    drop = set(names)
    return tuple(p for p in labels if p[0] not in drop)


def only(labels: Labels, names: Iterable[str]) -> Labels:
    keep = set(names)
    return tuple(p for p in labels if p[0] in keep)


def drop_name(labels: Labels) -> Labels:
    return tuple(p for p in labels if p[0] != METRIC_NAME)


def set_label(labels: Labels, name: str, value: str) -> Labels:
    """Return labels with ``name`` set to ``value`` (removed when value is empty)."""
    rest = [p for p in labels if p[0] != name]
    if value != "":
        rest.append((name, value))
    return tuple(sorted(rest))


def to_dict(labels: Labels) -> dict[str, str]:
    return dict(labels)


def format_labels(labels: Labels) -> str:
    """Prometheus-style ``name{a="b"}`` rendering, for messages and debugging."""
    name = metric_name(labels)
    inner = ", ".join(f'{n}="{_escape(v)}"' for n, v in labels if n != METRIC_NAME)
    if name and not inner:
        return name
    return f"{name}{{{inner}}}"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
