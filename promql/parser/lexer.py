"""PromQL lexer: query text -> tokens, following the states of Prometheus's ``promql/parser/lex.go``
(statements, inside braces, after ``[``), so that which text is a token, and which text is a lexer
error with which message at which position, is the same as in Prometheus 3.x.

A token is ``Token(typ, pos, val)``: ``typ`` one of the names below, ``pos`` the offset of its first
character, ``val`` its text. The last token is ``EOF`` or ``ERROR`` (``val`` then holds the message
and ``pos`` where the offending token began).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from storage.go_format import go_quote


class Token(NamedTuple):
    typ: str
    pos: int
    val: str


OPERATORS = frozenset({"ADD", "DIV", "EQLC", "EQL_REGEX", "GTE", "GTR", "TRIM_UPPER", "TRIM_LOWER", "LAND", "LOR",
                       "LSS", "LTE", "LUNLESS", "MOD", "MUL", "NEQ", "NEQ_REGEX", "POW", "SUB", "AT", "ATAN2"})
AGGREGATORS = frozenset({"AVG", "BOTTOMK", "COUNT", "COUNT_VALUES", "GROUP", "MAX", "MIN", "QUANTILE", "STDDEV",
                         "STDVAR", "SUM", "TOPK", "LIMITK", "LIMIT_RATIO"})
KEYWORDS = frozenset({"BOOL", "BY", "GROUP_LEFT", "GROUP_RIGHT", "FILL", "FILL_LEFT", "FILL_RIGHT", "IGNORING",
                      "OFFSET", "SMOOTHED", "ANCHORED", "ON", "WITHOUT"})
PREPROCESSORS = frozenset({"START", "END", "STEP", "RANGE", "MAX_OF", "MIN_OF"})

KEY = {
    "and": "LAND", "or": "LOR", "unless": "LUNLESS", "atan2": "ATAN2",
    "sum": "SUM", "avg": "AVG", "count": "COUNT", "min": "MIN", "max": "MAX", "group": "GROUP",
    "stddev": "STDDEV", "stdvar": "STDVAR", "topk": "TOPK", "bottomk": "BOTTOMK", "count_values": "COUNT_VALUES",
    "quantile": "QUANTILE", "limitk": "LIMITK", "limit_ratio": "LIMIT_RATIO",
    "offset": "OFFSET", "smoothed": "SMOOTHED", "anchored": "ANCHORED", "by": "BY", "without": "WITHOUT",
    "on": "ON", "ignoring": "IGNORING", "group_left": "GROUP_LEFT", "group_right": "GROUP_RIGHT",
    "fill": "FILL", "fill_left": "FILL_LEFT", "fill_right": "FILL_RIGHT", "bool": "BOOL",
    "start": "START", "end": "END", "step": "STEP", "range": "RANGE", "max_of": "MAX_OF", "min_of": "MIN_OF",
}
_KEY_NUMBERS = frozenset({"inf", "nan"})
_DURATION_KEYWORDS = {"step": "STEP", "range": "RANGE", "max_of": "MAX_OF", "min_of": "MIN_OF"}
_DURATION_KEYWORD_START = frozenset(k[0] for k in _DURATION_KEYWORDS)

# token types with a fixed spelling (Prometheus's ItemTypeStr): described by their text
FIXED = frozenset({"LEFT_PAREN", "RIGHT_PAREN", "LEFT_BRACE", "RIGHT_BRACE", "LEFT_BRACKET", "RIGHT_BRACKET",
                   "COMMA", "EQL", "COLON", "SEMICOLON", "BLANK", "TIMES", "SPACE"}) | OPERATORS | set(KEY.values())
_DESC = {"ERROR": "error", "EOF": "end of input", "COMMENT": "comment", "IDENTIFIER": "identifier",
         "METRIC_IDENTIFIER": "metric identifier", "STRING": "string", "NUMBER": "number", "DURATION": "duration"}

_SPACE = frozenset(" \t\n\r")
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_RUNE_ERROR = "\ufffd"


def _is_alpha(c: str) -> bool:
    return c == "_" or ("a" <= c <= "z") or ("A" <= c <= "Z")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _is_alnum(c: str) -> bool:
    return _is_alpha(c) or _is_digit(c)


def _bad_rune(c: str) -> bool:
    """What Go's UTF-8 decoder reports as RuneError: U+FFFD itself, or an undecodable byte (carried
    in Python as a surrogate escape)."""
    return c == _RUNE_ERROR or "\ud800" <= c <= "\udfff"


def char_quote(c: str) -> str:
    """Go's ``%q`` of a rune: ``'x'``."""
    if c == "'":
        return "'\\''"
    q = go_quote(c)[1:-1]
    if q == '\\"':
        q = '"'
    return f"'{q}'"


