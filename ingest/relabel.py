"""Prometheus relabeling (relabel_configs / metric_relabel_configs), with Prometheus defaults:
action=replace, separator=";", regex="(.*)" (fully anchored), replacement="$1".

Actions: replace, keep, drop, labelmap, labeldrop, labelkeep, hashmod, lowercase, uppercase,
keepequal, dropequal. Works on one label dict at a time (per series / per target: callers cache
results per distinct series so this is not per sample).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ingest.validation import LABEL_NAME_RE
from storage.regex import Regex, RegexError, compile_regex, expand_template

ACTIONS = {"replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep", "hashmod", "lowercase", "uppercase",
           "keepequal", "dropequal"}


class RelabelConfigError(ValueError):
    pass


_DEFAULT_REGEX = "(.*)"


@dataclass
class RelabelConfig:
    action: str = "replace"
    source_labels: list[str] = field(default_factory=list)
    separator: str = ";"
    regex: Regex = field(default_factory=lambda: compile_regex(_DEFAULT_REGEX))
    regex_text: str = _DEFAULT_REGEX
    target_label: str = ""
    replacement: str = "$1"
    modulus: int = 0

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RelabelConfig":
        if not isinstance(d, dict):
            raise RelabelConfigError(f"relabel config must be a mapping, got {d!r}")
        action = str(d.get("action", "replace")).lower()
        if action not in ACTIONS:
            raise RelabelConfigError(f"unknown relabel action {action!r}")
        regex_text = str(d.get("regex", _DEFAULT_REGEX))
        try:
            rx = compile_regex(regex_text)  # Go RE2 syntax, anchored, (?s): as Prometheus's relabel.NewRegexp
        except RegexError as e:
            raise RelabelConfigError(f"invalid relabel regex {regex_text!r}: {e}") from None
        src = d.get("source_labels") or []
        if isinstance(src, str):
            src = [src]
        c = cls(action=action, source_labels=[str(s) for s in src], separator=str(d.get("separator", ";")),
                regex=rx, regex_text=regex_text, target_label=str(d.get("target_label", "") or ""),
                replacement=str(d.get("replacement", "$1")), modulus=int(d.get("modulus", 0) or 0))
        if action in ("replace", "hashmod", "lowercase", "uppercase", "keepequal", "dropequal") and not c.target_label:
            raise RelabelConfigError(f"relabel configuration for {action} action requires 'target_label' value")
        if action == "hashmod" and c.modulus <= 0:
            raise RelabelConfigError("relabel configuration for hashmod requires non-zero modulus")
        if action in ("labeldrop", "labelkeep") and (c.source_labels or c.target_label):
            raise RelabelConfigError(f"{action} action requires only 'regex', and no other fields")
        return c


def parse_relabel_configs(items: Any) -> list[RelabelConfig]:
    if not items:
        return []
    if not isinstance(items, list):
        raise RelabelConfigError("relabel configs must be a list")
    return [RelabelConfig.from_dict(d) for d in items]


def _hashmod(value: str, modulus: int) -> int:
    digest = hashlib.md5(value.encode()).digest()
    return int.from_bytes(digest[8:], "big") % modulus


def relabel(labels: dict[str, str], configs: list[RelabelConfig]) -> dict[str, str] | None:
    """Apply configs in order; None when the series/target is dropped. Does not mutate the input."""
    if not configs:
        return labels
    lb = dict(labels)
    for c in configs:
        val = c.separator.join(lb.get(n, "") for n in c.source_labels)
        a = c.action
        if a == "replace":
            m = c.regex.match(val)
            if m is None:
                continue
            target = expand_template(c.target_label, m)
            res = expand_template(c.replacement, m)
            if not LABEL_NAME_RE.match(target):
                continue
            if res == "":
                lb.pop(target, None)
            else:
                lb[target] = res
        elif a == "keep":
            if not c.regex.fullmatch(val):
                return None
        elif a == "drop":
            if c.regex.fullmatch(val):
                return None
        elif a == "hashmod":
            lb[c.target_label] = str(_hashmod(val, c.modulus))
        elif a == "labelmap":
            for name in list(lb):
                m = c.regex.match(name)
                if m is not None:
                    new = expand_template(c.replacement, m)
                    if new:
                        lb[new] = lb[name]
        elif a == "labeldrop":
            for name in [n for n in lb if c.regex.fullmatch(n)]:
                del lb[name]
        elif a == "labelkeep":
            for name in [n for n in lb if not c.regex.fullmatch(n)]:
                del lb[name]
        elif a == "lowercase":
            lb[c.target_label] = val.lower()
        elif a == "uppercase":
            lb[c.target_label] = val.upper()
        elif a == "keepequal":
            if lb.get(c.target_label, "") != val:
                return None
        elif a == "dropequal":
            if lb.get(c.target_label, "") == val:
                return None
    return {k: v for k, v in lb.items() if v != ""}
