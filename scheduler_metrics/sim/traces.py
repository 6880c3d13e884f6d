"""Trace loading: Mooncake JSONL (with prefix-block hash ids) and Azure LLM inference CSVs.

Sessions (Mooncake): a request whose hash ids share a prefix of at least ``MIN_SHARED_BLOCKS``
blocks with an earlier request continues that request's session, and those shared blocks are its
reusable prefix. Block 0 is the common system prompt in these traces, so one shared block is not a
session. Azure traces carry no prefix information: every request is its own session.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

MIN_SHARED_BLOCKS = 2


@dataclass
class Trace:
    name: str
    arrival_s: np.ndarray  # float64, seconds from trace start, ascending
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    session: np.ndarray  # int64 session id per request
    reuse_tokens: np.ndarray  # int64: prefix tokens shared with the session's earlier requests
    parent: np.ndarray  # int64 index of the request it continues, -1 if none

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if len(self) else 0.0

    def head(self, n: int) -> "Trace":
        keep = slice(0, n)
        parent = np.where(self.parent[keep] < n, self.parent[keep], -1)
        return Trace(self.name, self.arrival_s[keep], self.input_tokens[keep], self.output_tokens[keep],
                     self.session[keep], np.where(parent >= 0, self.reuse_tokens[keep], 0), parent)


def load_trace(path: str | Path, block_tokens: int = 512) -> Trace:
    p = Path(path)
    if p.suffix == ".jsonl":
        return _load_mooncake(p, block_tokens)
    if p.suffix == ".csv":
        return _load_azure(p)
    raise ValueError(f"unknown trace format {p.name!r}: expected Mooncake .jsonl or Azure .csv")


def _load_mooncake(p: Path, block_tokens: int) -> Trace:
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["timestamp"])
    n = len(rows)
    arrival = np.array([r["timestamp"] for r in rows], dtype=np.float64) / 1000.0
    inp = np.array([r["input_length"] for r in rows], dtype=np.int64)
    out = np.array([r["output_length"] for r in rows], dtype=np.int64)
    session = np.arange(n, dtype=np.int64)
    reuse = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    # prefix (as a tuple of block ids) -> latest request having it. Per-request Python here is
    # trace preparation (once per replay), not a serving hot path.
    prefixes: dict[tuple[int, ...], int] = {}
    for i, r in enumerate(rows):
        h = tuple(r["hash_ids"])
        for length in range(len(h), MIN_SHARED_BLOCKS - 1, -1):
            j = prefixes.get(h[:length])
            if j is not None:
                parent[i] = j
                session[i] = session[j]
                reuse[i] = min(length * block_tokens, int(inp[i]))
                break
        for length in range(1, len(h) + 1):
            prefixes[h[:length]] = i
    return Trace(p.stem, arrival - arrival[0] if n else arrival, inp, out, session, reuse, parent)


def _load_azure(p: Path) -> Trace:
    with open(p, newline="") as f:
        rows = list(csv.DictReader(f))
    ts = np.array([_azure_time(r["TIMESTAMP"]) for r in rows], dtype=np.float64)
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    inp = np.array([int(r["ContextTokens"]) for r in rows], dtype=np.int64)[order]
    out = np.array([int(r["GeneratedTokens"]) for r in rows], dtype=np.int64)[order]
    n = len(rows)
    return Trace(p.stem, ts - ts[0], inp, out, np.arange(n, dtype=np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64))


def _azure_time(s: str) -> float:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits, more than datetime accepts.
    base, _, frac = s.strip().partition(".")
    t = datetime.strptime(base, "%Y-%m-%d %H:%M:%S").timestamp()
    return t + (float("0." + frac) if frac else 0.0)
