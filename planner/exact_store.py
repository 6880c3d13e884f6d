"""Pane payloads of the exact algorithms (moments + counter) for one SDS: dense (series x pane) arrays.

Samples arrive per series in time order (storage refuses out-of-order samples by default, and this
store drops anything not newer than the series' last sample, mirroring it). A batch is folded in with
numpy only: group by (series, pane), reduce each group, then merge groups into existing panes with
``combine`` (the boundary pair between an open pane and its continuation is accounted exactly).

Each pane also keeps its *entry* pair (previous sample of the series -> first sample of the pane):
``entry_corr`` / ``entry_resets`` / ``entry_changes``. A pane range subtracts the entry of its first
non-empty pane, so ranges that start anywhere stay exact.

Change tracking for readers that keep derived results (``planner/summary_scan.py``'s step cache):
``version`` counts every write; ``epoch`` counts writes that may change a pane a cached result relied
on, i.e. a pane in [``cache_floor``, ``seal_mark``) (the lowest coverage start and the highest sealed
boundary of any cached result): live samples that land there (late or lagging series, rebuilds after
late samples), restored rows, a backfill reaching into it. Backfill below ``cache_floor`` (coverage
growing into the past) does not count: a cached window took that part from raw edges. Its entry fix
at the old coverage start does not either: a pane range always subtracts the entry of its own first
non-empty pane, so only ranges starting below that pane see the fixed entry.
"""
from __future__ import annotations

import threading
from typing import Iterable

import numpy as np

from planner.algorithms.exact import FIELDS, INT_FIELDS, SegStats, boundary, combine, segments_from_sorted
from planner.pane_layout import grown_layout
from planner.pane_prefix import PanePrefix, Rows, window_stats
from planner.pane_store import PaneStoreParts, SeriesShift

ENTRY_FIELDS = ("entry_corr", "entry_resets", "entry_changes")
ALL_FIELDS = FIELDS + ENTRY_FIELDS
# what every store keeps, whatever it serves: the sample count and the first / last sample of each pane
# (aligned-window snapping, raw-edge boundaries, the live chain after a restart or a late rebuild)
BASE_FIELDS = ("count", "first_t", "first_v", "last_t", "last_v")


def stored_fields(needs: Iterable[str] | None) -> tuple[str, ...]:
    """The pane fields a store keeps to serve functions reading ``needs`` (``served_functions.SERVED``
    entries' ``needs``); ``None``: every field. A plan for ``rate`` of histogram buckets keeps 7 of the
    18 (56 of 144 bytes per series and pane)."""
    if needs is None:
        return ALL_FIELDS
    want = set(BASE_FIELDS) | set(needs)
    want |= {"entry_" + f for f in ("corr", "resets", "changes") if f in want}
    unknown = want - set(ALL_FIELDS)
    if unknown:
        raise ValueError(f"unknown exact pane fields: {', '.join(sorted(unknown))}")
    return tuple(f for f in ALL_FIELDS if f in want)


def _blank(field: str, shape: tuple[int, int]) -> np.ndarray:
    if field in INT_FIELDS or field in ("entry_resets", "entry_changes"):
        return np.zeros(shape, np.int64)
    if field in ("vmin", "vmax"):
        return np.full(shape, np.nan)
    return np.zeros(shape, np.float64)


