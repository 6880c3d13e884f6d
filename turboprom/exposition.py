"""Text exposition format 0.0.4 of one sample per series (the body of ``GET /federate``).

Prometheus's federation writes every family as ``untyped``; here a family's ``# TYPE`` comes from
the ingest metadata store when it is known (counter, gauge, histogram, summary; OpenMetrics-only
types map onto the 0.0.4 ones the way client libraries do: info and stateset as gauge,
gaugehistogram and unknown as untyped), else ``untyped``. Lines are ordered by metric name, except
that the ``_bucket``/``_sum``/``_count`` series of a typed histogram or summary stay together
under their family's one TYPE line (a 0.0.4 family is contiguous); ``_created`` series are untyped.

Values are written with the shortest digits that read back to the same float64 (NaN, +Inf, -Inf
as in Prometheus's text format), timestamps as int64 milliseconds. Series are few per response
compared with samples elsewhere (one sample each), so labels are rendered per series; numbers are
formatted column-wise.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from storage.labels import Labels
from turboprom.api_json import format_values

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# metadata type -> (0.0.4 type, sample-name suffixes that belong to the family besides its own name)
_TYPES = {
    "counter": ("counter", ("_total",)),
    "gauge": ("gauge", ()),
    "histogram": ("histogram", ("_bucket", "_sum", "_count")),
    "summary": ("summary", ("_sum", "_count")),
    "info": ("gauge", ("_info",)),
    "stateset": ("gauge", ()),
    "gaugehistogram": ("untyped", ()),
    "unknown": ("untyped", ()),
    "untyped": ("untyped", ()),
}
_GROUPED = ("histogram", "summary")  # families whose suffixed series share one TYPE line
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_info")


def _escape(v: str) -> str:
    if "\\" in v or '"' in v or "\n" in v:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return v


def family_of(name: str, type_of: Callable[[str], str | None]) -> tuple[str, str]:
    """(TYPE-line name, 0.0.4 type) of a sample name: its own metadata first, then that of the
    family it is a suffixed member of (``x_bucket`` of histogram ``x``, ``x_total`` of counter ``x``)."""
    t = type_of(name)
    if t is not None:
        return name, _TYPES.get(t, ("untyped", ()))[0]
    for sfx in _SUFFIXES:
        if name.endswith(sfx) and len(name) > len(sfx):
            fam = name[: -len(sfx)]
            ft = type_of(fam)
            if ft is not None and sfx in _TYPES.get(ft, ("untyped", ()))[1]:
                mapped = _TYPES[ft][0]
                # Grouped families keep the family's name on the TYPE line; a counter ``x``'s
                # sample ``x_total`` is typed under its own sample name, as client libraries write it.
                return (fam if ft in _GROUPED else name), mapped
    return name, "untyped"


def encode(labels: Sequence[Labels], timestamps: np.ndarray, values: np.ndarray,
           type_of: Callable[[str], str | None], add_empty_instance: bool = True) -> bytes:
    """One line per series (``labels[i]`` with ``values[i]`` at ``timestamps[i]``), grouped into
    families as described in the module doc. ``add_empty_instance``: like Prometheus, a series
    without an ``instance`` label gets ``instance=""``, so that a scraper with ``honor_labels``
    does not attach its target's instance to it."""
    n = len(labels)
    if n == 0:
        return b""
    vals = format_values(np.asarray(values, dtype=np.float64))
    tss = list(map(str, np.asarray(timestamps, dtype=np.int64).tolist()))
    names = [dict(lbl).get("__name__", "") for lbl in labels]
    fam_cache: dict[str, tuple[str, str]] = {}
    for nm in set(names):
        fam_cache[nm] = family_of(nm, type_of)
    # Stable order: (TYPE-line name, sample name); the input is already sorted by labels.
    order = sorted(range(n), key=lambda i: (fam_cache[names[i]][0], names[i]))
    out: list[str] = []
    last_family = None
    for i in order:
        nm = names[i]
        if not nm:
            continue  # nameless series are not exposable (Prometheus skips them too)
        fam, typ = fam_cache[nm]
        if fam != last_family:
            out.append(f"# TYPE {fam} {typ}\n")
            last_family = fam
        pairs = [f'{k}="{_escape(v)}"' for k, v in labels[i] if k != "__name__" and v != ""]
        if add_empty_instance and not any(k == "instance" for k, _ in labels[i]):
            pairs.append('instance=""')
        lbl = "{" + ",".join(pairs) + "}" if pairs else ""
        out.append(f"{nm}{lbl} {vals[i]} {tss[i]}\n")
    return "".join(out).encode()