def rune_u(c: str) -> str:
    """Go's ``%#U``: ``U+0063 'c'`` (the character only when printable)."""
    o = ord(c)
    s = f"U+{o:04X}"
    return f"{s} '{c}'" if c.isprintable() else s


def describe(tok: Token) -> str:
    """Prometheus's ``Item.desc()``: how an unexpected token is named in a parse error."""
    if tok.typ in FIXED:
        return token_string(tok)
    if tok.typ == "EOF":
        return "end of input"
    return f"{_DESC.get(tok.typ, tok.typ)} {token_string(tok)}"


def token_string(tok: Token) -> str:
    """Prometheus's ``Item.String()``."""
    if tok.typ == "EOF":
        return "EOF"
    if tok.typ == "ERROR":
        return tok.val
    if tok.typ in ("IDENTIFIER", "METRIC_IDENTIFIER"):
        return go_quote(tok.val)
    if tok.typ in KEYWORDS:
        return f"<{tok.val}>"
    if tok.typ in OPERATORS:
        return f"<op:{tok.val}>"
    if tok.typ in AGGREGATORS:
        return f"<aggr:{tok.val}>"
    if len(tok.val) > 10:
        return go_quote(tok.val[:10]) + "..."
    return go_quote(tok.val)


# Fast paths: text these match is lexed exactly as the state machine would lex it (anything else,
# e.g. "1_000", "0x1f", "5.5m", strings with escapes, takes the character-by-character path).
_SPACES = re.compile(r"[ \t\n\r]+")
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_BRACE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?(?![0-9A-Za-z_.])")
_PLAIN_DURATION = re.compile(r"[0-9]+[smhdwy]s?(?:[0-9]+[smhdw]s?)*(?![0-9A-Za-z_])")
_PLAIN_STRING = {'"': re.compile(r'"[^"\\\n\ufffd\ud800-\udfff]*"'),
                 "'": re.compile(r"'[^'\\\n\ufffd\ud800-\udfff]*'"),
                 "`": re.compile(r"`[^`\ufffd\ud800-\udfff]*`")}
_SIMPLE_STMT = {",": "COMMA", "*": "MUL", "/": "DIV", "%": "MOD", "+": "ADD", "-": "SUB", "^": "POW", "@": "AT"}
_SIMPLE_DUR = {"+": "ADD", "-": "SUB", "*": "MUL", "/": "DIV", "%": "MOD", "^": "POW", ",": "COMMA"}


_STRING_RE = (r'"[^"\\\n\ufffd\ud800-\udfff]*"' r"|'[^'\\\n\ufffd\ud800-\udfff]*'" r"|`[^`\ufffd\ud800-\udfff]*`")
# One master expression per lexer state for the common tokens; whatever none of them matches is
# handed to the state machine (Lexer) at that point, which also produces every error.
_STMT_RE = re.compile(  # spaces before a token are taken with it; spaces alone (before EOF, a comment) last
    r"[ \t\n\r]*(?:"
    r"(?P<word>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<num>[0-9]+(?:\.[0-9]+)?(?![0-9A-Za-z_.]))"
    r"|(?P<dur>[0-9]+[smhdwy]s?(?:[0-9]+[smhdw]s?)*(?![0-9A-Za-z_]))"
    r"|(?P<str>" + _STRING_RE + ")"
    r"|(?P<op>==|!=|<=|>=|</|>/|=(?!~)|[,*/%+\-^@<>])"
    r"|(?P<lp>\()|(?P<rp>\))|(?P<lb>\{)|(?P<lk>\[)|(?P<rk>\]))"
    r"|(?P<sp>[ \t\n\r]+)")
