"""The ``otlp:`` section of the server config (Prometheus 3.x's keys and meanings):

    otlp:
      translation_strategy: UnderscoreEscapingWithSuffixes   # or UnderscoreEscapingWithoutSuffixes,
                                                             # NoUTF8EscapingWithSuffixes, NoTranslation
      promote_resource_attributes: [service.version, k8s.pod.name]   # resource attributes copied onto every series
      promote_all_resource_attributes: false   # copy all of them (then ignore_resource_attributes applies)
      ignore_resource_attributes: []           # only with promote_all_resource_attributes
      keep_identifying_resource_attributes: false   # keep service.name/namespace/instance.id on target_info too
      promote_scope_metadata: false            # otel_scope_name/_version/_schema_url and otel_scope_<attr> labels

The UTF-8 strategies need ``global.metric_name_validation_scheme: utf8`` (the default); with ``legacy``
the names they keep are refused, as Prometheus refuses that combination.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ingest.otlp_names import STRATEGIES

_FIELDS = ("translation_strategy", "promote_resource_attributes", "promote_all_resource_attributes",
           "ignore_resource_attributes", "keep_identifying_resource_attributes", "promote_scope_metadata")


def _str_list(raw: dict, key: str) -> tuple[str, ...]:
    v = raw.get(key) or []
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ValueError(f"otlp.{key}: must be a list of attribute names")
    out: list[str] = []
    for x in v:
        x = x.strip()
        if not x:
            raise ValueError(f"otlp.{key}: empty attribute name")
        if x in out:
            raise ValueError(f"otlp.{key}: duplicate attribute {x!r}")
        out.append(x)
    return tuple(out)


def _bool(raw: dict, key: str) -> bool:
    v = raw.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ValueError(f"otlp.{key}: must be true or false, got {v!r}")
    return v


@dataclass(frozen=True)
class OtlpSettings:
    translation_strategy: str = "UnderscoreEscapingWithSuffixes"
    promote_resource_attributes: tuple[str, ...] = ()
    promote_all_resource_attributes: bool = False
    ignore_resource_attributes: tuple[str, ...] = ()
    keep_identifying_resource_attributes: bool = False
    promote_scope_metadata: bool = False

    @classmethod
    def from_config(cls, raw: Any) -> "OtlpSettings":
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError("otlp: must be a mapping of settings")
        unknown = sorted(set(map(str, raw)) - set(_FIELDS))
        if unknown:
            raise ValueError(f"otlp: unknown field {unknown[0]!r} (known: {', '.join(_FIELDS)})")
        strategy = raw.get("translation_strategy") or cls.translation_strategy
        if strategy not in STRATEGIES:
            raise ValueError(f"otlp.translation_strategy: must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        promote = _str_list(raw, "promote_resource_attributes")
        promote_all = _bool(raw, "promote_all_resource_attributes")
        ignore = _str_list(raw, "ignore_resource_attributes")
        if promote and promote_all:
            raise ValueError("otlp: promote_all_resource_attributes and promote_resource_attributes are mutually exclusive")
        if ignore and not promote_all:
            raise ValueError("otlp: ignore_resource_attributes needs promote_all_resource_attributes: true")
        return cls(strategy, promote, promote_all, ignore, _bool(raw, "keep_identifying_resource_attributes"),
                   _bool(raw, "promote_scope_metadata"))
