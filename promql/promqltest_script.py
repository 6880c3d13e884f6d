"""Parsing of Prometheus's promqltest script format (../shared/promqltest/FORMAT.md).

Produces a list of commands (``LoadCmd``, ``ClearCmd``, ``EvalCmd``); nothing here evaluates
anything. Hand-written: the format is Prometheus-internal and no Python library reads it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from storage.labels import Labels
from storage.regex import Regex, compile_regex
from storage.stale import STALE_NAN

from promql.types import FloatHistogram


class ScriptError(Exception):
    def __init__(self, line: int, msg: str):
        super().__init__(f"line {line}: {msg}")
        self.line = line


@dataclass(frozen=True)
class Hist:
    """A native-histogram sample literal: its text and the parsed value (None when unparseable:
    such a sample is then not loaded)."""

    text: str
    value: FloatHistogram | None = field(default=None, compare=False)


_HIST_FIELD = re.compile(r"([A-Za-z_]+):\s*(\[[^\]]*\]|[^\s\]]+)")
_RESET_HINTS = {"unknown", "reset", "not_reset", "gauge"}


def parse_histogram(text: str) -> FloatHistogram:
    """``{{schema:1 sum:3 count:22 buckets:[5 10 7] offset:1 ...}}`` (FORMAT.md 3.2)."""
    body = text.strip()
    if not (body.startswith("{{") and body.endswith("}}")):
        raise ValueError(f"invalid histogram literal {text!r}")
    body = body[2:-2]
    fields: dict[str, str] = {}
    for m in _HIST_FIELD.finditer(body):
        fields[m.group(1)] = m.group(2)
    leftover = _HIST_FIELD.sub("", body).strip()
    if leftover:
        raise ValueError(f"invalid histogram literal {text!r}: unexpected {leftover!r}")

    def num(key: str) -> float:
        return parse_number(fields[key]) if key in fields else 0.0

    def lst(key: str) -> list[float]:
        v = fields.get(key)
        if v is None:
            return []
        if not (v.startswith("[") and v.endswith("]")):
            raise ValueError(f"histogram field {key} must be a list")
        return [parse_number(x) for x in v[1:-1].split()]

    unknown = set(fields) - {"schema", "sum", "count", "z_bucket", "z_bucket_w", "buckets", "offset", "n_buckets",
                             "n_offset", "custom_values", "counter_reset_hint"}
    if unknown:
        raise ValueError(f"unknown histogram field(s) {sorted(unknown)} in {text!r}")
    hint = fields.get("counter_reset_hint", "unknown")
    if hint not in _RESET_HINTS:
        raise ValueError(f"invalid counter_reset_hint {hint!r}")
    off, noff = int(num("offset")), int(num("n_offset"))
    return FloatHistogram(
        schema=int(num("schema")),
        count=num("count"),
        sum=num("sum"),
        zero_threshold=num("z_bucket_w"),
        zero_count=num("z_bucket"),
        positive=tuple((off + i, c) for i, c in enumerate(lst("buckets"))),
        negative=tuple((noff + i, c) for i, c in enumerate(lst("n_buckets"))),
        custom_values=tuple(lst("custom_values")),
        counter_reset_hint=hint,
    )


def _hist_or_none(text: str) -> FloatHistogram | None:
    try:
        return parse_histogram(text)
    except (ValueError, IndexError):
        return None


MISSING = None  # an omitted position (``_``)
SeqValue = float | Hist | None

_PAT_LOAD = re.compile(r"^load(?:_(with_nhcb))?\s+(.+?)$")
_PAT_EVAL_INSTANT = re.compile(r"^eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$")
_PAT_EVAL_RANGE = re.compile(r"^eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)$")
_PAT_EXPECT = re.compile(r"^expect\s+(ordered|fail|warn|no_warn|info|no_info)(?:\s+(regex|msg):(.+))?$")
_PAT_EXPECT_RANGE = re.compile(r"^expect range vector\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+)$")
_PAT_SPACE = re.compile(r"[\t ]+")

_DUR_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}
_PAT_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")


def parse_duration(s: str) -> int:
    """Prometheus ``model.ParseDuration`` -> milliseconds (no sign; ``0`` allowed)."""
    s = s.strip()
    if s == "0":
        return 0
    m = _PAT_DURATION.match(s)
    if not m or s == "":
        raise ValueError(f"not a valid duration string: {s!r}")
    total = 0
    for val, mult in zip(m.groups(), (_DUR_UNITS[u] for u in ("y", "w", "d", "h", "m", "s", "ms"))):
        if val is not None:
            total += int(val) * mult
    return total


def parse_number(s: str) -> float:
    """Go's ``strconv.ParseInt(s, 0, 64)`` then ``ParseFloat(s, 64)``."""
    t = s.strip()
    if re.fullmatch(r"[+-]?0[0-7]+", t):  # Go base-0 octal
        return float(int(t.replace("0", "0o", 1) if t[0] == "0" else t[0] + "0o" + t[2:], 0))
    try:
        return float(int(t, 0))
    except ValueError:
        pass
    low = t.lower()
    if low in ("inf", "+inf", "infinity", "+infinity"):
        return math.inf
    if low in ("-inf", "-infinity"):
        return -math.inf
    if low in ("nan", "+nan", "-nan"):
        return math.nan
    if re.fullmatch(r"[+-]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d+)?", t):
        return float(t.replace("_", ""))
    if re.fullmatch(r"[+-]?0[xX][0-9a-fA-F.]*[pP][+-]?\d+", t):
        return float.fromhex(t)
    raise ValueError(f"invalid number {s!r}")


