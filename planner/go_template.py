"""Go's ``text/template`` language, the part Prometheus's alerting-rule templates use: lexing,
parsing and executing templates, Go's built-in template functions and Go's value formatting
(``fmt.Sprint``'s ``%v`` of floats, ``fmt.Sprintf``'s verbs), so that templates print the bytes Go prints.

Hand-written because no maintained Python package implements Go's template language (Jinja2's
syntax and semantics differ: pipelines, ``$`` variables, ``{{-`` trimming, Go's ``%v`` float
formatting and comparison rules). Supported: text and ``{{ }}`` actions with ``-`` trimming and
comments; pipelines with ``|``; variables (``$x := ...``, ``$x = ...``), fields of maps and
dataclasses (``.Labels.job``, ``$labels.job``); string (interpreted and raw), number, bool and
``nil`` literals; parenthesised pipelines; ``if``/``else if``/``else``, ``range`` (lists and maps,
sorted by key, with ``else``), ``with`` and ``end``; Go's built-in functions (``BUILTINS``: ``and or
not len index print printf println eq ne lt le gt ge urlquery html js``). Not supported:
``define``/``template``/``block`` (an error names them) and method calls on values.

planner/alert_template.py adds Prometheus's functions and the alert data.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import html
import json
import math
import re
import urllib.parse
from typing import Any, Callable

from storage.go_format import format_float_g as go_float_g
from storage.go_format import go_exponent as _go_exp

# ------------------------------------------------------------------------------------- formatting


def go_time_string(t: _dt.datetime) -> str:
    """Go ``time.Time.String()`` of a UTC time: ``2006-01-02 15:04:05.999999999 +0000 UTC``."""
    base = t.strftime("%Y-%m-%d %H:%M:%S")
    frac = f"{t.microsecond:06d}".rstrip("0")
    return base + ("." + frac if frac else "") + " +0000 UTC"


def go_print(v: Any) -> str:
    """Go ``fmt.Sprint`` of one template value."""
    if v is None:
        return "<no value>"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return go_float_g(v)
    if isinstance(v, _dt.datetime):
        return go_time_string(v)
    if isinstance(v, dict):
        return "map[" + " ".join(f"{go_print(k)}:{go_print(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, list):
        return "[" + " ".join(go_print(x) for x in v) + "]"
    return str(v)


_VERB = re.compile(r"%([-+# 0]*)(\d+|\*)?(?:\.(\d+|\*))?([a-zA-Z%])")


def go_sprintf(fmt: str, *args: Any) -> str:
    """Go ``fmt.Sprintf`` for the verbs templates use: %s %v %d %f %e %g %q %x %X %t %%."""
    out, i = [], 0
    pos = 0
    for m in _VERB.finditer(fmt):
        out.append(fmt[pos:m.start()])
        pos = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%":
            out.append("%")
            continue
        if i >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        a = args[i]
        i += 1
        spec = flags + (width or "") + (f".{prec}" if prec is not None else "")
        if verb in "feEgG" and isinstance(a, (int, float)) and not isinstance(a, bool):
            a = float(a)
            if math.isnan(a) or math.isinf(a):
                s = go_float_g(a)
            elif verb in "gG" and prec is None:
                s = go_float_g(a)
            else:
                s = ("%" + spec + verb) % a
                s = re.sub(r"e([+-])(\d+)$", lambda mm: _go_exp(int(mm.group(1) + mm.group(2))), s)
            out.append(s)
        elif verb == "d" and isinstance(a, int) and not isinstance(a, bool):
            out.append(("%" + spec + "d") % a)
        elif verb in "xX" and isinstance(a, int) and not isinstance(a, bool):
            out.append(("%" + spec + verb) % a)
        elif verb in "xX" and isinstance(a, str):
            out.append(a.encode().hex() if verb == "x" else a.encode().hex().upper())
        elif verb == "q" and isinstance(a, str):
            out.append(json.dumps(a, ensure_ascii=False))
        elif verb == "t" and isinstance(a, bool):
            out.append(go_print(a))
        elif verb in "sv":
            s = go_print(a)
            out.append(("%" + spec + "s") % s if spec else s)
        else:
            out.append(f"%!{verb}({type(a).__name__}={go_print(a)})")
    out.append(fmt[pos:])
    if i < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{type(a).__name__}={go_print(a)}" for a in args[i:]) + ")")
    return "".join(out)



# --------------------------------------------------------------------------------------- values
class TemplateError(Exception):
    pass


def _truth(v: Any) -> bool:
    if v is None:
        return False
    if isinstance(v, (bool, int, float)):
        return bool(v)
    if isinstance(v, (str, list, dict, tuple)):
        return len(v) > 0
    return True


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    return "other"


def _cmp(name: str, a: Any, b: Any) -> int:
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        raise TemplateError(f"error calling {name}: incompatible types for comparison")
    if ka == "other" or (ka == "bool" and name not in ("eq", "ne")):
        raise TemplateError(f"error calling {name}: invalid type for comparison")
    return (a > b) - (a < b)


def _eq(a: Any, *bs: Any) -> bool:
    if not bs:
        raise TemplateError("error calling eq: missing argument for comparison")
    return any(_cmp("eq", a, b) == 0 for b in bs)



def _index(v: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(v, dict):
            v = v.get(k, "" if all(isinstance(x, str) for x in v.values()) else None)
        elif isinstance(v, (list, str)):
            if not isinstance(k, int) or not 0 <= k < len(v):
                raise TemplateError(f"error calling index: index out of range: {k}")
            v = v[k]
        else:
            raise TemplateError(f"error calling index: can't index item of type {type(v).__name__}")
    return v



def _print(*a: Any) -> str:
    """Go ``fmt.Sprint``: a space between operands when neither is a string."""
    return "".join((" " if i and not isinstance(x, str) and not isinstance(a[i - 1], str) else "") + go_print(x)
                   for i, x in enumerate(a))


BUILTINS: dict[str, Callable[..., Any]] = {
    "and": lambda *a: next((x for x in a if not _truth(x)), a[-1]),
    "or": lambda *a: next((x for x in a if _truth(x)), a[-1]),
    "not": lambda a: not _truth(a),
    "len": lambda a: len(a),
    "index": _index,
    "print": _print,
    "println": lambda *a: " ".join(go_print(x) for x in a) + "\n",
    "printf": go_sprintf,
    "eq": _eq,
    "ne": lambda a, b: _cmp("ne", a, b) != 0,
    "lt": lambda a, b: _cmp("lt", a, b) < 0,
    "le": lambda a, b: _cmp("le", a, b) <= 0,
    "gt": lambda a, b: _cmp("gt", a, b) > 0,
    "ge": lambda a, b: _cmp("ge", a, b) >= 0,
    "html": lambda *a: html.escape(_print(*a)).replace("&#x27;", "&#39;"),
    "js": lambda *a: json.dumps(_print(*a))[1:-1].replace("'", "\\'"),
    "urlquery": lambda *a: urllib.parse.quote_plus(_print(*a)),
}

# ---------------------------------------------------------------------------------------- lexing
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<decl>:=)
  | (?P<assign>=)
  | (?P<pipe>\|)
  | (?P<lp>\()
  | (?P<rp>\))
  | (?P<comma>,)
  | (?P<raw>`[^`]*`)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<char>'(?:[^'\\\n]|\\.)+')
  | (?P<num>[+-]?(?:0[xX][0-9a-fA-F_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?))
  | (?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
  | (?P<field>(?:\.[A-Za-z0-9_]+)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)
""", re.X)


