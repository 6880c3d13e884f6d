"""Verify a data directory's blocks offline (``turboprom check data DIR``) and set damaged ones aside.

Each block directory is opened as start-up opens it and then read whole: every sample is decoded
and checked against ``meta.json`` (sample and series counts, time range) and ``series.parquet``
(row ranges, per-series time bounds, timestamps ascending within a series). ``quarantine`` moves a
damaged block out of ``blocks/`` into ``quarantine/`` (never deletes it), so the next start-up no
longer skips it on every restart and queries stop warning about it; its samples stay lost to
queries unless the files are restored.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from storage.block import META_FILE, Block

QUARANTINE_DIR = "quarantine"


@dataclass(frozen=True)
class BlockCheck:
    name: str
    problem: str | None  # None: the block is sound
    samples: int = 0
    series: int = 0


def _verify(path: Path) -> BlockCheck:
    try:
        b = Block(path, lambda label_json: np.arange(len(label_json), dtype=np.int64))
    except Exception as e:  # noqa: BLE001 - anything that stops start-up from opening it is the finding
        return BlockCheck(path.name, f"cannot be opened: {str(e).replace(f'{path}/', '')}")
    try:
        s, t, _ = b.read_all()
    except Exception as e:  # noqa: BLE001
        return BlockCheck(path.name, f"data cannot be read: {str(e).replace(f'{path}/', '')}")
    n = len(t)
    if n != b.num_samples:
        return BlockCheck(path.name, f"holds {n} samples, meta.json says {b.num_samples}")
    if b.meta.get("numSeries") is not None and int(b.meta["numSeries"]) != b.num_series:
        return BlockCheck(path.name, f"series.parquet lists {b.num_series} series, meta.json says {b.meta['numSeries']}")
    if n and (int(t.min()) < b.mint or int(t.max()) > b.maxt):
        return BlockCheck(path.name, f"samples outside its time range [{b.mint}, {b.maxt}]")
    if len(b.row_end) and int(b.row_end[-1]) != n:
        return BlockCheck(path.name, f"series row ranges end at {int(b.row_end[-1])}, the data has {n} rows")
    if n > 1:
        same = s[1:] == s[:-1]
        if bool(np.any(same & (t[1:] <= t[:-1]))):
            return BlockCheck(path.name, "timestamps not strictly ascending within a series")
    return BlockCheck(path.name, None, n, b.num_series)


def check_blocks(data_dir: str | Path) -> list[BlockCheck]:
    """One result per block directory under ``<data_dir>/blocks`` (unfinished ``.tmp`` writes skipped)."""
    bdir = Path(data_dir) / "blocks"
    if not bdir.is_dir():
        return []
    out = []
    for p in sorted(bdir.iterdir()):
        if not p.is_dir() or p.name.endswith(".tmp"):
            continue
        if not (p / META_FILE).is_file():
            out.append(BlockCheck(p.name, f"has no {META_FILE}"))
            continue
        out.append(_verify(p))
    return out


def quarantine(data_dir: str | Path, name: str) -> Path:
    """Move block ``name`` from ``blocks/`` to ``quarantine/``; returns its new path."""
    dest_dir = Path(data_dir) / QUARANTINE_DIR
    dest_dir.mkdir(exist_ok=True)
    dest = dest_dir / name
    shutil.move(str(Path(data_dir) / "blocks" / name), str(dest))
    return dest