# ---------------------------------------------------------------------------------------------
# Series descriptions: ``name{l="v", ...} <value sequence>``


def _unquote(s: str, i: int) -> tuple[str, int]:
    """Read a PromQL string literal starting at s[i] (quote char); returns (value, next index)."""
    q = s[i]
    i += 1
    out = []
    if q == "`":
        j = s.index("`", i)
        return s[i:j], j + 1
    esc = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"', "'": "'"}
    while i < len(s):
        c = s[i]
        if c == q:
            return "".join(out), i + 1
        if c == "\\":
            n = s[i + 1]
            if n in esc:
                out.append(esc[n])
                i += 2
            elif n == "x":
                out.append(chr(int(s[i + 2:i + 4], 16)))
                i += 4
            elif n == "u":
                out.append(chr(int(s[i + 2:i + 6], 16)))
                i += 6
            elif n == "U":
                out.append(chr(int(s[i + 2:i + 10], 16)))
                i += 10
            elif n in "01234567":
                out.append(chr(int(s[i + 1:i + 4], 8)))
                i += 4
            else:
                raise ValueError(f"unknown escape sequence \\{n}")
            continue
        out.append(c)
        i += 1
    raise ValueError("unterminated quoted string")


_NAME_RE = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_series_desc(line: str) -> tuple[Labels, str]:
    """Split ``name{labels} rest`` into canonical labels and the rest of the line."""
    s = line.strip()
    i = 0
    labels: dict[str, str] = {}
    m = _NAME_RE.match(s)
    if m:
        labels["__name__"] = m.group(0)
        i = m.end()
    if i < len(s) and s[i] == "{":
        i += 1
        while True:
            while i < len(s) and s[i] in " \t,":
                i += 1
            if i >= len(s):
                raise ValueError("unterminated label set")
            if s[i] == "}":
                i += 1
                break
            if s[i] in "\"'`":
                name, i = _unquote(s, i)
            else:
                lm = _LABEL_RE.match(s, i)
                if not lm:
                    raise ValueError(f"bad label name at {s[i:]!r}")
                name, i = lm.group(0), lm.end()
            while i < len(s) and s[i] in " \t":
                i += 1
            if i < len(s) and s[i] in ",}":  # a lone quoted name = metric name (UTF-8 syntax)
                labels["__name__"] = name
                continue
            if not s.startswith("=", i) or s.startswith("=~", i):
                raise ValueError(f"only '=' matchers are allowed in series descriptions: {s!r}")
            i += 1
            while i < len(s) and s[i] in " \t":
                i += 1
            value, i = _unquote(s, i)
            labels[name] = value
    elif not m:
        raise ValueError(f"invalid series description {s!r}")
    lbl: Labels = tuple(sorted((k, v) for k, v in labels.items() if v != ""))
    return lbl, s[i:].strip()


