"""Label matchers with Prometheus semantics.

``=``, ``!=``, ``=~``, ``!~``. A regex value is Go RE2 syntax, fully anchored, with ``.``
matching newline (``storage.regex``). A matcher that matches the empty string also selects series
that lack the label (a missing label reads as "").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from storage.regex import Regex, RegexError, compile_regex

OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class Matcher:
    """``name op value``. Raises :class:`storage.regex.RegexError` (a ValueError) for a regex value
    RE2 refuses, with Go's ``error parsing regexp: ...`` text."""

    name: str
    op: str
    value: str
    _rx: Regex | None = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"invalid matcher operator {self.op!r}")
        if self.op in ("=~", "!~"):
            object.__setattr__(self, "_rx", compile_regex(self.value))

    def matches(self, value: str) -> bool:
        """Does a label value (``""`` when the label is absent) satisfy this matcher?"""
        op = self.op
        if op == "=":
            return value == self.value
        if op == "!=":
            return value != self.value
        hit = self._rx.fullmatch(value)  # type: ignore[union-attr]
        return hit if op == "=~" else not hit

    def matches_values(self, values: Sequence[str]) -> np.ndarray:
        """``matches`` of every value at once, as a bool array (len(values),): the way to test the
        distinct values of a label (regexes run in RE2's bulk kernel, without the GIL)."""
        op = self.op
        if op in ("=", "!="):
            hit = np.fromiter((v == self.value for v in values), dtype=bool, count=len(values))
        else:
            hit = self._rx.match_mask(values)  # type: ignore[union-attr]
        return hit if op in ("=", "=~") else ~hit

    @property
    def matches_empty(self) -> bool:
        return self.matches("")

    def __str__(self) -> str:
        v = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{v}"'


__all__ = ["OPS", "Matcher", "RegexError"]
