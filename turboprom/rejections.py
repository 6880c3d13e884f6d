"""Storage rejections as a message an operator can act on.

Storage reports why it refused samples (``AppendResult.rejected``) and the time bounds that applied
(``AppendResult.bounds``); it knows nothing of the command line. This module names the window behind
each reason, the flag that changes it, and ``turboprom import`` for history, so every write path
(remote write 1.0/2.0, text import, OTLP) answers the same text.
"""
from __future__ import annotations

import datetime as _dt

from promql.printer import format_duration_ms as format_duration
from storage.columns import INT64_MIN
from storage.interface import AppendResult

HISTORY_HINT = "load history with `turboprom import FILE` (it writes blocks directly)"


def format_time_ms(ms: int) -> str:
    """RFC 3339 UTC with milliseconds, e.g. 2026-12-02T07:36:00.000Z."""
    t = _dt.datetime.fromtimestamp(ms / 1000.0, _dt.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def hint(reason: str, b: dict[str, int]) -> str | None:
    """Which window refused samples for ``reason`` and how to widen it (None: no such advice)."""
    if reason == "in_head_range":
        return (f"the head holds samples from {format_time_ms(b['head_min'])} on: that range is still written by the live "
                "path, so an import takes only older samples (as promtool's backfill); write recent samples with remote "
                "write or POST /api/v1/import/prometheus")
    if reason == "too_far_in_future":
        return f"samples may be at most until {format_time_ms(b['future_max'])} ({format_duration(b.get('future_tolerance_ms', 0))} ahead of the wall clock)"
    if reason == "beyond_retention":
        return (f"beyond retention: older than {format_time_ms(b['retention_min'])}, the start of the retention window "
                f"(--retention-time {format_duration(b['retention_ms'])}, measured back from the newest sample); retention "
                "would delete them at once, so they were not written: raise --retention-time to keep data that old")
    if reason == "out_of_order":
        return ("out of order: older than the newest sample of their series and --out-of-order-window is 0 (off): "
                f"start the server with --out-of-order-window (e.g. 1h) to accept late samples, or {HISTORY_HINT}")
    if reason == "too_old":
        w = b.get("ooo_window_ms", 0)
        if w > 0:
            start = b.get("ooo_min", INT64_MIN)
            since = f" (before {format_time_ms(start)})" if start != INT64_MIN else ""
            return (f"too old: outside the out-of-order window (--out-of-order-window {format_duration(w)}, measured back "
                    f"from the newest sample in the head){since}: widen --out-of-order-window, or {HISTORY_HINT}")
        mvt = b.get("min_valid_time", INT64_MIN)
        return (f"too old: before the head's min valid time {format_time_ms(mvt) if mvt != INT64_MIN else ''} (the end of the "
                "data already persisted in blocks) and --out-of-order-window is 0: set --out-of-order-window to accept "
                f"samples that far back, or {HISTORY_HINT}")
    return None


def storage_problem(result: AppendResult, total: int) -> str:
    """'N of M samples rejected by storage (counts); first: ...; why and how to change it'."""
    detail = ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in sorted(result.rejected.items()))
    msg = f"{result.rejected_total} of {total} samples rejected by storage ({detail})"
    if result.errors:
        msg += f"; first: {'; '.join(result.errors[:3])}"
    hints = [h for r in sorted(result.rejected) if (h := hint(r, result.bounds)) is not None] if result.bounds else []
    if hints:
        msg += "; " + "; ".join(hints)
    return msg
