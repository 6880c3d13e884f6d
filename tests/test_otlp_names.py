"""OTLP -> Prometheus name rules (ingest/otlp_names.py) per translation strategy, on the cases
Prometheus's translator documents, and the ``otlp:`` config checks."""
from __future__ import annotations

import pytest

from ingest.otlp_config import OtlpSettings
from storage.go_format import format_float_f
from turboprom.config import ConfigError, validate
from ingest.otlp_names import (COUNTER, GAUGE, HISTOGRAM, UPDOWN, float_string, label_name, metric_name,
                               unit_name)

ESC, ESC_NO_SUFFIX, UTF8, NONE = ("UnderscoreEscapingWithSuffixes", "UnderscoreEscapingWithoutSuffixes",
                                  "NoUTF8EscapingWithSuffixes", "NoTranslation")


@pytest.mark.parametrize("name,unit,kind,strategy,want", [
    ("system.io", "By", COUNTER, ESC, "system_io_bytes_total"),
    ("http.server.request.duration", "s", HISTOGRAM, ESC, "http_server_request_duration_seconds"),
    ("memory.usage", "By", GAUGE, ESC, "memory_usage_bytes"),
    ("requests.count", "1", COUNTER, ESC, "requests_count_total"),  # unit 1: _ratio for gauges only
    ("cache.usage", "1", GAUGE, ESC, "cache_usage_ratio"),
    ("memory.usage.ratio", "1", GAUGE, ESC, "memory_usage_ratio"),
    ("queue.length", "1", UPDOWN, ESC, "queue_length"),
    ("active.requests", "{request}", GAUGE, ESC, "active_requests"),
    ("throughput", "By/s", GAUGE, ESC, "throughput_bytes_per_second"),
    ("speed", "m/s", GAUGE, ESC, "speed_meters_per_second"),
    ("temperature", "Cel", GAUGE, ESC, "temperature_celsius"),
    ("duration.seconds", "s", HISTOGRAM, ESC, "duration_seconds"),
    ("with.total.in.middle", "", COUNTER, ESC, "with_in_middle_total"),
    ("requests.total", "", COUNTER, ESC, "requests_total"),
    ("2xx.requests", "", COUNTER, ESC, "_2xx_requests_total"),
    ("foo__bar..baz", "", GAUGE, ESC, "foo_bar_baz"),
    ("custom.unit", "widgets", GAUGE, ESC, "custom_unit_widgets"),
    ("foo.bar", "s", COUNTER, ESC_NO_SUFFIX, "foo_bar"),
    ("foo__bar.baz", "", GAUGE, ESC_NO_SUFFIX, "foo__bar_baz"),
    ("2xx", "", GAUGE, ESC_NO_SUFFIX, "_2xx"),
    ("foo.bar", "s", COUNTER, UTF8, "foo.bar_seconds_total"),
    ("foo.bar.total", "", COUNTER, UTF8, "foo.bar_total"),
    ("gpu.util", "1", GAUGE, UTF8, "gpu.util_ratio"),
    ("net.io", "By/s", GAUGE, UTF8, "net.io_bytes_per_second"),
    ("foo.bar", "s", COUNTER, NONE, "foo.bar"),
])
def test_metric_names(name, unit, kind, strategy, want) -> None:
    assert metric_name(name, unit, kind, strategy) == want


def test_names_that_escape_to_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="empty name"):
        metric_name("...", "", GAUGE, ESC)
    with pytest.raises(ValueError, match="invalid name"):
        metric_name("_._", "", GAUGE, ESC_NO_SUFFIX)


@pytest.mark.parametrize("name,escape,want", [
    ("http.method", True, "http_method"), ("123invalid", True, "key_123invalid"), ("__reserved__", True, "__reserved__"),
    ("a..b", True, "a_b"), ("a__b", True, "a_b"), ("_x", True, "_x"), ("k8s.pod", False, "k8s.pod"),
    ("ünïcode", True, "_n_code"),
])
def test_label_names(name, escape, want) -> None:
    assert label_name(name, escape) == want


def test_bad_label_names() -> None:
    for name, escape in (("", True), ("...", True), ("___", False)):
        with pytest.raises(ValueError):
            label_name(name, escape)


def test_units_and_number_strings() -> None:
    assert unit_name("By/s", ESC) == "bytes_per_second" and unit_name("1", ESC) == "" and unit_name("{req}", ESC) == ""
    assert unit_name("ms", UTF8) == "milliseconds"
    assert [float_string(v) for v in (0.1, 100.0, 1e21, 1e-7, -2.5)] == ["0.1", "100", "1e+21", "1e-7", "-2.5"]
    # histogram bounds as le label values: Go FormatFloat(v, 'f', -1, 64), the one in storage/go_format.py
    assert [format_float_f(v) for v in (0.1, 5.0, 1e21, float("inf"))] == ["0.1", "5", "1000000000000000000000", "+Inf"]


def test_config_checks() -> None:
    validate({"otlp": {"translation_strategy": "NoUTF8EscapingWithSuffixes", "promote_scope_metadata": True}})
    with pytest.raises(ConfigError, match="otlp.translation_strategy: must be one of"):
        validate({"otlp": {"translation_strategy": "Whatever"}})
    assert OtlpSettings.from_config(None) == OtlpSettings()
    s = OtlpSettings.from_config({"translation_strategy": "NoTranslation", "promote_resource_attributes": ["k8s.pod.name"]})
    assert s.translation_strategy == "NoTranslation" and s.promote_resource_attributes == ("k8s.pod.name",)
    for raw, msg in (({"translation_strategy": "X"}, "must be one of"),
                     ({"promote_resource_attributes": ["a"], "promote_all_resource_attributes": True}, "mutually exclusive"),
                     ({"ignore_resource_attributes": ["a"]}, "needs promote_all_resource_attributes"),
                     ({"promote_resource_attributes": ["a", "a"]}, "duplicate"),
                     ({"promote_scope_metadata": "yes"}, "true or false"),
                     ({"promote": []}, "unknown field")):
        with pytest.raises(ValueError, match=msg):
            OtlpSettings.from_config(raw)
