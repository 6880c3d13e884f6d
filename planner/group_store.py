"""Cross-series group panes (algorithm ``group``): one payload per group per pane, merged across the
series of the group, for an SDS with a grouping (``spec.grouping``) and a fixed scope.

A group is the tuple of the series' values of the grouping labels ("" when absent). Per (group, pane):
count, NaN/+Inf/-Inf counts, the sum of finite ``v - c_g`` (``c_g``: the group's shift constant, its
first finite value), NaN-ignoring min and max. These are order-independent and additive across series,
so they are exactly what

    sum by (L) (sum_over_time(x{scope}[w])),  sum by (L) (count_over_time(...)),
    max by (L) (max_over_time(...)),          min by (L) (min_over_time(...))

need for any L within the grouping: the sum over series of per-series window sums is the window sum of
all the group's samples (and likewise count, max, min). Functions with per-series state are *not*
served from group panes: ``sum by (g) (rate(x[w]))`` extrapolates each series on its own first/last
samples, so it is not a function of merged panes; those keep per-series ``exact`` panes and aggregate
at query time. Late samples need no rebuild here (no order-dependent field).

Dense (group x pane) arrays with slack on both sides (backfill grows left, live ingest right:
planner/pane_layout.py); a batch
is folded with ``bincount`` / ``fmin.at`` / ``fmax.at`` over (group, pane) cells: no per-sample Python.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from planner.pane_layout import grown_layout
from planner.pane_store import PaneStoreParts, choose_shifts
from storage.labels import Labels

FIELDS = ("count", "nnan", "npinf", "nninf", "s1", "vmin", "vmax")
_INT = ("count", "nnan", "npinf", "nninf")


def _blank(f: str, shape: tuple[int, int]) -> np.ndarray:
    if f in _INT:
        return np.zeros(shape, np.int64)
    if f in ("vmin", "vmax"):
        return np.full(shape, np.nan)
    return np.zeros(shape, np.float64)


class GroupPaneStore(PaneStoreParts):
    def __init__(self, pane_ms: int, grouping: Sequence[str]):
        self.pane_ms = int(pane_ms)
        self.grouping = tuple(grouping)
        self.lock = threading.RLock()
        self.group_keys: list[tuple[str, ...]] = []
        self.group_index: dict[tuple[str, ...], int] = {}
        self.gid_of = np.zeros(0, np.int64)  # per series (registry id) -> group id, -1 unknown
        self.last_t = np.zeros(0, np.int64)  # per series: newest folded sample (restart recovery)
        self.gshift = np.zeros(0)  # per group shift constant (NaN = not chosen yet)
        self.ns = 0
        self.pk0 = 0  # pane index of physical column 0
        self.k_lo = 0  # panes in use: [k_lo, k_hi)
        self.k_hi = 0
        self.a: dict[str, np.ndarray] = {f: _blank(f, (0, 0)) for f in FIELDS}
        self.epoch = 0  # bumped by writes into panes behind the newest one (answer-cache validity)
        self._newest = np.iinfo(np.int64).min
        self.answers: OrderedDict = OrderedDict()  # planner/group_scan.py's answer cache

    # --- series and groups -------------------------------------------------------------------
    def ensure_series(self, n: int) -> None:
        if n > len(self.gid_of):
            grow = max(n, 2 * len(self.gid_of), 16) - len(self.gid_of)
            self.gid_of = np.concatenate([self.gid_of, np.full(grow, -1, np.int64)])
            self.last_t = np.concatenate([self.last_t, np.full(grow, np.iinfo(np.int64).min)])
        self.ns = max(self.ns, n)

    def group_of(self, lbl: Labels) -> tuple[str, ...]:
        d = dict(lbl)
        return tuple(d.get(g, "") for g in self.grouping)

    def _gid(self, key: tuple[str, ...]) -> int:
        g = self.group_index.get(key)
        if g is None:
            g = self.group_index[key] = len(self.group_keys)
            self.group_keys.append(key)
        return g

    def assign(self, ids: np.ndarray, labels: Sequence[Labels]) -> None:
        """Map series (registry ids) to their groups (per series, cached: only unmapped ones)."""
        with self.lock:
            self.ensure_series(int(ids.max()) + 1 if len(ids) else 0)
            todo = np.nonzero(self.gid_of[ids] < 0)[0]
            for i in todo.tolist():
                self.gid_of[ids[i]] = self._gid(self.group_of(labels[i]))
            self._ensure_groups(len(self.group_keys))

    def _ensure_groups(self, G: int) -> None:
        if G > len(self.gshift):
            self.gshift = np.concatenate([self.gshift, np.full(G - len(self.gshift), np.nan)])
        rows = self.a["count"].shape[0]
        if G > rows:
            cap = max(G, 2 * rows, 4)
            for f, arr in self.a.items():
                b = _blank(f, (cap, arr.shape[1]))
                b[:rows] = arr
                self.a[f] = b

    def _ensure_panes(self, kmin: int, kmax: int) -> None:
        if self.k_hi <= self.k_lo:
            lo, hi = kmin, kmax + 1
        else:
            lo, hi = min(self.k_lo, kmin), max(self.k_hi, kmax + 1)
        cap = self.a["count"].shape[1]
        if cap and lo >= self.pk0 and hi <= self.pk0 + cap:
            self.k_lo, self.k_hi = lo, hi
            return
        newcap, pk0 = grown_layout(lo, hi, grows_left=self.k_hi > self.k_lo and lo < self.k_lo)
        rows = self.a["count"].shape[0]
        for f, arr in self.a.items():
            b = _blank(f, (rows, newcap))
            if self.k_hi > self.k_lo:
                b[:, self.k_lo - pk0:self.k_hi - pk0] = arr[:, self.k_lo - self.pk0:self.k_hi - self.pk0]
            self.a[f] = b
        self.pk0, self.k_lo, self.k_hi = pk0, lo, hi

    def pane_totals(self) -> tuple[int, np.ndarray]:
        """(first pane, samples per pane over all groups): the raw-read cost model's density."""
        with self.lock:
            if self.k_hi <= self.k_lo:
                return 0, np.zeros(0, np.int64)
            return self.k_lo, self.a["count"][:, self.k_lo - self.pk0:self.k_hi - self.pk0].sum(axis=0)

    def nbytes(self) -> int:
        G = len(self.group_keys)
        return int(G * max(self.k_hi - self.k_lo, 0) * 8 * len(FIELDS))

    def drop_before(self, k: int) -> None:
        """Forget panes older than ``k`` (their columns are blanked; a later regrowth reclaims them)."""
        with self.lock:
            k2 = min(int(k), self.k_hi)
            if self.k_hi <= self.k_lo or k2 <= self.k_lo:
                return
            for f, arr in self.a.items():
                arr[:, self.k_lo - self.pk0 : k2 - self.pk0] = _blank(f, (1, 1))[0, 0]
            self.k_lo = k2

    def clear_from(self, k: int) -> None:
        """Forget panes ``k`` and later (blanked), so a restart can fold them again from raw storage."""
        with self.lock:
            k2 = max(int(k), self.k_lo)
            if k2 >= self.k_hi:
                return
            for f, arr in self.a.items():
                arr[:, k2 - self.pk0 : self.k_hi - self.pk0] = _blank(f, (1, 1))[0, 0]
            self.answers.clear()
            self.epoch += 1

    # --- ingest ----------------------------------------------------------------------------
    def ingest_sorted(self, sid: np.ndarray, ts: np.ndarray, vals: np.ndarray, *, live: bool = True) -> None:
        """Fold samples (any order; every sample once) into their (group, pane) cells in bulk."""
        n = len(ts)
        if n == 0:
            return
        with self.lock:
            g = self.gid_of[sid]
            ok = g >= 0
            if not ok.all():  # series never assigned (cannot happen through SDS.register): skip
                sid, ts, vals, g = sid[ok], ts[ok], vals[ok], g[ok]
                if not len(ts):
                    return
            fin = np.isfinite(vals)
            choose_shifts(self.gshift, g, vals)
            k = ts // self.pane_ms
            self.note_written(int(k.min()))
            if not live or int(k.min()) < self._newest:
                self.epoch += 1
            self._newest = max(self._newest, int(k.max()))
            self._ensure_panes(int(k.min()), int(k.max()))
            cap = self.a["count"].shape[1]
            flat = g * cap + (k - self.pk0)
            cells, inv = np.unique(flat, return_inverse=True)
            m = len(cells)
            x = np.where(fin, vals - np.nan_to_num(self.gshift[g], nan=0.0), 0.0)
            add = {
                "count": np.bincount(inv, minlength=m),
                "nnan": np.bincount(inv, weights=np.isnan(vals), minlength=m).astype(np.int64),
                "npinf": np.bincount(inv, weights=vals == np.inf, minlength=m).astype(np.int64),
                "nninf": np.bincount(inv, weights=vals == -np.inf, minlength=m).astype(np.int64),
                "s1": np.bincount(inv, weights=x, minlength=m),
            }
            for f, v in add.items():
                self.a[f].reshape(-1)[cells] += v
            np.fmin.at(self.a["vmin"].reshape(-1), flat, vals)
            np.fmax.at(self.a["vmax"].reshape(-1), flat, vals)
            np.maximum.at(self.last_t, sid, ts)

    # --- reads -----------------------------------------------------------------------------
    def pane_arrays(self, gids: np.ndarray, k_lo: int, k_hi: int) -> dict[str, np.ndarray]:
        with self.lock:
            width = max(k_hi - k_lo, 0)
            out = {}
            a = max(k_lo, self.k_lo)
            b = max(min(k_hi, self.k_hi), a)
            for f, arr in self.a.items():
                res = _blank(f, (len(gids), width))
                if b > a:
                    res[:, a - k_lo:b - k_lo] = arr[gids, a - self.pk0:b - self.pk0]
                out[f] = res
            return out

    # --- persistence -------------------------------------------------------------------------
    def export_rows(self, k_lo: int, k_hi: int) -> dict[str, np.ndarray]:
        with self.lock:
            a = max(k_lo, self.k_lo)
            b = max(min(k_hi, self.k_hi), a)
            G = len(self.group_keys)
            cnt = self.a["count"][:G, a - self.pk0:b - self.pk0]
            gi, c = np.nonzero(cnt > 0)
            out = {"group": gi.astype(np.int64), "pane": (c + a).astype(np.int64)}
            for f, arr in self.a.items():
                out[f] = arr[gi, c + a - self.pk0]
            return out

    def import_rows(self, rows: dict[str, np.ndarray]) -> None:
        if len(rows["pane"]) == 0:
            return
        with self.lock:
            g = np.asarray(rows["group"], np.int64)
            k = np.asarray(rows["pane"], np.int64)
            self._ensure_groups(max(int(g.max()) + 1, len(self.group_keys)))
            self._ensure_panes(int(k.min()), int(k.max()))
            for f in FIELDS:
                self.a[f][g, k - self.pk0] = np.asarray(rows[f])
            self.epoch += 1

    def export_meta(self) -> dict[str, list]:
        with self.lock:
            return {"key": [list(k) for k in self.group_keys], "shift": self.gshift[:len(self.group_keys)].tolist()}

    def import_meta(self, meta: dict[str, list]) -> None:
        """Group numbering and shifts of a persisted store (before series are registered again)."""
        with self.lock:
            for key in meta["key"]:
                self._gid(tuple(key))
            self._ensure_groups(len(self.group_keys))
            self.gshift[:len(meta["shift"])] = np.asarray(meta["shift"], np.float64)