_NUM = r"[+-]?(?:[Ii][Nn][Ff](?:inity)?|[Nn][Aa][Nn]|0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
_PAT_REPEAT = re.compile(rf"^({_NUM})(?:([+-])({_NUM}))?x(\d+)$")
_PAT_MISSING_REPEAT = re.compile(r"^_x(\d+)$")


def _split_items(text: str) -> list[str]:
    """Whitespace-separated items, keeping ``{{ ... }}`` histogram literals (which contain spaces) whole."""
    items: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] in " \t":
            i += 1
            continue
        j = i
        while j < n and text[j] not in " \t":
            if text.startswith("{{", j):
                k = text.find("}}", j)
                if k < 0:
                    raise ValueError("unterminated histogram literal")
                j = k + 2
            else:
                j += 1
        items.append(text[i:j])
        i = j
    return items


def expand_values(text: str) -> list[SeqValue]:
    """Expand a value sequence (FORMAT.md 3.1) into one entry per position."""
    out: list[SeqValue] = []
    for item in _split_items(text):
        if item == "_":
            out.append(MISSING)
            continue
        mm = _PAT_MISSING_REPEAT.match(item)
        if mm:
            out.extend([MISSING] * int(mm.group(1)))
            continue
        if item.lower() == "stale":
            out.append(STALE_NAN)
            continue
        if item.startswith("{{"):
            hm = re.match(r"^(\{\{.*?\}\})(?:([+-])(\{\{.*?\}\}))?(?:x(\d+))?$", item)
            if not hm:
                raise ValueError(f"invalid histogram item {item!r}")
            count = int(hm.group(4)) + 1 if hm.group(4) is not None else 1
            a = _hist_or_none(hm.group(1))
            if hm.group(2) is None or a is None:
                out.extend([Hist(item, a)] * count)
                continue
            b = _hist_or_none(hm.group(3))
            sign = -1.0 if hm.group(2) == "-" else 1.0
            cur: FloatHistogram | None = a
            for _ in range(count):  # A, A+B, A+2B, ... (bucket-wise, like Prometheus)
                out.append(Hist(item, cur))
                if cur is not None and b is not None:
                    try:
                        cur = cur.add(b, sign)
                    except ValueError:
                        cur = None
                else:
                    cur = None
            continue
        rm = _PAT_REPEAT.match(item)
        if rm:
            a = parse_number(rm.group(1))
            b = parse_number(rm.group(3)) if rm.group(3) is not None else 0.0
            if rm.group(2) == "-":
                b = -b
            n = int(rm.group(4))
            # Prometheus accumulates by repeated addition (a, a+b, a+b+b, ...)
            v = a
            for _ in range(n + 1):
                out.append(v)
                v += b
            continue
        out.append(parse_number(item))
    return out


# ---------------------------------------------------------------------------------------------
# Commands


@dataclass
class LoadCmd:
    line: int
    interval_ms: int
    series: dict[Labels, list[SeqValue]]
    with_nhcb: bool = False
    has_start_timestamps: bool = False


@dataclass
class ClearCmd:
    line: int


@dataclass
class Expect:
    kind: str  # ordered|fail|warn|no_warn|info|no_info
    message: str | None = None
    regex: Regex | re.Pattern[str] | None = None

    def matches(self, s: str) -> bool:
        if self.regex is not None:
            return self.regex.search(s) is not None
        if self.message is not None:
            return self.message == s
        return True

    def describe(self) -> str:
        if self.regex is not None:
            return f"pattern {self.regex.pattern!r}"
        if self.message is not None:
            return f"message {self.message!r}"
        return "anything"


