"""The house plan's import rules (../shared/DESIGN.md), checked on the source so they cannot drift.

* Stages import only downward: ``turboprom/`` wires everything; ``ingest/``, ``planner/``,
  ``promql/`` and ``scheduler_metrics/`` import ``storage/`` (and the planner ``promql/``'s AST
  helpers); ``storage/`` imports none of them.
* No import circle between modules, counting imports inside functions too: a circle held apart by
  a function-level import means a helper sits in the wrong module.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("storage", "ingest", "promql", "planner", "scheduler_metrics", "turboprom")
ALLOWED = {
    "storage": set(),
    "ingest": {"storage"},
    "promql": {"storage"},
    "planner": {"storage", "promql"},
    "scheduler_metrics": {"storage"},
    "turboprom": {"storage", "ingest", "promql", "planner", "scheduler_metrics"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for stage in STAGES:
        for f in (ROOT / stage).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = f
    return out


def _imports(f: Path, known: dict[str, Path]) -> set[str]:
    """Project modules ``f`` imports anywhere in its body (``from a.b import c``: ``a.b.c`` when
    that is a module, else ``a.b``)."""
    out: set[str] = set()
    for n in ast.walk(ast.parse(f.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names if a.name in known}
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            subs = {f"{n.module}.{a.name}" for a in n.names} & known.keys()
            if subs:
                out |= subs
            elif n.module in known:
                out.add(n.module)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(f, mods) - {m} for m, f in mods.items()}


def test_stages_import_only_downward() -> None:
    bad = sorted(f"{m} imports {d}" for m, deps in _graph().items() for d in deps
                 if d.split(".")[0] != m.split(".")[0] and d.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert not bad, "imports against the house plan:\n" + "\n".join(bad)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circles() -> None:
    graph = _graph()
    # a package importing its own submodules to re-export them, which import siblings through the
    # package (``from promql.parser import ast``), is how packages work, not a circle of helpers
    for pkg in graph:
        for dep in list(graph[pkg]):
            if dep.startswith(pkg + ".") and pkg in graph[dep]:
                graph[dep].discard(pkg)
    circles = _circles(graph)
    assert not circles, "import circles (move the shared helper below both):\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_checker_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
