"""Relabeling: Prometheus semantics checked two ways — small cases with known answers, and the
same relabel_configs given to Debian's Prometheus 2.42, whose /api/v1/targets labels (and dropped
targets) must equal what our target builder computes."""
from __future__ import annotations

import json
import time
import urllib.request

import pytest
import yaml

from ingest.relabel import RelabelConfigError, parse_relabel_configs, relabel
from ingest.scrape.config import parse_scrape_configs
from ingest.scrape.targets import build_targets
from tests.test_ingest_prometheus_peer import _start_prometheus, _stop


def rl(labels, *configs):
    return relabel(labels, parse_relabel_configs(list(configs)))


def test_defaults_and_actions():
    # default action replace, regex (.*), replacement $1, separator ;
    assert rl({"a": "x", "b": "y"}, {"source_labels": ["a", "b"], "target_label": "c"}) == {"a": "x", "b": "y", "c": "x;y"}
    # regex is anchored: partial match does nothing
    assert rl({"a": "xyz"}, {"source_labels": ["a"], "regex": "y", "target_label": "c", "replacement": "hit"}) == {"a": "xyz"}
    # empty replacement result deletes the target label
    assert rl({"a": "x", "c": "old"}, {"source_labels": ["missing"], "target_label": "c", "replacement": "$1"}) == {"a": "x"}
    # Go template semantics: $1x is group "1x" (empty); ${1}x works
    assert rl({"a": "v"}, {"source_labels": ["a"], "target_label": "t", "replacement": "${1}x"})["t"] == "vx"
    assert "t" not in rl({"a": "v"}, {"source_labels": ["a"], "target_label": "t", "replacement": "$1x"})
    assert rl({"a": "1"}, {"action": "keep", "source_labels": ["a"], "regex": "1|2"}) == {"a": "1"}
    assert rl({"a": "3"}, {"action": "keep", "source_labels": ["a"], "regex": "1|2"}) is None
    assert rl({"a": "1"}, {"action": "drop", "source_labels": ["a"], "regex": "1"}) is None
    assert rl({"__meta_x": "1", "k": "v"}, {"action": "labelmap", "regex": "__meta_(.*)"}) == {"__meta_x": "1", "k": "v", "x": "1"}
    assert rl({"a_1": "1", "b": "2"}, {"action": "labeldrop", "regex": "a_.*"}) == {"b": "2"}
    assert rl({"a_1": "1", "b": "2"}, {"action": "labelkeep", "regex": "a_.*"}) == {"a_1": "1"}
    assert rl({"a": "AbC"}, {"action": "lowercase", "source_labels": ["a"], "target_label": "l"})["l"] == "abc"
    assert rl({"a": "x", "b": "x"}, {"action": "keepequal", "source_labels": ["a"], "target_label": "b"}) is not None
    assert rl({"a": "x", "b": "x"}, {"action": "dropequal", "source_labels": ["a"], "target_label": "b"}) is None


def test_config_errors():
    with pytest.raises(RelabelConfigError, match="unknown relabel action"):
        parse_relabel_configs([{"action": "frobnicate"}])
    with pytest.raises(RelabelConfigError, match="modulus"):
        parse_relabel_configs([{"action": "hashmod", "source_labels": ["a"], "target_label": "h"}])
    with pytest.raises(RelabelConfigError, match="invalid relabel regex"):
        parse_relabel_configs([{"regex": "(", "target_label": "x"}])


def test_relabel_regex_is_go_re2_syntax():
    """Go syntax as written: inline flags mid-pattern, named groups both ways, Unicode and POSIX classes,
    \\z; (?s) so . crosses newlines; ${name} expansion."""
    assert rl({"a": "B"}, {"action": "keep", "source_labels": ["a"], "regex": "a|(?i)b"}) == {"a": "B"}
    assert rl({"a": "A"}, {"action": "keep", "source_labels": ["a"], "regex": "a|(?i)b"}) is None
    got = rl({"__address__": "host-a:9100"}, {"source_labels": ["__address__"], "regex": "(?P<host>[^:]+):(?<port>\\d+)",
                                              "target_label": "hp", "replacement": "${port}@${host}"})
    assert got["hp"] == "9100@host-a"
    assert rl({"a": "Ωμέγα"}, {"action": "keep", "source_labels": ["a"], "regex": "\\p{Greek}+"}) is not None
    assert rl({"a": "é"}, {"action": "keep", "source_labels": ["a"], "regex": "[[:alpha:]]"}) is None
    assert rl({"a": "x\ny"}, {"source_labels": ["a"], "regex": "x.(y)\\z", "target_label": "t"})["t"] == "y"
    assert rl({"a": "١٢"}, {"action": "drop", "source_labels": ["a"], "regex": "\\d+"}) is not None  # \\d is ASCII