@dataclass
class EvalCmd:
    line: int
    expr: str
    is_range: bool
    start_ms: int = 0
    end_ms: int = 0
    step_ms: int = 0
    eval_ms: int = 0
    fail: bool = False
    warn: bool = False
    info: bool = False
    ordered: bool = False
    expected_fail_message: str | None = None
    expected_fail_regexp: Regex | re.Pattern[str] | None = None
    expects: dict[str, list[Expect]] = field(default_factory=dict)
    expect_scalar: bool = False
    scalar: float = 0.0
    # expected series: labels -> (position (1-based), values)
    expected: dict[Labels, tuple[int, list[SeqValue]]] = field(default_factory=dict)
    expected_string: str | None = None
    exclude_from_range_query: bool = False
    expect_range_vector: bool = False
    body: list[str] = field(default_factory=list)

    @property
    def is_fail(self) -> bool:
        return self.fail or bool(self.expects.get("fail"))

    @property
    def is_ordered(self) -> bool:
        return self.ordered or bool(self.expects.get("ordered"))

    def uses_histogram_expectation(self) -> bool:
        return any(isinstance(v, Hist) for _, vals in self.expected.values() for v in vals)


Command = LoadCmd | ClearCmd | EvalCmd


def _lines(text: str) -> list[str]:
    out = []
    for raw in text.split("\n"):
        s = raw.strip()
        out.append("" if s.startswith("#") else s)
    return out


def go_unquote(s: str) -> str:
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"`":
        if s[0] == "`":
            return s[1:-1]
        v, end = _unquote(s, 0)
        if end != len(s):
            raise ValueError("trailing characters after string")
        return v
    raise ValueError("expected string literal not valid - check that the string is correctly quoted")


def parse_script(text: str) -> list[Command]:
    lines = _lines(text)
    cmds: list[Command] = []
    i = 0
    while i < len(lines):
        l = lines[i]
        if l == "":
            i += 1
            continue
        word = _PAT_SPACE.split(l, maxsplit=1)[0].lower()
        if word == "clear":
            cmds.append(ClearCmd(i + 1))
            i += 1
        elif word.startswith("load"):
            i, cmd = _parse_load(lines, i)
            cmds.append(cmd)
        elif word.startswith("eval"):
            i, cmd = _parse_eval(lines, i)
            cmds.append(cmd)
        else:
            raise ScriptError(i + 1, f"invalid command {l!r}")
    return cmds


def _parse_load(lines: list[str], i: int) -> tuple[int, LoadCmd]:
    m = _PAT_LOAD.match(lines[i])
    if not m:
        raise ScriptError(i + 1, "invalid load command. (load[_with_nhcb] <step:duration>)")
    try:
        gap = parse_duration(m.group(2))
    except ValueError as e:
        raise ScriptError(i + 1, f"invalid step definition {m.group(2)!r}: {e}") from None
    cmd = LoadCmd(i + 1, gap, {}, with_nhcb=m.group(1) == "with_nhcb")
    i += 1
    while i < len(lines) and lines[i] != "":
        line = lines[i]
        sp = re.search(r"[ \t]", line)
        if sp and line[: sp.start()].endswith("@st"):
            cmd.has_start_timestamps = True  # start timestamps: parsed for shape only
            i += 1
            continue
        try:
            lbl, rest = parse_series_desc(line)
            cmd.series[lbl] = expand_values(rest)
        except (ValueError, IndexError) as e:
            raise ScriptError(i + 1, f"invalid series line {line!r}: {e}") from None
        i += 1
    return i, cmd