def _lex_action(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise TemplateError(f"unexpected {text[pos]!r} in command")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


def _split(src: str) -> list[tuple[str, str]]:
    """Text and action pieces, with ``{{-``/``-}}`` trimming applied and comments dropped."""
    pieces: list[tuple[str, str]] = []
    pos = 0
    while True:
        k = src.find("{{", pos)
        if k < 0:
            pieces.append(("text", src[pos:]))
            break
        text = src[pos:k]
        trim_left = src.startswith("{{- ", k) or src.startswith("{{-\t", k) or src.startswith("{{-\n", k)
        if trim_left:
            text = text.rstrip(" \t\r\n")
        pieces.append(("text", text))
        start = k + (3 if trim_left else 2)
        if src.startswith("/*", start if not trim_left else start + 1) or src.startswith("/*", start):
            end = src.find("*/", start)
            if end < 0:
                raise TemplateError("unclosed comment")
            close = src.find("}}", end)
        else:
            close = _find_close(src, start)
        if close < 0:
            raise TemplateError("unclosed action")
        trim_right = close > start and src[close - 1] == "-" and src[close - 2] in " \t\r\n"
        body = src[start:close - 1] if trim_right else src[start:close]
        if not body.strip().startswith("/*"):
            pieces.append(("action", body.strip()))
        pos = close + 2
        if trim_right:
            while pos < len(src) and src[pos] in " \t\r\n":
                pos += 1
    return pieces


def _find_close(src: str, pos: int) -> int:
    """Index of the ``}}`` closing the action at ``pos``, skipping quoted strings."""
    i = pos
    while i < len(src):
        ch = src[i]
        if ch in "\"'`":
            j = i + 1
            while j < len(src) and src[j] != ch:
                j += 2 if src[j] == "\\" and ch != "`" else 1
            i = j + 1
            continue
        if src.startswith("}}", i):
            return i
        i += 1
    return -1


# --------------------------------------------------------------------------------------- parsing
# Node shapes (tuples, evaluated by _Exec): ("text", s) | ("action", pipe) | ("if", pipe, then, else)
# | ("range", pipe, body, else) | ("with", pipe, body, else); a pipe is (decl_vars, is_decl, [cmds]);
# a command is [operands]; an operand is ("lit", v) | ("var", name, fields) | ("field", fields)
# | ("ident", name) | ("pipe", pipe).
def _parse_pipe(tokens: list[tuple[str, str]]) -> tuple[list[str], bool | None, list[list[Any]]]:
    decl: list[str] = []
    is_decl: bool | None = None
    i = 0
    # Variable declarations: $x := ... or $k, $v := ...
    j = 0
    names = []
    while j < len(tokens) and tokens[j][0] == "var" and "." not in tokens[j][1]:
        names.append(tokens[j][1])
        j += 1
        if j < len(tokens) and tokens[j][0] == "comma":
            j += 1
            continue
        break
    if names and j < len(tokens) and tokens[j][0] in ("decl", "assign"):
        decl, is_decl, i = names, tokens[j][0] == "decl", j + 1
    cmds: list[list[Any]] = [[]]
    while i < len(tokens):
        kind, text = tokens[i]
        if kind == "pipe":
            cmds.append([])
            i += 1
            continue
        if kind == "lp":
            depth, j = 1, i + 1
            while j < len(tokens) and depth:
                depth += {"lp": 1, "rp": -1}.get(tokens[j][0], 0)
                j += 1
            if depth:
                raise TemplateError("unclosed left paren")
            inner = _parse_pipe(tokens[i + 1:j - 1])
            node: Any = ("pipe", inner)
            i = j
            # (pipeline).Field
            if i < len(tokens) and tokens[i][0] == "field" and tokens[i][1] != ".":
                node = ("chain", node, tokens[i][1][1:].split("."))
                i += 1
            cmds[-1].append(node)
            continue
        cmds[-1].append(_operand(kind, text))
        i += 1
    if any(not c for c in cmds):
        raise TemplateError("missing command in pipeline")
    return decl, is_decl, cmds


def _operand(kind: str, text: str) -> Any:
    if kind == "raw":
        return ("lit", text[1:-1])
    if kind == "str":
        return ("lit", json.loads(text))
    if kind == "char":
        return ("lit", ord(json.loads('"' + text[1:-1] + '"')))
    if kind == "num":
        t = text.replace("_", "")
        if re.fullmatch(r"[+-]?(0[xX][0-9a-fA-F]+|\d+)", t) and not re.fullmatch(r"[+-]?0\d+", t):
            return ("lit", int(t, 0))
        if re.fullmatch(r"[+-]?0[0-7]+", t):
            return ("lit", int(t, 8))
        return ("lit", float(t))
    if kind == "var":
        name, *fields = text.split(".")
        return ("var", name, fields)
    if kind == "field":
        return ("field", [] if text == "." else text[1:].split("."))
    if kind == "ident":
        if text in ("true", "false"):
            return ("lit", text == "true")
        if text == "nil":
            return ("lit", None)
        return ("ident", text)
    raise TemplateError(f"unexpected {text!r} in operand")


_KEYWORDS = ("if", "range", "with", "else", "end", "define", "template", "block", "break", "continue")


def _keyword(body: str) -> tuple[str, str]:
    m = re.match(r"(if|range|with|else|end|define|template|block|break|continue)\b\s*(.*)$", body, re.S)
    return (m.group(1), m.group(2)) if m else ("", body)


def parse(src: str) -> list[Any]:
    pieces = _split(src)
    pos = 0

    def block(stop: tuple[str, ...]) -> tuple[list[Any], str, str]:
        nonlocal pos
        nodes: list[Any] = []
        while pos < len(pieces):
            kind, body = pieces[pos]
            pos += 1
            if kind == "text":
                if body:
                    nodes.append(("text", body))
                continue
            kw, rest = _keyword(body)
            if kw in ("end", "else"):
                if kw not in stop:
                    raise TemplateError(f"unexpected {{{{{kw}}}}}")
                return nodes, kw, rest
            if kw in ("define", "template", "block", "break", "continue"):
                raise TemplateError(f"{{{{{kw}}}}} is not supported in alert templates")
            if kw in ("if", "range", "with"):
                nodes.append(control(kw, rest))
                continue
            nodes.append(("action", _parse_pipe(_lex_action(body))))
        if stop:
            raise TemplateError("unexpected EOF")
        return nodes, "", ""

    def control(kw: str, rest: str) -> Any:
        if not rest.strip():
            raise TemplateError(f"missing value for {kw}")
        pipe = _parse_pipe(_lex_action(rest))
        body, end, tail = block(("end", "else"))
        else_nodes: list[Any] = []
        if end == "else":
            kw2, rest2 = _keyword(tail)
            if kw2 in ("if", "with") and kw2 == kw or (kw2 == "if" and kw == "if"):
                else_nodes = [control(kw2, rest2)]  # else if ... shares the end
            else:
                else_nodes, end2, _ = block(("end",))
        return (kw, pipe, body, else_nodes)

    nodes, _, _ = block(())
    return nodes


# ------------------------------------------------------------------------------------- execution
class _Exec:
    def __init__(self, funcs: dict[str, Callable[..., Any]]):
        self.funcs = funcs
        self.out: list[str] = []

    def run(self, nodes: list[Any], dot: Any, scope: list[dict[str, Any]]) -> None:
        for n in nodes:
            kind = n[0]
            if kind == "text":
                self.out.append(n[1])
            elif kind == "action":
                v = self.pipe(n[1], dot, scope)
                if not n[1][0]:
                    self.out.append(go_print(v))
            elif kind == "if":
                scope.append({})
                v = self.pipe(n[1], dot, scope)
                self.run(n[2] if _truth(v) else n[3], dot, scope)
                scope.pop()
            elif kind == "with":
                scope.append({})
                v = self.pipe(n[1], dot, scope)
                self.run(n[2], v, scope) if _truth(v) else self.run(n[3], dot, scope)
                scope.pop()
            elif kind == "range":
                self._range(n, dot, scope)

    def _range(self, n: Any, dot: Any, scope: list[dict[str, Any]]) -> None:
        decl, _, cmds = n[1]
        scope.append({})
        v = self.cmd_pipeline(cmds, dot, scope)
        items: list[tuple[Any, Any]]
        if isinstance(v, dict):
            items = [(k, v[k]) for k in sorted(v)]
        elif isinstance(v, (list, tuple)):
            items = list(enumerate(v))
        elif isinstance(v, int) and not isinstance(v, bool):
            items = [(i, i) for i in range(v)]
        elif v is None:
            items = []
        else:
            raise TemplateError(f"range can't iterate over {go_print(v)}")
        for k, x in items:
            frame = {}
            if len(decl) == 1:
                frame[decl[0]] = x
            elif len(decl) == 2:
                frame[decl[0]], frame[decl[1]] = k, x
            scope.append(frame)
            self.run(n[2], x, scope)
            scope.pop()
        if not items:
            self.run(n[3], dot, scope)
        scope.pop()

    def pipe(self, pipe: Any, dot: Any, scope: list[dict[str, Any]]) -> Any:
        decl, is_decl, cmds = pipe
        v = self.cmd_pipeline(cmds, dot, scope)
        for name in decl:
            if is_decl:
                scope[-1][name] = v
            else:
                for frame in reversed(scope):
                    if name in frame:
                        frame[name] = v
                        break
                else:
                    raise TemplateError(f"undefined variable: {name}")
        return v

    def cmd_pipeline(self, cmds: list[list[Any]], dot: Any, scope: list[dict[str, Any]]) -> Any:
        v: Any = _NOARG
        for cmd in cmds:
            v = self.command(cmd, dot, scope, v)
        return v

    def command(self, cmd: list[Any], dot: Any, scope: list[dict[str, Any]], piped: Any) -> Any:
        head = cmd[0]
        if head[0] == "ident":
            fn = self.funcs.get(head[1])
            if fn is None:
                raise TemplateError(f'function "{head[1]}" not defined')
            args = [self.operand(a, dot, scope) for a in cmd[1:]]
            if piped is not _NOARG:
                args.append(piped)
            try:
                return fn(*args)
            except TemplateError:
                raise
            except TypeError as e:
                raise TemplateError(f"wrong number of args for {head[1]}: {e}") from None
            except (ValueError, KeyError, AttributeError, IndexError) as e:
                raise TemplateError(f"error calling {head[1]}: {e}") from None
        if len(cmd) > 1 or piped is not _NOARG:
            raise TemplateError(f"can't give argument to non-function {self._show(head)}")
        return self.operand(head, dot, scope)

    @staticmethod
    def _show(node: Any) -> str:
        return node[1] if node[0] in ("ident", "var") else repr(node[1]) if node[0] == "lit" else "operand"

    def operand(self, node: Any, dot: Any, scope: list[dict[str, Any]]) -> Any:
        kind = node[0]
        if kind == "lit":
            return node[1]
        if kind == "var":
            for frame in reversed(scope):
                if node[1] in frame:
                    return self.fields(frame[node[1]], node[2])
            raise TemplateError(f"undefined variable: {node[1]}")
        if kind == "field":
            return self.fields(dot, node[1])
        if kind == "pipe":
            return self.pipe(node[1], dot, scope)
        if kind == "chain":
            return self.fields(self.operand(node[1], dot, scope), node[2])
        if kind == "ident":
            fn = self.funcs.get(node[1])
            if fn is None:
                raise TemplateError(f'function "{node[1]}" not defined')
            return fn()
        raise TemplateError("bad operand")

    @staticmethod
    def fields(v: Any, names: list[str]) -> Any:
        for n in names:
            if isinstance(v, dict):
                strmap = all(isinstance(x, str) for x in v.values())
                v = v.get(n, "" if strmap else None)
            elif dataclasses.is_dataclass(v) and not isinstance(v, type):
                if n not in {f.name for f in dataclasses.fields(v)}:
                    raise TemplateError(f"can't evaluate field {n} in type {type(v).__name__}")
                v = getattr(v, n)
            elif v is None:
                return None  # Go: a field of nil data is "<no value>"
            else:
                raise TemplateError(f"can't evaluate field {n} in type {type(v).__name__}")
        return v


_NOARG = object()


def run(src: str, data: Any, variables: dict[str, Any], funcs: dict[str, Callable[..., Any]]) -> str:
    """Execute template ``src`` with ``data`` as ``.``, the given ``$`` variables and functions
    (``BUILTINS`` plus ``funcs``); TemplateError on failure."""
    ex = _Exec({**BUILTINS, **funcs})
    ex.run(parse(src), data, [{"$": data, **variables}])
    return "".join(ex.out)