_BRACE_RE = re.compile(
    r"[ \t\n\r]*(?:"
    r"(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<str>" + _STRING_RE + ")"
    r"|(?P<op>=~|!~|!=|=|,)"
    r"|(?P<rb>\}))"
    r"|(?P<sp>[ \t\n\r]+)")
_DUR_RE = re.compile(
    r"(?P<num>[0-9]+(?:\.[0-9]+)?(?![0-9A-Za-z_.]))"
    r"|(?P<dur>[0-9]+[smhdwy]s?(?:[0-9]+[smhdw]s?)*(?![0-9A-Za-z_]))"
    r"|(?P<rk>\])")
_OP_TYPES = {"==": "EQLC", "!=": "NEQ", "<=": "LTE", ">=": "GTE", "</": "TRIM_UPPER", ">/": "TRIM_LOWER", "=": "EQL",
             ",": "COMMA", "*": "MUL", "/": "DIV", "%": "MOD", "+": "ADD", "-": "SUB", "^": "POW", "@": "AT",
             "<": "LSS", ">": "GTR"}
_BRACE_OP_TYPES = {"=~": "EQL_REGEX", "!~": "NEQ_REGEX", "!=": "NEQ", "=": "EQL", ",": "COMMA"}
_FILLS = frozenset({"FILL", "FILL_LEFT", "FILL_RIGHT"})
_new_token = tuple.__new__


