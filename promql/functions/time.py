"""time(), timestamp() and the calendar functions (UTC), vectorized with numpy datetime math."""
from __future__ import annotations

import numpy as np

from promql.functions import FunctionContext, Histograms, register
from promql.functions.common import vector_arg
from promql.types import Scalar, Value, VectorSteps


@register("time")
def time_(ctx: FunctionContext, args: list[Value]) -> Value:
    return Scalar(np.asarray(ctx.step_times, dtype=np.float64) / 1000.0)


@register("timestamp", histograms=Histograms.PRESENCE)
def timestamp(ctx: FunctionContext, args: list[Value]) -> Value:
    vec = vector_arg(args[0])
    if vec.sample_ts is not None:
        ts = np.asarray(vec.sample_ts, dtype=np.float64)
    else:
        ts = np.broadcast_to(np.asarray(ctx.step_times, dtype=np.float64)[None, :], vec.values.shape)
    return VectorSteps(list(vec.labels), ts / 1000.0, vec.present.copy(), np.ones(vec.num_series, dtype=bool))


_I64_MIN = np.iinfo(np.int64).min
# Go's time package adds this to Unix seconds to get its "absolute" calendar seconds, in uint64:
# Unix times below -_GO_ABS_SHIFT wrap around by 2**64 (NaN/Inf/out-of-range values convert to
# the minimum int64 on amd64, which therefore reads as 292277026596-12-04 15:30:08 UTC there).
_GO_ABS_SHIFT = 9223372028683721448
_TWO63_DAYS, _TWO63_SOD = divmod(2**63, 86400)


def _seconds(v: np.ndarray) -> np.ndarray:
    """Go's int64(float) conversion on amd64: truncation toward zero; NaN, Inf and values outside
    [-2^63, 2^63) give the minimum int64."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(v) | (v >= 2.0**63) | (v < -(2.0**63))
        return np.where(bad, _I64_MIN, np.trunc(np.where(bad, 0, v))).astype(np.int64)


def _days_and_seconds(secs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Days since 1970-01-01 and second of the day of Unix seconds, as Go's calendar sees them
    (times below -_GO_ABS_SHIFT wrap around by 2**64, like Go's uint64 absolute seconds)."""
    days = np.floor_divide(secs, 86400)
    sod = secs - days * 86400
    wrap = secs < -_GO_ABS_SHIFT
    if wrap.any():
        a = (secs[wrap] + np.int64(2**62)) + np.int64(2**62)  # secs + 2**63, in [0, 2**63)
        rem = a % 86400 + _TWO63_SOD
        days[wrap] = a // 86400 + _TWO63_DAYS + rem // 86400  # (secs + 2**64) // 86400
        sod[wrap] = rem % 86400
    return days, sod


def _civil(secs: np.ndarray) -> dict[str, np.ndarray]:
    days, sod = _days_and_seconds(secs)
    d64 = days.astype("datetime64[D]")
    years = d64.astype("datetime64[Y]")
    months = d64.astype("datetime64[M]")
    year = years.astype(np.int64) + 1970
    month = (months.astype(np.int64) % 12) + 1
    dom = (d64 - months.astype("datetime64[D]")).astype(np.int64) + 1
    doy = (d64 - years.astype("datetime64[D]")).astype(np.int64) + 1
    dim = ((months + 1).astype("datetime64[D]") - months.astype("datetime64[D]")).astype(np.int64)
    return {
        "year": year,
        "month": month,
        "day_of_month": dom,
        "day_of_year": doy,
        "days_in_month": dim,
        "day_of_week": (days + 4) % 7,  # 1970-01-01 was a Thursday; Sunday = 0
        "hour": sod // 3600,
        "minute": (sod % 3600) // 60,
    }


def _date_fn(part: str):
    def impl(ctx: FunctionContext, args: list[Value]) -> Value:
        if not args:
            secs = np.asarray(ctx.step_times, dtype=np.int64) // 1000
            vals = _civil(secs)[part].astype(np.float64)[None, :]
            return VectorSteps([()], vals, np.ones_like(vals, dtype=bool), np.zeros(1, dtype=bool))
        vec = vector_arg(args[0])
        secs = _seconds(vec.values)
        with np.errstate(all="ignore"):
            vals = _civil(secs)[part].astype(np.float64)
        return VectorSteps(list(vec.labels), vals, vec.present.copy(), np.ones(vec.num_series, dtype=bool))

    return impl


for _part in ("year", "month", "day_of_month", "day_of_year", "days_in_month", "day_of_week", "hour", "minute"):
    register(_part, keeps_name=True)(_date_fn(_part))  # no argument: vector(time()), named by nothing


def _query_bound(which: str):
    def impl(ctx: FunctionContext, args: list[Value]) -> Value:
        start, end, step = ctx.query_start_ms, ctx.query_end_ms, ctx.query_step_ms
        v = {"start": start, "end": end, "step": step, "range": end - start}[which] / 1000.0
        return Scalar(np.full(len(ctx.step_times), v))

    return impl


# Experimental query-bound scalars: start(), end(), step() and range() of the top-level query
# (an instant query has start == end and step 0).
for _which in ("start", "end", "step", "range"):
    register(_which, experimental=True)(_query_bound(_which))


@register("start_timestamp", experimental=True)
def start_timestamp(ctx: FunctionContext, args: list[Value]) -> Value:
    """Experimental. This storage keeps no start timestamps (created timestamps), which is
    Prometheus with start timestamps disabled: the result is empty."""
    return VectorSteps.empty(vector_arg(args[0]).num_steps)