@pytest.mark.parametrize("regex", ["(a)\\1", "(?=a)", "(?<!a)b", "(?x)a", "a\\C"])
def test_relabel_refuses_what_go_refuses(regex):
    with pytest.raises(RelabelConfigError, match="invalid relabel regex .*error parsing regexp: "):
        parse_relabel_configs([{"action": "keep", "source_labels": ["a"], "regex": regex}])


def test_relabel_regex_bombs_are_linear():
    configs = parse_relabel_configs([
        {"action": "drop", "source_labels": ["a"], "regex": "(a+)+$"},
        {"source_labels": ["a"], "regex": "(x+x+)+y", "target_label": "t", "replacement": "hit"},
        {"action": "labeldrop", "regex": "((l+)+)+$"},
    ])
    t0 = time.perf_counter()
    for n in (28, 40, 5000):
        assert relabel({"a": "a" * n + "b", "l" * n + "!": "v"}, configs) == {"a": "a" * n + "b", "l" * n + "!": "v"}
        assert relabel({"a": "x" * n}, configs) == {"a": "x" * n}
        assert relabel({"a": "a" * n}, configs) is None
    assert time.perf_counter() - t0 < 0.5


JOBS = {
    "scrape_configs": [
        {"job_name": "rl_replace", "scheme": "http", "metrics_path": "/m", "params": {"module": ["m1", "m2"]},
         "static_configs": [{"targets": ["host-a:9100", "host-b", "10.0.0.3:1234"], "labels": {"env": "Prod", "team": "x"}}],
         "relabel_configs": [
             {"source_labels": ["__address__"], "regex": "(.*):(\\d+)", "target_label": "port", "replacement": "${2}"},
             {"source_labels": ["env", "team"], "separator": "-", "target_label": "combo"},
             {"action": "lowercase", "source_labels": ["env"], "target_label": "env_lc"},
             {"action": "hashmod", "source_labels": ["__address__"], "modulus": 7, "target_label": "shard"},
             {"source_labels": ["__address__"], "regex": "host-(.)(.*)", "target_label": "__param_target", "replacement": "$1"},
             {"source_labels": ["__address__"], "target_label": "instance", "regex": "10\\.(.*)", "replacement": "ten-$1"},
         ]},
        {"job_name": "rl_keepdrop",
         "static_configs": [{"targets": [f"n{i}:80" for i in range(6)], "labels": {"__meta_rack": "r1", "__meta_zone": "z9"}}],
         "relabel_configs": [
             {"action": "hashmod", "source_labels": ["__address__"], "modulus": 3, "target_label": "__tmp_hash"},
             {"action": "keep", "source_labels": ["__tmp_hash"], "regex": "0|1"},
             {"action": "drop", "source_labels": ["__address__"], "regex": "n5:80"},
             {"action": "labelmap", "regex": "__meta_(.+)", "replacement": "m_$1"},
             {"action": "labeldrop", "regex": "m_zone"},
         ]},
        {"job_name": "rl_labelkeep",
         "static_configs": [{"targets": ["k:1"], "labels": {"a": "1", "b": "2", "keep_me": "3"}}],
         "relabel_configs": [{"action": "labelkeep", "regex": "__.*|job|keep_.*"}]},
    ]
}


def _ours():
    out = {}
    dropped = 0
    for cfg in parse_scrape_configs(JOBS):
        active, drop = build_targets(cfg, cfg.static_configs)
        dropped += len(drop)
        for t in active:
            out[(cfg.job_name, t.url)] = dict(t.labels)
    return out, dropped


@pytest.mark.peer
def test_target_labels_equal_prometheus(tmp_path):
    cfg = {"global": {"scrape_interval": "1h", "scrape_timeout": "1s"}, **JOBS}
    prom, base = _start_prometheus(tmp_path, yaml.safe_dump(cfg))
    try:
        deadline = time.time() + 30
        data = {}
        while time.time() < deadline:
            data = json.loads(urllib.request.urlopen(base + "/api/v1/targets", timeout=10).read())["data"]
            if len(data["activeTargets"]) + len(data["droppedTargets"]) >= 10:
                break
            time.sleep(0.5)
    finally:
        _stop(prom)
    theirs = {(t["scrapePool"], t["scrapeUrl"]): t["labels"] for t in data["activeTargets"]}
    mine, dropped = _ours()
    assert len(theirs) >= 5 and theirs == mine
    assert dropped == len(data["droppedTargets"])