def _followed_by_paren(text: str, pos: int) -> bool:
    m = _SPACES.match(text, pos)
    if m is not None:
        pos = m.end()
    return text.startswith("(", pos)


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text``, ending with EOF or with the ERROR token the lexer stopped at.

    The loop lexes the common tokens with one regular expression per state; at anything else it
    hands its state to a :class:`Lexer` for one token (which is where every error comes from)."""
    lex: Lexer | None = None  # made when first needed
    out: list[Token] = []
    append = out.append
    n = len(text)
    stmt, brace_re, dur_re = _STMT_RE.match, _BRACE_RE.match, _DUR_RE.match
    key_get, op_types, brace_ops = KEY.get, _OP_TYPES, _BRACE_OP_TYPES
    pos = 0
    brace = bracket = in_dur = got_colon = got_dur = False
    depth = 0
    while True:
        if brace:
            m = brace_re(text, pos)
            if m is not None:
                g = m.lastgroup
                pos = m.end()
                if g == "id":
                    v = m.group(g)
                    append(_new_token(Token, ("IDENTIFIER", pos - len(v), v)))
                elif g == "str":
                    v = m.group(g)
                    append(_new_token(Token, ("STRING", pos - len(v), v)))
                elif g == "op":
                    v = m.group(g)
                    append(_new_token(Token, (brace_ops[v], pos - len(v), v)))
                elif g == "rb":
                    brace = False
                    append(_new_token(Token, ("RIGHT_BRACE", pos - 1, "}")))
                continue
        elif in_dur:
            m = dur_re(text, pos)
            if m is not None:
                g = m.lastgroup
                end = m.end()
                if g == "rk":
                    bracket = in_dur = got_colon = False
                    append(_new_token(Token, ("RIGHT_BRACKET", pos, "]")))
                else:
                    got_dur = True
                    in_dur = False
                    append(_new_token(Token, ("NUMBER" if g == "num" else "DURATION", pos, m.group())))
                pos = end
                continue
        else:
            m = stmt(text, pos)
            if m is not None:
                g = m.lastgroup
                end = m.end()
                if g == "word":
                    if not bracket:
                        word = m.group(g)
                        low = word.lower()
                        kw = key_get(low)
                        if kw is not None:
                            if kw in _FILLS and not _followed_by_paren(text, end):
                                kw = "IDENTIFIER"
                            typ = kw
                        elif low in _KEY_NUMBERS:
                            typ = "NUMBER"
                        elif ":" in word:
                            typ = "METRIC_IDENTIFIER"
                        else:
                            typ = "IDENTIFIER"
                        append(_new_token(Token, (typ, end - len(word), word)))
                        pos = end
                        continue
                elif g == "sp":
                    pos = end
                    continue
                elif g == "op":
                    v = m.group(g)
                    append(_new_token(Token, (op_types[v], end - len(v), v)))
                    pos = end
                    continue
                elif g == "lp":
                    depth += 1
                    append(_new_token(Token, ("LEFT_PAREN", end - 1, "(")))
                    pos = end
                    continue
                elif g == "rp":
                    if depth > 0:
                        depth -= 1
                        append(_new_token(Token, ("RIGHT_PAREN", end - 1, ")")))
                        pos = end
                        continue
                elif g == "num" or g == "dur":
                    v = m.group(g)
                    append(_new_token(Token, ("NUMBER" if g == "num" else "DURATION", end - len(v), v)))
                    pos = end
                    continue
                elif g == "str":
                    v = m.group(g)
                    append(_new_token(Token, ("STRING", end - len(v), v)))
                    pos = end
                    continue
                elif g == "lb":
                    brace = True
                    append(_new_token(Token, ("LEFT_BRACE", end - 1, "{")))
                    pos = end
                    continue
                elif g == "lk":
                    if not bracket:
                        got_colon = False
                        append(_new_token(Token, ("LEFT_BRACKET", end - 1, "[")))
                        m = _SPACES.match(text, end)
                        pos = m.end() if m is not None else end
                        bracket = in_dur = True
                        continue
                elif bracket:  # "]"
                    bracket = False
                    append(_new_token(Token, ("RIGHT_BRACKET", end - 1, "]")))
                    pos = end
                    continue
                # the state machine takes it from here: skip the spaces first, as it would
                pos = end - len(m.group(g))
        if pos >= n and not (depth or bracket or brace):
            append(_new_token(Token, ("EOF", n, "")))
            return out
        # one token from the state machine
        if lex is None:
            lex = Lexer(text)
        lex.pos = lex.start = pos
        lex.brace_open, lex.bracket_open, lex.in_duration = brace, bracket, in_dur
        lex.got_colon, lex.got_duration, lex.paren_depth = got_colon, got_dur, depth
        t = lex.next_token()
        append(t)
        if t.typ == "EOF" or t.typ == "ERROR":
            return out
        pos = lex.pos
        brace, bracket, in_dur = lex.brace_open, lex.bracket_open, lex.in_duration
        got_colon, got_dur, depth = lex.got_colon, lex.got_duration, lex.paren_depth


class Lexer:
    """Emits the tokens of ``text`` one at a time (``next_token``); comments are dropped."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.n = len(text)
        self.pos = 0
        self.start = 0
        self.paren_depth = 0
        self.brace_open = False
        self.bracket_open = False
        self.got_colon = False
        self.got_duration = False
        self.in_duration = False  # the state right after "[" (Prometheus's lexDurationExpr)
        self.done = False

    # -- helpers ---------------------------------------------------------------------------

    def _peek(self) -> str:
        return self.s[self.pos] if self.pos < self.n else ""

    def _next(self) -> str:
        if self.pos >= self.n:
            return ""
        c = self.s[self.pos]
        self.pos += 1
        return c

    def _accept(self, valid: str) -> bool:
        c = self._peek()
        if c and c in valid:
            self.pos += 1
            return True
        return False

    def _emit(self, typ: str) -> Token:
        t = Token(typ, self.start, self.s[self.start:self.pos])
        self.start = self.pos
        return t

    def _error(self, msg: str) -> Token:
        self.done = True
        return Token("ERROR", self.start, msg)

    def _skip_spaces(self) -> None:
        while self.pos < self.n and self.s[self.pos] in _SPACE:
            self.pos += 1
        self.start = self.pos

    # -- entry -----------------------------------------------------------------------------

    def next_token(self) -> Token:
        if self.done:
            return Token("EOF", self.n, "")
        while True:
            if self.brace_open:
                tok = self._inside_braces()
            elif self.in_duration:
                tok = self._duration_expr()
            else:
                tok = self._statements()
            if tok is None:
                continue
            if tok.typ == "EOF":
                self.done = True
            return tok

    def _comment(self) -> None:
        j = self.pos + 1
        while j < self.n and self.s[j] not in "\r\n":
            j += 1
        self.pos = j
        self.start = j

    def _statements(self) -> Token | None:
        s, pos = self.s, self.pos
        if pos < self.n:
            c = s[pos]
            if c in _SPACE:
                self.pos = self.start = _SPACES.match(s, pos).end()
                return None
            if c == "#":
                self._comment()
                return None
            typ = _SIMPLE_STMT.get(c)
            if typ is not None:
                self.pos = pos + 1
                return self._emit(typ)
            if not self.bracket_open and (_is_alpha(c) or c == ":"):
                self.pos = _WORD.match(s, pos).end()
                return self._word()
            if "0" <= c <= "9":
                m = _PLAIN_NUMBER.match(s, pos) or _PLAIN_DURATION.match(s, pos)
                if m is not None:
                    self.pos = m.end()
                    return self._emit("NUMBER" if m.re is _PLAIN_NUMBER else "DURATION")
            if c in _PLAIN_STRING:
                m = _PLAIN_STRING[c].match(s, pos)
                if m is not None:
                    self.pos = m.end()
                    return self._emit("STRING")
        r = self._next()
        if r == "":
            if self.paren_depth != 0:
                return self._error("unclosed left parenthesis")
            if self.bracket_open:
                return self._error("unclosed left bracket")
            return self._emit("EOF")
        if r in _SPACE:
            self._skip_spaces()
            return None
        if r == "=":
            t = self._peek()
            if t == "=":
                self.pos += 1
                return self._emit("EQLC")
            if t == "~":
                return self._error(f"unexpected character after '=': {char_quote(t)}")
            return self._emit("EQL")
        if r == "!":
            t = self._next()
            if t != "=":
                return self._error(f"unexpected character after '!': {char_quote(t) if t else 'U+FFFFFFFF'}")
            return self._emit("NEQ")
        if r == "<":
            t = self._peek()
            if t == "=":
                self.pos += 1
                return self._emit("LTE")
            if t == "/":
                self.pos += 1
                return self._emit("TRIM_UPPER")
            return self._emit("LSS")
        if r == ">":
            t = self._peek()
            if t == "=":
                self.pos += 1
                return self._emit("GTE")
            if t == "/":
                self.pos += 1
                return self._emit("TRIM_LOWER")
            return self._emit("GTR")
        if _is_digit(r) or (r == "." and _is_digit(self._peek())):
            self.pos -= 1
            return self._number_or_duration()
        if r in "\"'":
            return self._string(r)
        if r == "`":
            return self._raw_string()
        if _is_alpha(r) or r == ":":
            if not self.bracket_open:
                self.pos -= 1
                return self._keyword_or_identifier()
            if r == ":":
                if self.got_colon:
                    return self._error("unexpected colon ':'")
                tok = self._emit("COLON")
                self.got_colon = True
                return tok
            if r.lower() in _DURATION_KEYWORD_START:
                tok = self._duration_keyword()
                if tok is not None:
                    return tok
            return self._error(f"unexpected character: {char_quote(r)}, expected ':'")
        if r == "(":
            self.paren_depth += 1
            return self._emit("LEFT_PAREN")
        if r == ")":
            tok = self._emit("RIGHT_PAREN")
            self.paren_depth -= 1
            if self.paren_depth < 0:
                return self._error("unexpected right parenthesis ')'")
            return tok
        if r == "{":
            self.brace_open = True
            return self._emit("LEFT_BRACE")
        if r == "[":
            if self.bracket_open:
                return self._error("unexpected left bracket '['")
            self.got_colon = False
            tok = self._emit("LEFT_BRACKET")
            self._skip_spaces()
            self.bracket_open = True
            self.in_duration = True
            return tok
        if r == "]":
            if not self.bracket_open:
                return self._error("unexpected right bracket ']'")
            self.bracket_open = False
            return self._emit("RIGHT_BRACKET")
        return self._error(f"unexpected character: {char_quote(r)}")

    def _inside_braces(self) -> Token | None:
        if self.s.startswith("#", self.pos):
            self._comment()
            return None
        s, pos = self.s, self.pos
        if pos < self.n:
            c = s[pos]
            if c in _SPACE:
                self.pos = self.start = _SPACES.match(s, pos).end()
                return None
            if _is_alpha(c):
                self.pos = _BRACE_WORD.match(s, pos).end()
                return self._emit("IDENTIFIER")
            if c in _PLAIN_STRING:
                m = _PLAIN_STRING[c].match(s, pos)
                if m is not None:
                    self.pos = m.end()
                    return self._emit("STRING")
        r = self._next()
        if r == "":
            return self._error("unexpected end of input inside braces")
        if r == ",":
            return self._emit("COMMA")
        if r in "\"'":
            return self._string(r)
        if r == "`":
            return self._raw_string()
        if r == "=":
            if self._accept("~"):
                return self._emit("EQL_REGEX")
            return self._emit("EQL")
        if r == "!":
            nr = self._next()
            if nr == "~":
                return self._emit("NEQ_REGEX")
            if nr == "=":
                return self._emit("NEQ")
            return self._error(f"unexpected character after '!' inside braces: {char_quote(nr) if nr else 'U+FFFFFFFF'}")
        if r == "{":
            return self._error("unexpected left brace '{'")
        if r == "}":
            self.brace_open = False
            return self._emit("RIGHT_BRACE")
        return self._error(f"unexpected character inside braces: {char_quote(r)}")

    def _duration_expr(self) -> Token | None:
        r = self._next()
        if r == "":
            return self._error("unexpected end of input in duration expression")
        if r == "]":
            self.bracket_open = False
            self.got_colon = False
            self.in_duration = False
            return self._emit("RIGHT_BRACKET")
        if r == ":":
            tok = self._emit("COLON")
            if not self.got_duration:
                return self._error("unexpected colon before duration in duration expression")
            if self.got_colon:
                return self._error("unexpected repeated colon in duration expression")
            self.got_colon = True
            return tok
        if r == "(":
            self.paren_depth += 1
            return self._emit("LEFT_PAREN")
        if r == ")":
            tok = self._emit("RIGHT_PAREN")
            self.paren_depth -= 1
            if self.paren_depth < 0:
                return self._error("unexpected right parenthesis ')'")
            return tok
        if r in _SPACE:
            self._skip_spaces()
            return None
        if r in _SIMPLE_DUR:
            return self._emit(_SIMPLE_DUR[r])
        if r.lower() in _DURATION_KEYWORD_START:
            tok = self._duration_keyword()
            if tok is not None:
                return tok
            return self._error(f"unexpected character in duration expression: {char_quote(r)}")
        if _is_digit(r) or (r == "." and _is_digit(self._peek())):
            self.pos -= 1
            self.got_duration = True
            self.in_duration = False
            return self._number_or_duration()
        return self._error(f"unexpected character in duration expression: {char_quote(r)}")

    def _duration_keyword(self) -> Token | None:
        while self.pos < self.n and _is_alpha(self.s[self.pos]):
            self.pos += 1
        word = self.s[self.start:self.pos].lower()
        typ = _DURATION_KEYWORDS.get(word)
        if typ is None:
            return None
        return self._emit(typ)

    def _keyword_or_identifier(self) -> Token:
        self.pos = _WORD.match(self.s, self.pos).end()
        return self._word()

    def _word(self) -> Token:
        word = self.s[self.start:self.pos]
        low = word.lower()
        kw = KEY.get(low)
        if kw is not None:
            if kw in ("FILL", "FILL_LEFT", "FILL_RIGHT") and not self._followed_by_paren():
                return self._emit("IDENTIFIER")
            return self._emit(kw)
        if low in _KEY_NUMBERS:
            return self._emit("NUMBER")
        if ":" not in word:
            return self._emit("IDENTIFIER")
        return self._emit("METRIC_IDENTIFIER")

    def _followed_by_paren(self) -> bool:
        return _followed_by_paren(self.s, self.pos)

    # -- strings ---------------------------------------------------------------------------

    def _string(self, quote: str) -> Token:
        while True:
            c = self._next()
            if c == "\\":
                err = self._escape(quote)
                if err is not None:
                    return self._error(err)
                continue
            if c != "" and _bad_rune(c):
                return self._error("invalid UTF-8 rune")
            if c == "" or c == "\n":
                return self._error("unterminated quoted string")
            if c == quote:
                return self._emit("STRING")

    def _escape(self, quote: str) -> str | None:
        ch = self._next()
        if ch in ("a", "b", "f", "n", "r", "t", "v", "\\", quote) and ch != "":
            return None
        if ch == "":
            return "escape sequence not terminated"
        if ch in "01234567":
            n, base, max_val = 3, 8, 255
        elif ch == "x":
            ch = self._next()
            n, base, max_val = 2, 16, 255
        elif ch == "u":
            ch = self._next()
            n, base, max_val = 4, 16, 0x10FFFF
        elif ch == "U":
            ch = self._next()
            n, base, max_val = 8, 16, 0x10FFFF
        else:
            return f"unknown escape sequence {rune_u(ch)}"
        x = 0
        while n > 0:
            d = int(ch, 16) if ch and ch in _HEX else 16
            if d >= base:
                if ch == "":
                    return "escape sequence not terminated"
                return f"illegal character {rune_u(ch)} in escape sequence"
            x = x * base + d
            n -= 1
            if n > 0:
                ch = self._next()
        if x > max_val or 0xD800 <= x < 0xE000:
            return "escape sequence is an invalid Unicode code point"
        return None

    def _raw_string(self) -> Token:
        while True:
            c = self._next()
            if c != "" and _bad_rune(c):
                return self._error("invalid UTF-8 rune")
            if c == "":
                return self._error("unterminated raw string")
            if c == "`":
                return self._emit("STRING")

    # -- numbers ---------------------------------------------------------------------------

    def _number_or_duration(self) -> Token:
        if self._scan_number():
            return self._emit("NUMBER")
        if self._accept_remaining_duration():
            return self._emit("DURATION")
        return self._error(f"bad number or duration syntax: {go_quote(self.s[self.start:self.pos])}")

    def _accept_remaining_duration(self) -> bool:
        if not self._accept("smhdwy"):
            return False
        self._accept("s")
        while self._accept(_DIGITS):
            while self._accept(_DIGITS):
                pass
            if not self._accept("smhdw"):
                return False
            self._accept("s")
        c = self._peek()
        if c and _is_alnum(c):
            self.pos += 1
            return False
        return True

    def _scan_number(self) -> bool:
        initial = self.pos
        digits = _DIGITS
        if self._accept("0"):
            if self._accept("xX"):
                self._accept("_")
                digits = _HEX
        self._accept(".")
        self._accept(digits)
        dot = exp = False
        pattern = digits + "._eE"
        while self._peek() and self._peek() in pattern:
            c = self._peek()
            if c == "." and dot:
                self.pos += 1
                return False
            if c in "eE" and exp:
                self.pos += 1
                return False
            if self._accept("."):
                dot = True
                if self._accept("_."):
                    return False
                if digits is _HEX:
                    return False
                continue
            if self._accept("eE"):
                exp = True
                self._accept("+-")
                if self._accept("._eE") or self._peek() == "":
                    return False
                continue
            if self._accept("_"):
                if self._accept("._eE") or self._peek() == "":
                    return False
                continue
            while self._accept(digits):
                pass
        if self.pos == initial:
            return False
        c = self._peek()
        return not (c and _is_alnum(c))


__all__ = ["Token", "Lexer", "tokenize", "describe", "token_string", "char_quote", "OPERATORS", "AGGREGATORS", "KEYWORDS",
           "PREPROCESSORS", "KEY"]
