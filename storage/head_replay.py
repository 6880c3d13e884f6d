"""WAL replay into a series index and a head: the server's startup, and ``turboprom sql``'s view of
the head (read-only: a torn tail is skipped, not repaired, since the server may be writing it)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from storage.columns import dedupe_sorted, grow, sort_by_series_time
from storage.head import Head
from storage.index import SeriesIndex
from storage.wal import Handler, replay_wal

log = logging.getLogger("turboprom.storage")


def replay_head(wal_dir: Path, index: SeriesIndex, head: Head, *, repair: bool = True) -> dict:
    """Apply the newest checkpoint and later segments to ``index`` and ``head``; replay_wal's stats."""
    remap = np.full(0, -1, dtype=np.int64)
    pend: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def on_series(items: list) -> None:
        nonlocal remap
        hi = max((it[0] for it in items), default=-1)
        remap = grow(remap, hi + 1, -1)
        for sid, pairs in items:
            remap[sid] = index.get_or_create(tuple((a, b) for a, b in pairs))[0]

    def on_samples(sid: np.ndarray, ts: np.ndarray, val: np.ndarray) -> None:
        g = remap[sid]
        if (g < 0).any():  # a record referencing an undefined id: skip those rows
            ok = g >= 0
            log.warning("WAL samples record references %d undefined series ids; skipped", int((~ok).sum()))
            g, ts, val = g[ok], ts[ok], val[ok]
        pend.append((g, ts, val))

    def flush() -> None:
        # Sorted runs of ~2M rows each: smaller sorts stay in cache; reads merge across runs.
        head.ensure(len(index))
        while pend:
            take, n = 0, 0
            while take < len(pend) and n < 2_000_000:
                n += len(pend[take][0])
                take += 1
            chunk = pend[:take]
            del pend[:take]
            s, t, v = sort_by_series_time(np.concatenate([p[0] for p in chunk]), np.concatenate([p[1] for p in chunk]),
                                          np.concatenate([p[2] for p in chunk]))
            s, t, v = dedupe_sorted(s, t, v)
            head.commit(s, t, v, as_run=True)

    def on_tombstone(series: list, mint: int, maxt: int) -> None:
        flush()
        ids = [index.get(tuple((a, b) for a, b in lb)) for lb in series]
        ids = np.array([i for i in ids if i is not None], dtype=np.int64)
        if len(ids):
            sel = np.zeros(len(index), dtype=bool)
            sel[ids] = True
            head.drop_rows(lambda r: sel[r.sid] & (r.ts >= mint) & (r.ts <= maxt))

    stats = replay_wal(wal_dir, Handler(on_series, on_samples, on_tombstone), repair=repair)
    flush()
    head.ensure(len(index))
    return stats
