"""PromQL parse time over the compliance query set: TurboProm's parser (promql/parser/) vs the
``promql-parser`` binding (Rust, 0.12) it replaced, measured in the same run.

    .venv/bin/python bench/parse_bench.py [--repeats 7]

Each repeat parses every query of the expanded compliance list (../shared/compliance, 539
queries) once; the figure is the median over repeats. Both sides get the query text and return a
tree; the binding's number includes building its Python objects, ours includes the type checks.
Second figure: the engine's whole parse entry on a text it has not parsed before (the depth
scan ``query_guard.check``, then the parser; ``query_guard.parse`` keeps trees per query text, so
a repeated text costs a dict lookup), against the same scan followed by the binding. The binding is not a dependency any more: install it into a scratch venv (``pip install
promql-parser==0.12.*``) to measure the peer; without it only our figure is printed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from promql import query_guard  # noqa: E402
from promql.parser import ParseError, parse  # noqa: E402
from tests.helpers import load_bench  # noqa: E402


def queries() -> list[str]:
    out = []
    for c in load_bench("compliance").expand_cases():
        try:
            parse(c.query)
        except ParseError:
            continue  # one compliance query is invalid PromQL: neither side gets it
        out.append(c.query)
    return out


def median_ms(fn, qs: list[str], repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for q in qs:
            fn(q)
        ts.append((time.perf_counter() - t0) * 1000)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    qs = queries()
    ours = median_ms(parse, qs, a.repeats)
    def entry(q: str) -> object:  # query_guard.parse on a cache miss
        query_guard.check(q)
        return parse(q)

    ours_entry = median_ms(entry, qs, a.repeats)
    print(f"queries: {len(qs)}, repeats: {a.repeats} (median)")
    print(f"turboprom promql.parser.parse: {ours:.1f} ms per pass, {ours * 1000 / len(qs):.1f} us per query")
    print(f"turboprom scan + parse (query_guard.parse, text not cached): {ours_entry:.1f} ms per pass")
    try:
        import promql_parser  # the replaced binding, only as the peer here
    except ImportError:
        print("promql-parser not installed: no peer figure")
        return
    peer = median_ms(promql_parser.parse, qs, a.repeats)
    print(f"promql-parser {getattr(promql_parser, '__version__', '0.12')} parse: {peer:.1f} ms per pass, "
          f"{peer * 1000 / len(qs):.1f} us per query")
    print(f"ratio ours/binding: {ours / peer:.2f}")

    def binding_entry(q: str) -> object:
        query_guard.check(q)
        return promql_parser.parse(q)

    peer_entry = median_ms(binding_entry, qs, a.repeats)
    print(f"scan + promql-parser: {peer_entry:.1f} ms per pass; ratio ours/binding: {ours_entry / peer_entry:.2f}")


if __name__ == "__main__":
    main()
