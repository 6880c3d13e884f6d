"""Where a dense (rows x panes) summary matrix puts its spare columns when it must grow.

Both ends of a plan's pane range move: live ingest adds a pane at the right every pane interval, and a
backfill adds chunks of older panes at the left while live ingest goes on. A matrix that gives all its
spare room to the side that triggered the growth copies itself again at the next pane of the other
side, so a backfill interleaved with live ingest copied the whole matrix once or twice per chunk (a
24 h plan of ~1,400 bucket series: ~100 copies of up to ~110 MB, each holding the store's lock while
ingest and reads wait). Growing by half the current size, with most of the room on the growing side
and some on the other, keeps copies logarithmic in the final size for both directions at once and the
spare memory at most half the used part.
"""
from __future__ import annotations

MIN_SLACK = 64  # panes


def grown_layout(lo: int, hi: int, grows_left: bool) -> tuple[int, int]:
    """(capacity in panes, pane index of physical column 0) for a matrix that must hold panes
    [lo, hi): half the needed width again as slack, three quarters of it on the side that grew."""
    need = hi - lo
    slack = max(need // 2, MIN_SLACK)
    left = slack * 3 // 4 if grows_left else slack // 4
    return need + slack, lo - left
