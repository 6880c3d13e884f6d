"""Label-set and timestamp validation shared by every ingest path (Prometheus rules)."""
from __future__ import annotations

import re
import time

import numpy as np

from ingest.errors import IngestError
from storage.labels import METRIC_NAME, Labels, format_labels, intern_pairs

METRIC_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")  # the legacy (Prometheus 2) character sets
LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# Prometheus 3 validates names as UTF-8 by default (global.metric_name_validation_scheme: utf8): any
# non-empty valid UTF-8 string is a metric or label name; "legacy" restores the 2.x character sets.
SCHEMES = ("utf8", "legacy")
_scheme = "utf8"


def set_name_validation_scheme(scheme: str) -> None:
    global _scheme
    if scheme not in SCHEMES:
        raise ValueError(f"metric_name_validation_scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    _scheme = scheme


def name_validation_scheme() -> str:
    return _scheme


def _utf8(name: str) -> bool:
    if name.isascii():
        return name != ""
    try:
        name.encode("utf-8")  # lone surrogates (from a lenient decode) are not valid UTF-8
    except UnicodeEncodeError:
        return False
    return name != ""


def valid_metric_name(name: str) -> bool:
    return bool(METRIC_NAME_RE.match(name)) if _scheme == "legacy" else _utf8(name)


def valid_label_name(name: str) -> bool:
    return bool(LABEL_NAME_RE.match(name)) if _scheme == "legacy" else _utf8(name)


def _show(pairs: list[tuple[str, str]]) -> str:
    return format_labels(tuple(sorted(pairs)))[:300]


def validate_pairs(pairs: list[tuple[str, str]]) -> Labels:
    """Check one series' label pairs and return the canonical Labels (empty values dropped).

    Raises IngestError naming the problem: empty label set, missing or invalid metric name,
    invalid or duplicate label name.
    """
    if not pairs:
        raise IngestError("empty_labels", "series with an empty label set")
    seen: set[str] = set()
    name = None
    for n, v in pairs:
        if n in seen:
            raise IngestError("duplicate_label", f"duplicate label name {n!r} in series {_show(pairs)}")
        seen.add(n)
        if n == METRIC_NAME:
            name = v
        elif not valid_label_name(n):
            raise IngestError("invalid_label_name", f"invalid label name {n!r} in series {_show(pairs)}")
    if name is None or name == "":
        raise IngestError("missing_metric_name", f"series without a metric name (__name__): {_show(pairs)}")
    if not valid_metric_name(name):
        raise IngestError("invalid_metric_name", f"invalid metric name {name!r} in series {_show(pairs)}")
    return tuple(sorted(intern_pairs(pairs)))


def now_ms() -> int:
    return int(time.time() * 1000)


def check_future(timestamps: np.ndarray, series_index: np.ndarray, series: list[Labels], tolerance_ms: int) -> None:
    """Refuse the whole request when any sample lies more than ``tolerance_ms`` in the future."""
    if len(timestamps) == 0 or tolerance_ms <= 0:
        return
    limit = now_ms() + tolerance_ms
    bad = timestamps > limit
    if bad.any():
        i = int(np.argmax(bad))
        raise IngestError(
            "too_far_in_future",
            f"{int(bad.sum())} sample(s) too far in the future (more than {tolerance_ms} ms ahead of now), "
            f"e.g. {format_labels(series[int(series_index[i])])} at {int(timestamps[i])}",
            samples=len(timestamps))
