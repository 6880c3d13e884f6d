"""A/B of Head.gather (short time-bounded head reads) against the head of an earlier commit.

usage: .venv/bin/python bench/storage_head_ab.py --baseline-commit COMMIT [--minutes 20] [--reads 300] [--seal-every 1] [--batch 1000] [--wanted 200]

Both heads get identical data in the same process: 8000 series, one sample per second each (8k
samples/s) in scrape-sized batches of ``--batch`` (1000) series, sealed once per simulated second as the server's
maintenance thread does (``--seal-every N``: every N simulated seconds, so reads also meet up to
N seconds of unsealed batches, as while maintenance is busy cutting a block), `--minutes` of history. Then, per simulated second, one more second of
data and one read of ``--wanted`` (200) series over [t-2m, t] and [t-10m, t-8m] from each head, alternating
which head goes first, so both see the same machine load. Results are checked equal.
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import storage.head as new_head  # noqa: E402

NS, BATCH = 8000, 1000


def load_baseline(commit: str, tmp: Path):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:storage/head.py"], check=True,
                         capture_output=True, text=True).stdout
    path = tmp / "baseline_head.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("baseline_head", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["baseline_head"] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline-commit", required=True)
    ap.add_argument("--minutes", type=int, default=20)
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--seal-every", type=int, default=1, help="seal pending batches every N simulated seconds")
    ap.add_argument("--batch", type=int, default=BATCH, help="series per appended batch (a remote-write request)")
    ap.add_argument("--wanted", type=int, default=200, help="series per read")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        old = load_baseline(a.baseline_commit, Path(d))
        heads = {"baseline": old.Head(), "current": new_head.Head()}
        for h in heads.values():
            h.ensure(NS)
        rng = np.random.default_rng(0)
        sids = np.linspace(7, NS - 1, a.wanted).astype(np.int64)  # spread over the id space
        start = (int(time.time()) - a.minutes * 60 - a.reads - 60) * 1000

        def second(sec: int) -> None:
            for k in range(0, NS, a.batch):
                sid = np.arange(k, min(k + a.batch, NS), dtype=np.int64)
                ts = np.full(len(sid), start + sec * 1000, dtype=np.int64)
                v = rng.normal(size=len(sid))
                for h in heads.values():
                    h.commit(sid, ts, v)
            if sec % a.seal_every == 0:
                for h in heads.values():
                    h.seal()

        for sec in range(a.minutes * 60):
            second(sec)
        res: dict[str, dict[str, list[float]]] = {k: {} for k in heads}
        sec = a.minutes * 60
        for i in range(a.reads):
            second(sec)
            sec += 1
            t = start + sec * 1000
            outs = {}
            for name in (("baseline", "current") if i % 2 else ("current", "baseline")):
                for kind, lo, hi in (("[t-2m, t]", t - 120_000, t), ("[t-10m, t-8m]", t - 600_000, t - 480_000)):
                    t0 = time.perf_counter()
                    outs[(name, kind)] = heads[name].gather(sids, lo, hi)
                    res[name].setdefault(kind, []).append(time.perf_counter() - t0)
            for kind in res["current"]:
                assert all(np.array_equal(x, y) for x, y in zip(outs[("baseline", kind)], outs[("current", kind)]))
        for kind in res["current"]:
            line = []
            for name in heads:
                xs = sorted(res[name][kind])
                line.append(f"{name} median {statistics.median(xs) * 1e3:6.2f} ms p90 {xs[int(0.9 * len(xs))] * 1e3:6.2f} "
                            f"max {xs[-1] * 1e3:7.2f}")
            ratio = statistics.median(res["current"][kind]) / statistics.median(res["baseline"][kind])
            print(f"{kind:14s} " + " | ".join(line) + f" | current/baseline {ratio:.2f}x")


if __name__ == "__main__":
    main()
