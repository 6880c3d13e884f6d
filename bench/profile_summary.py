"""Where the time went: a py-spy raw (collapsed stacks) profile summed by function.

Reads the files bench/ingest_remote_write.py --profile writes (``thread (tid): name;frame;... count``
per line). Prints, per function, the share of samples in which it is on the stack (inclusive) and
at the top (self), threads merged; the event loop's idle wait (selectors) is left out, so shares are of busy samples.

    .venv/bin/python bench/profile_summary.py DIR_OR_FILES... [--top 25] [--match TEXT]
"""
from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<n>\d+)$")
_IDLE = ("select (selectors.py", "_worker (concurrent/futures/thread.py:81)", "wait (threading.py",
         "_maintenance_loop", "Event.wait (threading.py")


def _function(frame: str) -> str:
    """``name (file.py:line)`` -> ``name (file.py)``: lines of one function are summed."""
    return re.sub(r":\d+\)$", ")", frame)


def summarize(paths: list[Path]) -> tuple[int, Counter, Counter]:
    total = 0
    incl: Counter = Counter()
    self_: Counter = Counter()
    for p in paths:
        for line in p.read_text().splitlines():
            m = _LINE.match(line)
            if not m:
                continue
            frames = m["stack"].split(";")[1:]  # first element names the thread
            if not frames or any(frames[-1].startswith(x) or x in frames[-1] for x in _IDLE):
                continue
            n = int(m["n"])
            total += n
            fns = [_function(f) for f in frames]
            for f in set(fns):
                incl[f] += n
            self_[fns[-1]] += n
    return total, incl, self_


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--match", default="", help="only functions whose name or file contains this text")
    a = ap.parse_args()
    files = [f for p in a.paths for f in (sorted(p.glob("*.txt")) if p.is_dir() else [p])]
    total, incl, self_ = summarize(files)
    print(f"{total} busy samples in {len(files)} file(s)")
    print("| function | on stack | self |\n|---|---|---|")
    for f, n in incl.most_common():
        if a.match and a.match not in f:
            continue
        print(f"| `{f}` | {100 * n / max(total, 1):.1f}% | {100 * self_[f] / max(total, 1):.1f}% |")
        a.top -= 1
        if a.top <= 0:
            break


if __name__ == "__main__":
    main()
