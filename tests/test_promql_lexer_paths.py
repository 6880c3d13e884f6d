"""The lexer's two paths agree: ``tokenize`` reads the common tokens with one regular expression
per lexer state and hands everything else to the state machine (``Lexer``), which alone can also
lex every input. On the conformance corpus's queries, the compliance queries, every prefix of
them, one-character insertions and random strings over PromQL's characters, both give the same
tokens, positions and error (text and position)."""
from __future__ import annotations

import random

from promql.parser.lexer import Lexer, Token, tokenize
from promql.promqltest_script import EvalCmd, parse_script
from tests.helpers import SHARED, load_bench

ALPHABET = list('abcxyz_:019.eEx+-*/%^@<>=!~,(){}[]"\'`# \n\tsmhdwy\\\ufffd\udcff') + [
    "offset", "by", "fill", "fill_left", "step()", "anchored", "inf", "nan", "5m", "[5m:1m]", "and", "sum",
    '{a="b"}', "  "]


def state_machine(text: str) -> list[Token]:
    lex = Lexer(text)
    out = []
    while True:
        t = lex.next_token()
        out.append(t)
        if t.typ in ("EOF", "ERROR"):
            return out


def corpus() -> list[str]:
    qs = [c.query for c in load_bench("compliance").expand_cases()]
    for path in sorted((SHARED / "promqltest").glob("*.test")):
        qs += [cmd.expr for cmd in parse_script(path.read_text()) if isinstance(cmd, EvalCmd)]
    return qs


def test_fast_path_equals_state_machine():
    rng = random.Random(20)
    base = corpus()
    assert len(base) > 1000
    inputs = list(base)
    for q in rng.sample(base, 1500):
        for _ in range(2):
            j = rng.randrange(len(q) + 1)
            inputs.append(q[:j] + rng.choice(ALPHABET) + q[j:])
            inputs.append(q[:j])
    inputs += ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12))) for _ in range(15000)]
    differ = [q for q in inputs if tokenize(q) != state_machine(q)]
    assert differ == []
