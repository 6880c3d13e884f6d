"""Running sums over an exact store's panes, kept between reads: a window's additive fields from two
columns per series instead of a pass over every pane in the window.

``range_stats`` (planner/pane_ranges.py) builds its prefix sums over the panes a read asks for, on
every read. A refresh at the live tip or a rule's instant query evaluates one or a few windows, and
rebuilding the sums of every pane in them costs about what reading the raw samples costs when a pane
holds a few samples (15 s panes of a 5 s scrape), and far more for an hour or a day of panes. Here the
sums of each additive field (the counts, ``s1``/``s2``, and the counter terms plus their entry pairs)
persist beside the store's pane arrays: column ``j`` holds the sum of panes ``[k_lo, k_lo + j)`` for
every series. A read extends them over the panes sealed since the last read (a pane or two per
refresh); a write into a pane they cover (a late sample, a rebuild, restored rows) cuts them back to
that pane, so they are recomputed from there on the next read. Reads and writes hold the store's lock.

The first / last non-empty pane of each window (first and last sample, the entry pair to subtract)
come from the count sums: the window's first pane where it holds a sample (the common case), else a
binary search over the series' count sums, vectorized over the (series, window) pairs that need one.

Float sums are as precise as ``range_stats``'s: kept in extended precision, and a window whose
difference of two sums is not within ``PREFIX_TOL`` of the magnitude of its own panes (a huge value
earlier in the series, an infinity) is summed over its panes instead. A window with no non-zero term
(counted exactly, in integers) sums to exactly zero: the counter correction of a window without a
reset, however large the corrections before it. The counter correction keeps only those counts: its
terms are zero but at a reset, so the few windows holding one sum their own panes (in extended
precision), and a ``rate`` plan's sums take 8 bytes per series and pane instead of 32.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from planner.algorithms.exact import SegStats
from planner.pane_ranges import EPS_LD, PREFIX_TOL, sparse_query

# additive window fields -> the pane fields whose sum they are (the counter terms add the entry pair)
_INT_TERMS = {"count": ("count",), "nnan": ("nnan",), "npinf": ("npinf",), "nninf": ("nninf",),
              "resets": ("resets", "entry_resets"), "changes": ("changes", "entry_changes")}
_FLOAT_TERMS = {"s1": ("s1",), "s2": ("s2",), "corr": ("corr", "entry_corr")}
# float fields whose terms are mostly zero (a counter's correction: only at a reset): only their
# non-zero counts are kept, and a window with a non-zero term sums its own panes
_SPARSE = frozenset({"corr"})
# fields read from the first / last non-empty pane of a window
_EDGE_FIELDS = frozenset({"first_v", "corr", "resets", "changes"})


def _names(fields: frozenset[str] | None) -> set[str]:
    """The sums a read of ``fields`` (None: every field) takes."""
    want = (lambda f: True) if fields is None else (lambda f: f in fields)  # noqa: E731
    names = {"count"} | {f for f in ("nnan", "npinf", "nninf", "s1", "s2") if want(f)}
    if fields is None or fields & _EDGE_FIELDS:
        names |= {f for f in ("corr", "resets", "changes") if want(f)}
    return names


def bytes_per_pane(fields: frozenset[str] | None) -> int:
    """Bytes per series and pane of the sums kept for reads of ``fields`` (None: every field): the
    cost model's storage figure beside the panes' own."""
    return sum(4 if f in _INT_TERMS or f in _SPARSE else 28 for f in _names(fields))


class PanePrefix:
    """The kept sums of one store (see the module docstring). ``sums[f]`` is (rows, capacity + 1):
    int32 for integer fields (a series' samples over a history are far fewer than 2^31), extended
    precision for float ones; float fields also keep the sums of |term| (float64, for the precision
    check) and of term != 0 (int32); a sparse field (``corr``) keeps only the latter. 8 bytes per series
    and pane for a ``rate`` plan (whose panes take 56), over the panes reads asked for since the last
    trim."""

    def __init__(self) -> None:
        self.k_lo = 0  # pane of column 0
        self.n = 0  # panes summed: columns 0..n are valid
        self.rows = 0
        self.sums: dict[str, np.ndarray] = {}
        self.mags: dict[str, np.ndarray] = {}
        self.nonzero: dict[str, np.ndarray] = {}

    def reset(self) -> None:
        self.sums, self.mags, self.nonzero = {}, {}, {}
        self.n = self.rows = 0

    def invalidate_from(self, k: int) -> None:
        """A write into pane ``k``: sums of panes from ``k`` on are recomputed on the next read."""
        if k < self.k_lo + self.n:
            self.n = max(int(k) - self.k_lo, 0)

    def nbytes(self) -> int:
        """Bytes of the sums in use (as the store counts its panes: spare capacity left out)."""
        return int(sum(a[:, : self.n + 1].nbytes for d in (self.sums, self.mags, self.nonzero) for a in d.values()))

    def ensure(self, store: Any, names: set[str], k_from: int, k_to: int) -> None:
        """Sums of ``names`` valid over panes [k_lo, k_to) with k_lo <= k_from (store lock held)."""
        ns = store.ns
        if self.rows != ns or k_from < self.k_lo or not names <= set(self.sums) | set(self.nonzero):
            keep = names | set(self.sums) | set(self.nonzero)
            self.reset()
            self.k_lo, self.rows = int(k_from), ns
            cap = max(k_to - k_from, 1) * 3 // 2 + 16
            for f in keep:
                self._alloc(f, cap)
        cap = next(iter(self.sums.values())).shape[1] - 1
        if k_to - self.k_lo > cap:
            self._grow(max(k_to - self.k_lo, cap * 3 // 2 + 16))
        if k_to > self.k_lo + self.n:
            self._extend(store, k_to)

    def _alloc(self, f: str, cap: int) -> None:
        if f in _INT_TERMS:
            self.sums[f] = np.zeros((self.rows, cap + 1), np.int32)
            return
        if f not in _SPARSE:
            self.sums[f] = np.zeros((self.rows, cap + 1), np.longdouble)
            self.mags[f] = np.zeros((self.rows, cap + 1), np.float64)
        self.nonzero[f] = np.zeros((self.rows, cap + 1), np.int32)

    def _grow(self, cap: int) -> None:
        for d in (self.sums, self.mags, self.nonzero):
            for f, a in d.items():
                b = np.zeros((a.shape[0], cap + 1), a.dtype)
                b[:, : self.n + 1] = a[:, : self.n + 1]
                d[f] = b

    def _extend(self, store: Any, k_to: int) -> None:
        a, w = self.n, k_to - self.k_lo - self.n
        ca = self.k_lo + a - store.k0  # store column of the first pane to add
        lo, hi = max(ca, 0), min(ca + w, store.nk)
        for f in [*self.sums, *(f for f in self.nonzero if f not in self.sums)]:
            term = np.zeros((self.rows, w), np.int64 if f in _INT_TERMS else np.float64)
            if hi > lo:
                for src in _INT_TERMS.get(f) or _FLOAT_TERMS[f]:
                    term[:, lo - ca : hi - ca] += store.cols[src][: self.rows, lo:hi]
            P = self.sums.get(f)
            if f in _INT_TERMS:
                np.cumsum(term, axis=1, dtype=np.int32, out=P[:, a + 1 : a + 1 + w])
                P[:, a + 1 : a + 1 + w] += P[:, a : a + 1]
                continue
            if P is not None:
                with np.errstate(over="ignore", invalid="ignore"):
                    np.cumsum(term.astype(np.longdouble), axis=1, out=P[:, a + 1 : a + 1 + w])
                    P[:, a + 1 : a + 1 + w] += P[:, a : a + 1]
                    M = self.mags[f]
                    np.cumsum(np.abs(term), axis=1, out=M[:, a + 1 : a + 1 + w])
                    M[:, a + 1 : a + 1 + w] += M[:, a : a + 1]
            Z = self.nonzero[f]
            np.cumsum(term != 0, axis=1, dtype=np.int32, out=Z[:, a + 1 : a + 1 + w])
            Z[:, a + 1 : a + 1 + w] += Z[:, a : a + 1]
        self.n = k_to - self.k_lo

    # --- reads (relative columns: pane k is column k - k_lo) ---------------------------------------
    def int_sums(self, f: str, rows: "Rows", lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        P = self.sums[f]
        return rows.at(P, hi).astype(np.int64) - rows.at(P, lo)

    def float_sums(self, store: Any, f: str, rows_: "Rows", lo: np.ndarray, hi: np.ndarray,
                   minus: np.ndarray | None = None) -> np.ndarray:
        """(S, T) float64 sums of field ``f`` over columns [lo_j, hi_j), less ``minus`` (S, T) where given,
        computed in extended precision and rounded once. A window with no non-zero term is exactly
        ``0 - minus``; the extended-precision work covers only the block of series and windows that
        have one (a counter's correction: the few series and windows around a reset)."""
        Z = self.nonzero[f]
        nz = (rows_.at(Z, hi) - rows_.at(Z, lo)) != 0
        out = np.zeros(nz.shape) if minus is None else np.negative(minus)
        rr = np.flatnonzero(nz.any(axis=1))
        if not len(rr):
            return out
        cc = np.flatnonzero(nz.any(axis=0))
        if f not in self.sums:  # a sparse field: the windows with a non-zero term sum their own panes
            cell = _ix(rr, cc)
            tot = self._direct(store, f, rows_.sel[rr], lo[cc], hi[cc])
            if minus is not None:
                tot -= minus[cell]
            out[cell] = np.where(nz[cell], _f64(tot), out[cell])
            return out
        if len(rr) == nz.shape[0] and len(cc) == nz.shape[1]:
            tot = self._ld_sums(store, f, rows_, lo, hi, nz)
            if minus is not None:
                tot -= minus
            out[nz] = _f64(tot[nz])
            return out
        cell = _ix(rr, cc)
        tot = self._ld_sums(store, f, Rows(rows_.sel[rr]), lo[cc], hi[cc], nz[cell])
        if minus is not None:
            tot -= minus[cell]
        out[cell] = np.where(nz[cell], _f64(tot), out[cell])
        return out

    def _ld_sums(self, store: Any, f: str, rows_: "Rows", lo: np.ndarray, hi: np.ndarray, nz: np.ndarray) -> np.ndarray:
        """(S, T) extended-precision sums of ``f`` over columns [lo_j, hi_j): the difference of two kept
        sums, or the window's own panes summed where that difference is not precise enough (only
        where ``nz``: a window with a non-zero term)."""
        P, M = self.sums[f], self.mags[f]
        sel = rows_.sel
        with np.errstate(over="ignore", invalid="ignore"):
            out = rows_.at(P, hi) - rows_.at(P, lo)
            mhi = rows_.at(M, hi)
            bound = (hi - lo).astype(np.float64)[None, :] * EPS_LD * mhi
            bad = ~(bound <= PREFIX_TOL * (mhi - rows_.at(M, lo)))  # NaN (an infinity in the sums) is bad too
        bad &= nz
        if bad.any():
            rows = np.flatnonzero(bad.any(axis=1))
            cols = np.flatnonzero(bad.any(axis=0))
            direct = self._direct(store, f, sel[rows], lo[cols], hi[cols])
            sub = out[_ix(rows, cols)]
            out[_ix(rows, cols)] = np.where(bad[_ix(rows, cols)], direct, sub)
        return out

    def _direct(self, store: Any, f: str, sids: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """(len(sids), len(lo)) extended-precision sums of ``f``'s terms over each window's own panes
        (columns [lo_j, hi_j)), from the store's columns."""
        with np.errstate(over="ignore", invalid="ignore"):
            ka, kb = int(lo.min()), int(hi.max())
            ca = self.k_lo + ka - store.k0
            term = np.zeros((len(sids), kb - ka + 1), np.longdouble)  # the last column closes the last window
            c0, c1 = max(ca, 0), min(ca + kb - ka, store.nk)
            if c1 > c0:
                for src in _FLOAT_TERMS[f]:
                    term[:, c0 - ca : c1 - ca] += store.cols[src][sids, c0:c1]
            idx = np.empty(2 * len(lo), np.int64)
            idx[0::2], idx[1::2] = lo - ka, hi - ka
            direct = np.add.reduceat(term, idx, axis=1)[:, 0::2]
        direct[:, hi == lo] = 0
        return direct


def _f64(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):  # a sum past the float range is an infinity, as raw's
        return a.astype(np.float64)


def _ix(rows: np.ndarray, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the (rows x cols) cells (``np.ix_`` without its per-call checks)."""
    return rows[:, None], cols[None, :]


class Rows:
    """A read's series (rows of the store and of the sums), gathered by a slice when they are one run
    of consecutive rows (a plan's whole metric, the usual case): a column gather per row run is a few
    times faster than a 2-D fancy index."""

    def __init__(self, sel: np.ndarray):
        self.sel = sel
        n = len(sel)
        r0 = int(sel[0]) if n else 0
        run = n > 0 and int(sel[-1]) - r0 + 1 == n and bool((np.diff(sel) == 1).all())
        self.run = slice(r0, r0 + n) if run else None

    def at(self, A: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """(S, T) cells of ``A``: each read row at the columns ``cols`` (T,)."""
        if self.run is not None:
            B = A[self.run]
            # take() copies a non-contiguous array whole first (a store's column views): index instead
            return B.take(cols, axis=1) if B.flags.c_contiguous else B[:, cols]
        return A[self.sel[:, None], cols[None, :]]

    def flat_index(self, width: int, cols: np.ndarray) -> np.ndarray:
        """(S, T) flat indexes into a C-ordered matrix ``width`` wide: row i at the columns ``cols[i]``."""
        idx = self.sel[:, None] * np.int64(width)
        return idx + cols


def _search(C: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Smallest column c in [lo, hi] with C[rows, c] >= target, per element (C non-decreasing along
    rows; C[rows, hi] >= target): a binary search run on every element at once."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        act = lo < hi
        if not act.any():
            return lo
        mid = (lo + hi) // 2
        ge = C[rows, mid] >= target
        hi = np.where(act & ge, mid, hi)
        lo = np.where(act & ~ge, mid + 1, lo)


_DIRECT_WINDOWS = 8  # up to this many windows, min / max straight from the store's columns


def extremes(store: Any, out: SegStats, sids: np.ndarray, klo: np.ndarray, khi: np.ndarray, has_w: np.ndarray,
             want: Any) -> None:
    """``vmin`` / ``vmax`` of each window: a few windows (a refresh's newest, a rule's one) reduced
    straight from the store's columns, more from a sparse table over a copy of their panes."""
    with np.errstate(invalid="ignore"):
        if len(klo) <= _DIRECT_WINDOWS:
            for j in np.flatnonzero(has_w):
                a, b = max(int(klo[j]) - store.k0, 0), min(int(khi[j]) - store.k0, store.nk)
                if b > a:
                    for f, fn in (("vmin", np.fmin), ("vmax", np.fmax)):
                        if want(f):
                            getattr(out, f)[:, j] = fn.reduce(store.cols[f][sids, a:b], axis=1)
            return
        k_from, k_to = int(klo[has_w].min()), int(khi[has_w].max())
        p = store.pane_arrays(sids, k_from, k_to, frozenset(f for f in ("vmin", "vmax") if want(f)))
        a_lo, a_hi = np.where(has_w, klo - k_from, 0), np.where(has_w, khi - k_from, 0)
        for f, fn in (("vmin", np.fmin), ("vmax", np.fmax)):
            if want(f):
                setattr(out, f, sparse_query(p[f], a_lo, a_hi, fn))


def window_stats(store: Any, prefix: PanePrefix, sids: np.ndarray, klo: np.ndarray, khi: np.ndarray,
                 fields: frozenset[str] | None = None) -> SegStats:
    """What ``range_stats(store.pane_arrays(sids, ...), ...)`` gives for panes [klo_j, khi_j) (absolute
    pane indexes; klo_j == khi_j: an empty window), from the kept sums. Store lock held."""
    sids = np.asarray(sids, np.int64)
    klo = np.asarray(klo, np.int64)
    khi = np.maximum(np.asarray(khi, np.int64), klo)
    S, T = len(sids), len(klo)
    out = SegStats.empty((S, T))
    has_w = khi > klo
    if not S or not has_w.any():
        return out
    want = (lambda f: True) if fields is None else (lambda f: f in fields)  # noqa: E731
    edges = fields is None or bool(fields & _EDGE_FIELDS)
    names = _names(fields)
    k_from, k_to = int(klo[has_w].min()), int(khi[has_w].max())
    prefix.ensure(store, names, k_from, k_to)
    lo = np.where(has_w, klo - prefix.k_lo, 0)
    hi = np.where(has_w, khi - prefix.k_lo, 0)
    rows = Rows(sids)
    for f in ("count", "nnan", "npinf", "nninf"):
        if f in names:
            setattr(out, f, prefix.int_sums(f, rows, lo, hi))
    for f in ("s1", "s2"):
        if f in names:
            setattr(out, f, prefix.float_sums(store, f, rows, lo, hi))
    if want("vmin") or want("vmax"):
        extremes(store, out, sids, klo, khi, has_w, want)
    if not edges:
        return out
    if not store.nk:
        return out
    C = prefix.sums["count"]
    ci, ch = rows.at(C, lo), rows.at(C, hi)
    has = ch > ci
    # first non-empty pane: the window's first pane when it holds a sample, else searched
    c1 = rows.at(C, np.minimum(lo + 1, hi))
    first = np.broadcast_to(lo, (S, T)).copy()
    r, j = np.nonzero(has & (c1 <= ci))
    if len(r):
        first[r, j] = _search(C, sids[r], lo[j] + 1, hi[j], ci[r, j] + 1) - 1
    # last non-empty pane: the window's last pane when it holds a sample, else searched
    cl = rows.at(C, np.maximum(hi - 1, lo))
    last = np.broadcast_to(hi - 1, (S, T)).copy()
    r, j = np.nonzero(has & (ch <= cl))
    if len(r):
        last[r, j] = _search(C, sids[r], lo[j] + 1, hi[j], ch[r, j]) - 1
    shift = prefix.k_lo - store.k0  # relative column -> store column
    cols, width, off = store.flat_columns()
    fc, lc = first + (shift + off), last + (shift + off)
    dense = bool(has.all())
    if not dense:  # windows without samples read column 0 and are masked below
        fc[~has] = 0
        lc[~has] = 0
    # the first / last panes' fields by flat indexes into the store's arrays (one index per side for
    # every field; a row-wise gather rebuilds its index per field)
    fi, li = rows.flat_index(width, fc), rows.flat_index(width, lc)

    def edge(a: np.ndarray, idx: np.ndarray, fill: Any) -> np.ndarray:
        v = a.reshape(-1).take(idx)
        return v if dense else np.where(has, v, fill)

    out.first_t = edge(cols["first_t"], fi, 0)
    out.first_v = edge(cols["first_v"], fi, 0.0)
    out.last_t = edge(cols["last_t"], li, 0)
    out.last_v = edge(cols["last_v"], li, 0.0)
    if "corr" in names:
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, as raw's
            out.corr = prefix.float_sums(store, "corr", rows, lo, hi, edge(cols["entry_corr"], fi, 0.0))
    for f in ("resets", "changes"):
        if f in names:
            tot = prefix.int_sums(f, rows, lo, hi)
            setattr(out, f, tot - edge(cols["entry_" + f], fi, 0))
    return out
