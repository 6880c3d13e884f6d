"""Label matchers with Prometheus semantics.

``=``, ``!=``, ``=~``, ``!~``. Regexes are fully anchored. A matcher that matches the empty
string also selects series that lack the label (a missing label reads as "").
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

OPS = ("=", "!=", "=~", "!~")


_LEADING_FLAGS = re.compile(r"^\(\?([imsx]+)\)")


@lru_cache(maxsize=4096)
def compile_anchored(pattern: str) -> re.Pattern[str]:
    # Prometheus (RE2) anchors the whole pattern: ^(?:pattern)$ ; DOTALL because RE2's `.`
    # in Prometheus matchers is compiled with (?s).
    # RE2 accepts leading flags like (?i) inside the anchoring group; Python only at the very
    # start, so turn them into a scoped group: (?i)abc -> (?i:abc).
    m = _LEADING_FLAGS.match(pattern)
    if m:
        pattern = f"(?{m.group(1)}:{pattern[m.end():]})"
    return re.compile(r"(?s:" + pattern + r")\Z")


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    _rx: re.Pattern[str] | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"invalid matcher operator {self.op!r}")
        if self.op in ("=~", "!~"):
            try:
                object.__setattr__(self, "_rx", compile_anchored(self.value))
            except re.error as e:
                raise ValueError(f"invalid regular expression {self.value!r} in matcher for label {self.name!r}: {e}") from e

    def matches(self, value: str) -> bool:
        """Does a label value (``""`` when the label is absent) satisfy this matcher?"""
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        assert self._rx is not None
        hit = self._rx.match(value) is not None
        return hit if self.op == "=~" else not hit

    @property
    def matches_empty(self) -> bool:
        return self.matches("")

    def __str__(self) -> str:
        v = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{v}"'