def _parse_eval(lines: list[str], i: int) -> tuple[int, EvalCmd]:
    header = lines[i]
    im = _PAT_EVAL_INSTANT.match(header)
    rm = _PAT_EVAL_RANGE.match(header)
    if not im and not rm:
        raise ScriptError(i + 1, "invalid evaluation command. Must be either 'eval[_fail|_warn|_ordered] instant [at <offset:duration>] <query>' or 'eval[_fail|_warn] range from <from> to <to> step <step> <query>'")
    try:
        if im:
            mod, at, expr = im.group(1), im.group(2), im.group(3)
            t = parse_duration(at) if at is not None else 0
            cmd = EvalCmd(i + 1, expr, False, start_ms=t, eval_ms=t)
        else:
            assert rm is not None
            mod, expr = rm.group(1), rm.group(5)
            start, end, step = parse_duration(rm.group(2)), parse_duration(rm.group(3)), parse_duration(rm.group(4))
            if end < start:
                raise ValueError(f"invalid test definition, end timestamp ({rm.group(3)}) is before start timestamp ({rm.group(2)})")
            cmd = EvalCmd(i + 1, expr, True, start_ms=start, end_ms=end, step_ms=step)
    except ValueError as e:
        raise ScriptError(i + 1, f"error in eval {header!r}: {e}") from None
    if mod == "ordered":
        cmd.ordered = True
    elif mod == "fail":
        cmd.fail = True
    elif mod == "warn":
        cmd.warn = True
    elif mod == "info":
        cmd.info = True
    pos = 0
    i += 1
    while i < len(lines) and lines[i] != "":
        line = lines[i]
        cmd.body.append(line)
        i += 1
        if cmd.fail and line.startswith("expected_fail_message"):
            cmd.expected_fail_message = line[len("expected_fail_message"):].strip()
            break
        if cmd.fail and line.startswith("expected_fail_regexp"):
            cmd.expected_fail_regexp = compile_regex(line[len("expected_fail_regexp"):].strip())
            break
        if line.startswith("expect range vector"):
            m = _PAT_EXPECT_RANGE.match(line)
            if not m:
                raise ScriptError(i, f"invalid range vector definition {line!r}")
            cmd.start_ms, cmd.end_ms, cmd.step_ms = (parse_duration(m.group(k)) for k in (1, 2, 3))
            cmd.eval_ms = cmd.end_ms
            cmd.exclude_from_range_query = True
            cmd.expect_range_vector = True
            continue
        if line.startswith("expect string"):
            try:
                cmd.expected_string = go_unquote(line[len("expect string"):])
            except (ValueError, IndexError) as e:
                raise ScriptError(i, str(e)) from None
            cmd.exclude_from_range_query = True
            continue
        if line.split(" ")[0] == "expect":
            m = _PAT_EXPECT.match(line.strip())
            if not m:
                raise ScriptError(i, "invalid expect statement, must match `expect <type> <match_type>: <string>` format")
            kind = m.group(1)
            exp = Expect(kind)
            if m.group(2) == "msg":
                exp.message = m.group(3).strip()
            elif m.group(2) == "regex":
                exp.regex = compile_regex(m.group(3).strip())  # Go RE2 syntax, searched (unanchored)
            cmd.expects.setdefault(kind, []).append(exp)
            if cmd.expects.get("info") and cmd.expects.get("no_info"):
                raise ScriptError(i, "invalid expect lines, info and no_info cannot be used together")
            if cmd.expects.get("warn") and cmd.expects.get("no_warn"):
                raise ScriptError(i, "invalid expect lines, warn and no_warn cannot be used together")
            if len(cmd.expects.get("fail", [])) > 1:
                raise ScriptError(i, "invalid expect lines, multiple expect fail lines are not allowed")
            continue
        try:
            f = parse_number(line)
        except ValueError:
            pass
        else:
            cmd.expect_scalar = True
            cmd.scalar = f
            break
        pos += 1
        try:
            lbl, rest = parse_series_desc(line)
            vals = expand_values(rest)
        except (ValueError, IndexError) as e:
            raise ScriptError(i, f"invalid expected series line {line!r}: {e}") from None
        if len(vals) > 1 and not cmd.is_range and not cmd.expect_range_vector:
            raise ScriptError(i, "expecting multiple values in instant evaluation not allowed. consider using 'expect range vector' directive to enable a range vector result for an instant query")
        cmd.expected[lbl] = (pos, vals)
    # the remainder of a block after a scalar / fail message line is ignored by upstream too
    while i < len(lines) and lines[i] != "":
        i += 1
    return i, cmd
