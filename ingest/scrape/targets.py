"""Target groups (static_configs, file_sd_configs) -> scrape targets with Prometheus's labels."""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import yaml

from ingest.relabel import relabel
from ingest.scrape.config import ScrapeConfig, format_duration, parse_duration_ms
from storage.labels import Labels


@dataclass
class TargetSpec:
    labels: Labels  # final target labels (job, instance, ...), no "__" labels
    discovered: dict[str, str]  # labels before relabeling (shown by /api/v1/targets)
    url: str
    interval_ms: int
    timeout_ms: int

    @property
    def key(self) -> tuple:
        return (self.url, self.labels)


def read_file_sd(path: str) -> list[dict[str, Any]]:
    """One file_sd file: JSON or YAML list of {"targets": [...], "labels": {...}}."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".json"):
        groups = json.loads(data or b"[]")
    else:
        groups = yaml.safe_load(data) or []
    if not isinstance(groups, list):
        raise ValueError(f"{path}: expected a list of target groups")
    out = []
    for g in groups:
        if not isinstance(g, dict):
            raise ValueError(f"{path}: target group must be a mapping")
        out.append({"targets": [str(t) for t in g.get("targets") or []],
                    "labels": {str(k): str(v) for k, v in (g.get("labels") or {}).items()},
                    "source": path})
    return out


def file_sd_paths(cfg: ScrapeConfig) -> list[str]:
    paths: list[str] = []
    for f in cfg.file_sd_configs:
        for pattern in f.files:
            paths.extend(sorted(glob.glob(pattern)))
    return paths


def file_sd_groups(cfg: ScrapeConfig, errors: list[str]) -> list[dict[str, Any]]:
    groups = []
    for p in file_sd_paths(cfg):
        try:
            for g in read_file_sd(p):
                g["labels"] = {"__meta_filepath": p, **g["labels"]}
                groups.append(g)
        except (OSError, ValueError, yaml.YAMLError) as e:
            errors.append(f"file_sd {p}: {e}")
    return groups


def _add_port(addr: str, scheme: str) -> str:
    host = addr
    if addr.startswith("["):
        if "]:" in addr:
            return addr
    elif ":" in addr:
        return addr
    return f"{host}:{443 if scheme == 'https' else 80}"


def build_targets(cfg: ScrapeConfig, groups: list[dict[str, Any]]) -> tuple[list[TargetSpec], list[dict[str, str]]]:
    """Prometheus's populateLabels: defaults, relabel_configs, port, instance, URL. Returns (active, dropped)."""
    active: list[TargetSpec] = []
    dropped: list[dict[str, str]] = []
    for g in groups:
        for addr in g["targets"]:
            lb = {**g["labels"], "__address__": addr}
            defaults = {"job": cfg.job_name, "__scheme__": cfg.scheme, "__metrics_path__": cfg.metrics_path,
                        "__scrape_interval__": format_duration(cfg.scrape_interval_ms),
                        "__scrape_timeout__": format_duration(cfg.scrape_timeout_ms)}
            for k, v in defaults.items():
                lb.setdefault(k, v)
            for k, v in cfg.params.items():
                if v:
                    lb.setdefault(f"__param_{k}", v[0])
            discovered = dict(lb)
            res = relabel(lb, cfg.relabel_configs)
            if res is None or not res.get("__address__"):
                dropped.append(discovered)
                continue
            scheme = res.get("__scheme__", cfg.scheme)
            address = _add_port(res["__address__"], scheme)
            try:
                interval = parse_duration_ms(res.get("__scrape_interval__", "")) or cfg.scrape_interval_ms
                timeout = parse_duration_ms(res.get("__scrape_timeout__", "")) or cfg.scrape_timeout_ms
            except ValueError:
                dropped.append(discovered)
                continue
            params = {k: list(v) for k, v in cfg.params.items()}
            for k, v in res.items():
                if k.startswith("__param_"):
                    name = k[len("__param_"):]
                    params[name] = [v] + params.get(name, [])[1:]
            query = urlencode([(k, x) for k, vs in params.items() for x in vs])
            url = f"{scheme}://{address}{res.get('__metrics_path__', cfg.metrics_path)}" + (f"?{query}" if query else "")
            final = {k: v for k, v in res.items() if not k.startswith("__")}
            final.setdefault("instance", address)
            labels: Labels = tuple(sorted((k, v) for k, v in final.items() if v != ""))
            active.append(TargetSpec(labels, discovered, url, interval, timeout))
    return active, dropped


def file_mtimes(cfg: ScrapeConfig) -> dict[str, float]:
    out = {}
    for p in file_sd_paths(cfg):
        try:
            out[p] = os.stat(p).st_mtime_ns
        except OSError:
            pass
    return out