class ExactPaneStore(SeriesShift, PaneStoreParts):
    def __init__(self, pane_ms: int, fields: Iterable[str] | None = None):
        self.pane_ms = int(pane_ms)
        self.fields = ALL_FIELDS if fields is None else stored_fields(fields)  # the pane fields kept
        self.lock = threading.RLock()
        self.k0 = 0  # pane index of column 0
        self.nk = 0  # columns in use
        self.ns = 0  # series in use
        self._phys: dict[str, np.ndarray] = {f: _blank(f, (0, 0)) for f in self.fields}
        self._off = 0
        self.cols: dict[str, np.ndarray] = {}
        self._set_views()
        self.shift = np.zeros(0)  # per-series shift constant c (NaN = not chosen yet)
        self.last_t = np.zeros(0, np.int64)  # chain state for live ingest
        self.last_v = np.zeros(0)
        self.version = 0  # bumped by every write
        self.epoch = 0  # bumped by writes that may touch panes below seal_mark
        self.seal_mark = np.iinfo(np.int64).min  # set by result caches: panes below it were sealed when cached
        self.cache_floor = np.iinfo(np.int64).max  # set by result caches: lowest coverage start they relied on
        self._totals: tuple[int, int, np.ndarray] | None = None  # (version, k0, samples per pane)
        self.step_cache: object | None = None  # planner.summary_scan.StepCache, attached on first use
        self.prefix = PanePrefix()  # running sums over the panes for window reads (planner/pane_prefix.py)

    def note_written(self, k: int) -> None:
        super().note_written(k)
        self.prefix.invalidate_from(k)

    # --- capacity --------------------------------------------------------------------------
    # Physical arrays have slack on both sides; ``cols[f]`` is a view whose column 0 is pane ``k0``,
    # so backfill growing to the left and live ingest growing to the right both amortize to O(1).
    def _set_views(self) -> None:
        self.cols = {f: a[:, self._off :] for f, a in self._phys.items()}

    def flat_columns(self) -> tuple[dict[str, np.ndarray], int, int]:
        """The C-ordered arrays behind ``cols``, their width and the column of pane ``k0`` in them:
        ``phys[f].reshape(-1)[row * width + offset + c]`` is ``cols[f][row, c]`` (a gather by flat
        indexes, where ``cols``' views are not contiguous). Store lock held."""
        return self._phys, self._phys["count"].shape[1], self._off

    def ensure_series(self, n: int) -> None:
        rows = self._phys["count"].shape[0]
        if n <= rows:
            self.ns = max(self.ns, n)
            return
        cap = max(n, 2 * rows, 16)
        for f, a in self._phys.items():
            b = _blank(f, (cap, a.shape[1]))
            b[: a.shape[0]] = a
            self._phys[f] = b
        self._set_views()
        grow = cap - self.shift.shape[0]
        self.shift = np.concatenate([self.shift, np.full(grow, np.nan)])
        self.last_t = np.concatenate([self.last_t, np.full(grow, np.iinfo(np.int64).min)])
        self.last_v = np.concatenate([self.last_v, np.full(grow, np.nan)])
        self.ns = n

    def ensure_panes(self, kmin: int, kmax: int) -> None:
        """Make columns exist for panes kmin..kmax inclusive."""
        if self.nk == 0:
            self.k0 = kmin
        lo = min(self.k0, kmin)
        hi = max(self.k0 + self.nk - 1, kmax)
        pcap = self._phys["count"].shape[1]
        phys_k0 = self.k0 - self._off  # pane index of physical column 0
        if pcap and lo >= phys_k0 and hi < phys_k0 + pcap:
            self._off = lo - phys_k0
            self.k0 = lo
            self.nk = hi - lo + 1
            self._set_views()
            return
        need = hi - lo + 1
        newcap, pk0 = grown_layout(lo, hi + 1, grows_left=bool(self.nk) and lo < self.k0)
        off = lo - pk0
        rows = self._phys["count"].shape[0]
        shift = self.k0 - lo
        for f in self.fields:
            b = _blank(f, (rows, newcap))
            if self.nk:
                b[:, off + shift : off + shift + self.nk] = self.cols[f][:, : self.nk]
            self._phys[f] = b
        self._off = off
        self.k0 = lo
        self.nk = need
        self._set_views()

    def nbytes(self) -> int:
        return self.pane_nbytes() + self.prefix.nbytes()

    def pane_nbytes(self) -> int:
        return int(sum(a[: self.ns, : self.nk].nbytes for a in self.cols.values()))

    def drop_before(self, k: int) -> None:
        """Forget panes older than ``k``: the view starts at ``k`` and the dropped columns are blanked
        (room a later regrowth reclaims, never read back as data)."""
        with self.lock:
            d = min(int(k) - self.k0, self.nk)
            if self.nk == 0 or d <= 0:
                return
            for f, a in self._phys.items():
                a[:, self._off : self._off + d] = _blank(f, (1, 1))[0, 0]
            self._off += d
            self.k0 += d
            self.nk -= d
            self._set_views()
            self.version += 1
            self.prefix.reset()  # rebuilt from the first pane read next (its older sums are no use)

    def clear_from(self, k: int) -> None:
        """Forget panes ``k`` and later (blanked), so a restart can fold them again from raw storage."""
        with self.lock:
            c = max(int(k) - self.k0, 0)
            if c >= self.nk:
                return
            for f, a in self.cols.items():
                a[:, c : self.nk] = _blank(f, (1, 1))[0, 0]
            self.version += 1
            self.epoch += 1
            self.prefix.invalidate_from(int(k))

    # --- ingest ----------------------------------------------------------------------------
    def ingest_sorted(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, *, live: bool = True) -> None:
        """Fold samples sorted by (sid, ts), strictly increasing per sid, stale markers removed.

        ``live``: continue each series' chain (last_t/last_v); otherwise (backfill of an older range)
        the chain starts fresh and the caller fixes the entry of the following pane afterwards.
        """
        n = len(ts)
        if n == 0:
            return
        with self.lock:
            self.choose_shift(sid, vals)
            k = ts // self.pane_ms
            new = np.ones(n, bool)
            new[1:] = (sid[1:] != sid[:-1]) | (k[1:] != k[:-1])
            gs = np.nonzero(new)[0]
            g_sid = sid[gs]
            g_k = k[gs]
            shift = np.nan_to_num(self.shift[sid], nan=0.0)
            seg = segments_from_sorted(gs, vals, ts, shift)
            prev_same = np.zeros(len(gs), bool)
            prev_same[1:] = g_sid[1:] == g_sid[:-1]
            prev_v = np.where(prev_same, vals[np.maximum(gs - 1, 0)], self.last_v[g_sid] if live else np.nan)
            has_prev = prev_same | ((self.last_t[g_sid] != np.iinfo(np.int64).min) if live else False)
            bc, br, bch = boundary(prev_v, seg.first_v, has_prev)
            self.ensure_panes(int(g_k.min()), int(g_k.max()))
            self.note_written(int(g_k.min()))
            self.version += 1
            if int(g_k.min()) < self.seal_mark and int(g_k.max()) >= self.cache_floor:
                if bool(((g_k >= self.cache_floor) & (g_k < self.seal_mark)).any()):
                    self.epoch += 1
            c = g_k - self.k0
            cols = self.cols
            kept = [f for f in FIELDS if f in cols]
            entries = [(e, v) for e, v in (("entry_corr", bc), ("entry_resets", br), ("entry_changes", bch)) if e in cols]
            existing = cols["count"][g_sid, c] > 0
            if existing.any():
                ei = np.nonzero(existing)[0]
                # fields this store does not keep merge as blanks: nothing reads them
                old = SegStats(**{f: cols[f][g_sid[ei], c[ei]] if f in cols else _blank(f, (1, len(ei)))[0]
                                  for f in FIELDS})
                if live:  # continuation of an open pane
                    merged = combine(old, seg.take(ei))
                else:  # backfill of the samples that precede the live part of the pane
                    merged = combine(seg.take(ei), old)
                    for e, v in entries:
                        cols[e][g_sid[ei], c[ei]] = v[ei]
                for f in kept:
                    cols[f][g_sid[ei], c[ei]] = getattr(merged, f)
            fresh = np.nonzero(~existing)[0]
            for f in kept:
                cols[f][g_sid[fresh], c[fresh]] = getattr(seg, f)[fresh]
            for e, v in entries:
                cols[e][g_sid[fresh], c[fresh]] = v[fresh]
            if live:
                last = np.ones(n, bool)
                last[:-1] = sid[1:] != sid[:-1]
                self.last_t[sid[last]] = ts[last]
                self.last_v[sid[last]] = vals[last]

    def fix_entries(self, sid: np.ndarray, prev_v: np.ndarray, from_pane: int) -> None:
        """After filling panes before ``from_pane``: set the entry pair of each series' first non-empty
        pane >= from_pane from its previous sample ``prev_v`` (the last sample before that pane)."""
        with self.lock:
            c0 = from_pane - self.k0
            if c0 >= self.nk or len(sid) == 0:
                return
            c0 = max(c0, 0)
            self.version += 1
            self.note_written(c0 + self.k0)
            if from_pane > self.cache_floor:  # a cached range may start below the fixed pane
                self.epoch += 1
            cnt = self.cols["count"][sid, c0 : self.nk] > 0
            has = cnt.any(axis=1)
            first = np.argmax(cnt, axis=1) + c0
            s, col = sid[has], first[has]
            bc, br, bch = boundary(prev_v[has], self.cols["first_v"][s, col], np.ones(len(s), bool))
            for e, v in (("entry_corr", bc), ("entry_resets", br), ("entry_changes", bch)):
                if e in self.cols:
                    self.cols[e][s, col] = v

    def has_data(self, sids: np.ndarray, pane: int) -> np.ndarray:
        with self.lock:
            c = pane - self.k0
            if c < 0 or c >= self.nk:
                return np.zeros(len(sids), bool)
            return self.cols["count"][sids, c] > 0

    def covers(self, needs: Iterable[str]) -> bool:
        """Whether this store keeps every field in ``needs``."""
        return set(needs) <= set(self.fields)

    def pane_arrays(self, sids: np.ndarray, k_lo: int, k_hi: int, fields: frozenset[str] | None = None) -> dict[str, np.ndarray]:
        """Copies of the (len(sids), k_hi - k_lo) pane arrays for panes [k_lo, k_hi): those ``fields``
        need (with what locating first/last and entries needs), or every field for ``None``. A field
        the store does not keep comes back empty."""
        with self.lock:
            out = {}
            a = max(k_lo - self.k0, 0)
            b = max(min(k_hi - self.k0, self.nk), a)
            pad_l = max(self.k0 - k_lo, 0)
            width = max(k_hi - k_lo, 0)
            need = ALL_FIELDS
            if fields is not None:
                want = set(fields) | {"count"}
                if fields & {"corr", "resets", "changes", "first_v"}:
                    want |= {"first_t", "first_v", "last_t", "last_v"}
                want |= {"entry_" + f for f in ("corr", "resets", "changes") if f in fields}
                need = tuple(f for f in ALL_FIELDS if f in want)
            for f in need:
                res = _blank(f, (len(sids), width))
                arr = self.cols.get(f)
                if b > a and arr is not None:
                    res[:, pad_l : pad_l + (b - a)] = arr[sids, a:b]
                out[f] = res
            return out

    def window_stats(self, sids: np.ndarray, klo: np.ndarray, khi: np.ndarray,
                     fields: frozenset[str] | None = None) -> SegStats:
        """Merged stats of panes [klo_j, khi_j) (absolute indexes; equal bounds: an empty window) of
        each series in ``sids``: what ``range_stats`` gives on ``pane_arrays``, from kept running sums
        (planner/pane_prefix.py), so a window costs O(1) per series whatever its length."""
        with self.lock:
            return window_stats(self, self.prefix, sids, klo, khi, fields)

    def sample_at(self, sids: np.ndarray, ks: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Per j: whether some series of ``sids`` has a sample at exactly ``times[j]`` as the first of
        pane ``ks[j]`` (a pane the store does not hold: no). Series in cache-sized blocks, a run of
        consecutive series by slices."""
        with self.lock:
            idx = np.asarray(ks, np.int64) - self.k0
            held = (idx >= 0) & (idx < self.nk)
            out = np.zeros(len(idx), bool)
            sids = np.asarray(sids, np.int64)
            if not len(sids) or not self.nk or not held.any():
                return out
            safe = np.where(held, idx, 0)
            times = np.asarray(times, np.int64)[None, :]
            step = max(16, (1 << 14) // max(len(idx), 1))
            for a in range(0, len(sids), step):
                rows = Rows(sids[a:a + step])
                out |= ((rows.at(self.cols["first_t"], safe) == times) & (rows.at(self.cols["count"], safe) > 0)).any(axis=0)
            return out & held

    # --- persistence ------------------------------------------------------------------------
    def export_rows(self, k_lo: int, k_hi: int) -> dict[str, np.ndarray]:
        """Non-empty panes in [k_lo, k_hi) as flat columns (series, pane, fields...)."""
        with self.lock:
            a = max(k_lo - self.k0, 0)
            b = max(min(k_hi - self.k0, self.nk), a)
            cnt = self.cols["count"][: self.ns, a:b]
            s, c = np.nonzero(cnt > 0)
            out = {"series": s.astype(np.int64), "pane": (c + a + self.k0).astype(np.int64)}
            for f, arr in self.cols.items():
                out[f] = arr[s, c + a]
            return out

    def import_rows(self, rows: dict[str, np.ndarray]) -> None:
        if len(rows["pane"]) == 0:
            return
        rows = {k: np.asarray(v) for k, v in rows.items()}
        with self.lock:
            s = rows["series"].astype(np.int64)
            self.ensure_series(int(s.max()) + 1)
            self.ensure_panes(int(rows["pane"].min()), int(rows["pane"].max()))
            c = rows["pane"] - self.k0
            for f in self.fields:
                self.cols[f][s, c] = rows[f]
            self.version += 1
            self.epoch += 1
            self.prefix.invalidate_from(int(rows["pane"].min()))

    def pane_totals(self) -> tuple[int, np.ndarray]:
        """(first pane, samples per pane summed over all series): the raw-read cost model's density."""
        with self.lock:
            t = self._totals
            if t is None or t[0] != self.version:
                tot = self.cols["count"][: self.ns, : self.nk].sum(axis=0) if self.nk else np.zeros(0, np.int64)
                t = self._totals = (self.version, self.k0, tot)
            return t[1], t[2]

    def restore_chain(self) -> None:
        """Each series' live chain continues from its last sample in the (restored) panes."""
        with self.lock:
            if not self.nk:
                return
            cnt = self.cols["count"][: self.ns, : self.nk] > 0
            has = cnt.any(axis=1)
            last_col = self.nk - 1 - np.argmax(cnt[:, ::-1], axis=1)
            s = np.nonzero(has)[0]
            self.last_t[s] = self.cols["last_t"][s, last_col[s]]
            self.last_v[s] = self.cols["last_v"][s, last_col[s]]
