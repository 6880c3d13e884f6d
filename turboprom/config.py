"""Server configuration: command-line flags plus an optional Prometheus-style YAML file.

The YAML is strict, like Prometheus's: a field no stage reads, or a value of the wrong type, refuses
the file with a message naming the field, its path and its line, e.g.::

    config error: prometheus.yml:7: scrape_configs[0]: unknown field "scrape_intervall" (did you mean "scrape_interval"?; known: ...)

Each section's known-field table lives next to the code that reads the section (``GLOBAL_FIELDS`` and
``SCRAPE_CONFIG_FIELDS`` in ingest/scrape/config.py, ``CONFIG_FIELDS`` in ingest/pipeline.py and
scheduler_metrics/kedgeflow/service.py, ...); sections that already have a strict parser of their own
(planner, congestion, limits, auth) are checked by calling it. Only ``web``, ``storage`` and
``self_scrape``, read in this package, are described here. ``TOP_LEVEL_FIELDS`` lists the sections.

A table is plain data, so the stages need not import this module:

- ``"str"`` (any scalar), ``"int"``, ``"number"``, ``"bool"`` (a real YAML boolean: ``"false"`` or
  ``maybe`` are refused), ``"duration"`` (Prometheus duration or seconds), ``"size"`` (``512MB``, bytes),
  ``"any"``;
- ``"=literal"``: exactly that value;
- a dict: a mapping with exactly these keys (``"*"``: any key, each value of that spec);
- a one-element list: a list whose items have that spec;
- a tuple: any one of the alternatives;
- a callable: the section's own validator (raises ValueError naming the problem).
"""
from __future__ import annotations

import difflib
import errno
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from storage.options import StorageOptions
from turboprom.cluster.settings import ClusterSettings

if TYPE_CHECKING:
    from ingest.http_client_config import HTTPClientConfig
    from turboprom.cluster.backend_clients import BackendClients

DEFAULT_PORT = 9090


class ConfigError(ValueError):
    """A configuration problem; ``str()`` is the one-line message shown to the operator."""


@dataclass
class ServerConfig:
    data_dir: str = "./data"
    listen: str = "127.0.0.1:9090"
    config_file: str | None = None
    storage: StorageOptions = field(default_factory=StorageOptions)
    # Raw YAML (scrape_configs, rule_files, global, ...); sections are interpreted by their stage.
    raw: dict[str, Any] = field(default_factory=dict)
    lookback_delta_ms: int = 300_000
    query_timeout_s: float = 120.0
    query_max_samples: int = 50_000_000
    query_max_depth: int = 256  # deepest expression tree accepted (promql/query_guard.py); 0 = no limit
    query_max_memory_bytes: int = 2 * 1024**3  # per-query memory estimate budget; 0 = no limit
    max_body_bytes: int = 32 * 1024 * 1024
    self_scrape_interval_s: float = 15.0
    web_config_file: str | None = None  # auth + TLS (turboprom.auth)
    insecure: bool = False  # allow a non-loopback listen address without auth
    enable_lifecycle: bool = False  # POST/PUT /-/reload (--web.enable-lifecycle, as Prometheus)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)  # --role, --cluster.* (docs/cluster.md)
    # Alerting (planner/rules.py, turboprom/alert_notifier.py): Prometheus's --rules.alert.* flags.
    alert_resend_delay_s: float = 60.0
    alert_for_outage_tolerance_s: float = 3600.0
    alert_for_grace_period_s: float = 600.0
    external_url: str = ""  # --web.external-url; empty: http://<listen>
    notification_queue_capacity: int = 10_000

    @property
    def config_dir(self) -> str | None:
        """The config file's folder: relative paths in the config (rule files, secrets) start there."""
        return str(Path(self.config_file).parent) if self.config_file else None

    @property
    def host(self) -> str:
        return split_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return split_listen(self.listen)[1]

    def load_file(self) -> None:
        if not self.config_file:
            return
        self.raw = load_config_file(self.config_file)


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT``, ``:PORT`` (loopback) or a bare ``HOST`` (port 9090)."""
    text = listen.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ConfigError(f"invalid listen address {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9090 or [::1]:9090")
        port_text = rest[1:] if rest else str(DEFAULT_PORT)
    elif text.count(":") > 1:  # a bare IPv6 address
        host, port_text = text, str(DEFAULT_PORT)
    elif ":" in text:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, str(DEFAULT_PORT)
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"invalid listen address {listen!r}: port must be a number from 0 to 65535, e.g. 127.0.0.1:9090")
    return host or "127.0.0.1", int(port_text)


def listen_error(listen: str, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"cannot listen on {listen}: address already in use (another process holds the port; stop it or choose another with --listen HOST:PORT)"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {listen}: the address is not on this machine (--listen)"
    if e.errno == errno.EACCES:
        return f"cannot listen on {listen}: permission denied (ports below 1024 need privileges; choose another with --listen)"
    if isinstance(e, socket.gaierror):
        return f"cannot listen on {listen}: host not found ({e.strerror})"
    return f"cannot listen on {listen}: {e.strerror or e}"


# --------------------------------------------------------------------------------------------- tables
# `web:` in the server YAML. Timeouts are read by turboprom/http_guard.py, enable_admin_api by
# turboprom/routes/status_api.py, enable_lifecycle by turboprom/routes/health.py (/-/reload).
WEB_FIELDS: dict[str, Any] = {
    "read_header_timeout": "duration", "read_body_timeout": "duration", "idle_timeout": "duration",
    "enable_admin_api": "bool", "enable_lifecycle": "bool",
}
# `storage:` (turboprom/wiring.py): Prometheus's storage.exemplars.max_exemplars.
STORAGE_FIELDS: dict[str, Any] = {"exemplars": {"max_exemplars": "int"}}
# `self_scrape: true` or `self_scrape: {scrape_interval: 5s}` (ingest/scrape/manager.py).
SELF_SCRAPE = ("bool", {"scrape_interval": "duration"})


def top_level_fields() -> dict[str, Any]:
    from ingest.otlp_config import OtlpSettings
    from ingest.pipeline import CONFIG_FIELDS as INGEST_FIELDS
    from ingest.scrape.config import GLOBAL_FIELDS, SCRAPE_CONFIG_FIELDS
    from planner.planner import PlannerConfig
    from scheduler_metrics.congestion.config import CongestionConfig
    from scheduler_metrics.kedgeflow.service import CONFIG_FIELDS as KEDGEFLOW_FIELDS
    from scheduler_metrics.kedgeflow.service import LEDGER_ETCD_FIELDS
    from turboprom.alert_notifier import ALERTING_FIELDS
    from turboprom.auth import AuthLimits
    from turboprom.cluster.backend_clients import ETCD_FIELDS
    from turboprom.limits import Limits

    return {
        # external_labels: read by the rule manager ($externalLabels) and the alert notifier.
        "global": {**GLOBAL_FIELDS, "external_labels": {"*": "str"}},
        "scrape_configs": [SCRAPE_CONFIG_FIELDS],
        "rule_files": ["str"],
        "alerting": ALERTING_FIELDS,
        "self_scrape": SELF_SCRAPE,
        "web": WEB_FIELDS,
        "storage": STORAGE_FIELDS,
        "ingest": INGEST_FIELDS,
        "otlp": OtlpSettings.from_config,
        # the ledger on etcd takes the cluster's etcd client settings (username, password_file, tls_config)
        "kedgeflow": {**KEDGEFLOW_FIELDS, "ledger": ("=embedded", {"etcd": {**LEDGER_ETCD_FIELDS, **ETCD_FIELDS}})},
        "planner": PlannerConfig.from_raw,
        "congestion": CongestionConfig.from_mapping,
        "limits": Limits.from_config,
        "auth": AuthLimits.from_config,
    }


# ------------------------------------------------------------------------------------------- checking
class _Problem(Exception):
    def __init__(self, path: str, message: str, key_path: str | None = None):
        super().__init__(message)
        self.path, self.message, self.key_path = path, message, key_path if key_path is not None else path


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _describe(spec: Any) -> str:
    if isinstance(spec, str):
        if spec.startswith("="):
            return repr(spec[1:])
        return {"str": "a string", "int": "an integer", "number": "a number", "bool": "true or false",
                "duration": "a duration such as 15s or 1m", "size": "a size such as 512MB", "any": "a value"}[spec]
    if isinstance(spec, dict):
        return "a mapping"
    if isinstance(spec, list):
        return "a list"
    if isinstance(spec, tuple):
        return " or ".join(_describe(s) for s in spec)
    return "a valid value"


def _scalar_ok(spec: str, v: Any) -> bool:
    from ingest.scrape.config import parse_size
    from turboprom.durations import parse_duration_ms

    if spec == "any":
        return True
    if spec.startswith("="):
        return not isinstance(v, bool) and str(v) == spec[1:]
    if spec == "str":
        return isinstance(v, (str, int, float, bool))
    if spec == "bool":
        return isinstance(v, bool)
    if spec == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if spec == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if spec == "duration":
        if isinstance(v, bool):
            return False
        if isinstance(v, (int, float)):
            return v >= 0
        try:
            parse_duration_ms(str(v))
        except ValueError:
            return False
        return True
    if spec == "size":
        if isinstance(v, bool):
            return False
        try:
            parse_size(v)
        except ValueError:
            return False
        return True
    raise AssertionError(f"unknown spec {spec!r}")


def _matches(spec: Any, v: Any) -> bool:
    """Whether ``v`` has the shape of ``spec`` (used to pick a tuple alternative)."""
    if isinstance(spec, str):
        return _scalar_ok(spec, v)
    if isinstance(spec, dict):
        return isinstance(v, dict)
    if isinstance(spec, list):
        return isinstance(v, list)
    return True


def _fmt_value(v: Any) -> str:
    text = repr(v) if isinstance(v, str) else yaml.safe_dump(v, default_flow_style=True).strip().removesuffix("...").strip()
    return text if len(text) <= 80 else text[:77] + "..."


def check(spec: Any, v: Any, path: str) -> None:
    """Raise ``_Problem`` for the first unknown field or mistyped value under ``path``."""
    if v is None:
        return  # an empty YAML value: the default
    if isinstance(spec, str):
        if not _scalar_ok(spec, v):
            raise _Problem(path, f"{path or 'top level'}: must be {_describe(spec)}, got {_fmt_value(v)}")
        return
    if isinstance(spec, tuple):
        for alt in spec:
            if _matches(alt, v):
                check(alt, v, path)
                return
        raise _Problem(path, f"{path or 'top level'}: must be {_describe(spec)}, got {_fmt_value(v)}")
    if isinstance(spec, list):
        if not isinstance(v, list):
            raise _Problem(path, f"{path or 'top level'}: must be a list, got {_fmt_value(v)}")
        for i, item in enumerate(v):
            check(spec[0], item, f"{path}[{i}]")
        return
    if isinstance(spec, dict):
        if not isinstance(v, dict):
            raise _Problem(path, f"{path or 'top level'}: must be a mapping of settings, got {_fmt_value(v)}")
        for key, val in v.items():
            sub = spec.get(str(key), spec.get("*"))
            if sub is None:
                known = sorted(k for k in spec if k != "*")
                hint = difflib.get_close_matches(str(key), known, n=1)
                where = path if path else "top level"
                raise _Problem(path, f'{where}: unknown field "{key}"'
                               + (f' (did you mean "{hint[0]}"?)' if hint else "")
                               + f" (known: {', '.join(known)})", _join(path, key))
            check(sub, val, _join(path, key))
        return
    if callable(spec):
        try:
            spec(v)
        except (ValueError, TypeError, AttributeError, KeyError) as e:
            msg = str(e) or type(e).__name__
            raise _Problem(path, msg if msg.startswith(path) else f"{path}: {msg}") from None
        return
    raise AssertionError(f"bad spec {spec!r}")


def _key_lines(node: Any, path: str, out: dict[str, int]) -> None:
    """Line (1-based) of every key and list item, by its path (``scrape_configs[0].job_name``)."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            p = _join(path, k.value)
            out.setdefault(p, k.start_mark.line + 1)
            _key_lines(v, p, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            p = f"{path}[{i}]"
            out.setdefault(p, v.start_mark.line + 1)
            _key_lines(v, p, out)


def _line_of(lines: dict[str, int], path: str) -> int | None:
    while path:
        if path in lines:
            return lines[path]
        path = re.sub(r"(\.[^.\[]*|\[\d+\])$", "", path) if re.search(r"(\.[^.\[]*|\[\d+\])$", path) else ""
    return None


def parse_yaml(text: str, name: str) -> tuple[Any, dict[str, int]]:
    """YAML document and the line of each key; ConfigError with line:column on a syntax error."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else name
        problem = getattr(e, "problem", None) or str(e)
        ctx = getattr(e, "context", None)
        raise ConfigError(f"{where}: invalid YAML: {problem}" + (f" ({ctx})" if ctx else "")) from None
    lines: dict[str, int] = {}
    if node is not None:
        _key_lines(node, "", lines)
    return data, lines


def read_text(path: str, what: str = "config file") -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory, not a file") from None
    except PermissionError:
        raise ConfigError(f"{what} {path} cannot be read: permission denied") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read: {e.strerror or e}") from None


def validate(raw: Any, name: str = "config", lines: dict[str, int] | None = None, base_dir: str | None = None) -> dict[str, Any]:
    """Check a server config document; returns it (``{}`` for an empty file). Raises ConfigError."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{name}: the top level must be a mapping of sections (global, scrape_configs, ...)")
    lines = lines or {}

    def fail(p: _Problem) -> ConfigError:
        key_path = p.key_path
        if key_path == p.path:  # a section's own validator: the line of the first of its fields it names
            words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", re.split(r"\(known|\(allowed|, not \[", p.message)[0]))
            named = [k for k in lines if k.startswith(p.path + ".") and re.split(r"[.\[]", k[len(p.path) + 1:])[0] in words]
            if named:
                key_path = min(named, key=lambda k: lines[k])
        line = _line_of(lines, key_path)
        return ConfigError(f"{name}:{line}: {p.message}" if line else f"{name}: {p.message}")

    try:
        check(top_level_fields(), raw, "")
        # Whole-section checks the tables cannot express (timeout <= interval, duplicate job names, regexes).
        from ingest.scrape.config import ScrapeConfigError, parse_scrape_configs
        from turboprom.http_guard import Timeouts

        try:
            parse_scrape_configs(raw, base_dir)
        except (ScrapeConfigError, ValueError) as e:
            m = re.match(r"scrape_configs\[(\d+)\]", str(e))
            job = re.search(r"job (?:name )?'([^']*)'", str(e))
            idx = next((i for i, d in enumerate(raw.get("scrape_configs") or [])
                        if job and isinstance(d, dict) and str(d.get("job_name")) == job.group(1)), None)
            path = m.group(0) if m else (f"scrape_configs[{idx}]" if idx is not None else "scrape_configs")
            raise _Problem(path, str(e) if str(e).startswith("scrape_configs") else f"{path}: {e}") from None
        try:
            Timeouts.from_config(raw)
        except ValueError as e:
            raise _Problem("web", str(e)) from None
        from turboprom.alert_notifier import parse_alerting

        try:
            parse_alerting(raw.get("alerting"), base_dir)
        except ValueError as e:
            m = re.match(r"alerting(\.alertmanagers\[\d+\](\.[a-z_]+)?|\.[a-z_]+)?", str(e))
            raise _Problem(m.group(0) if m else "alerting", str(e)) from None
        from turboprom.cluster.backend_clients import ledger_etcd_client

        try:  # the ledger's etcd user and TLS (conflicts such as password and password_file, files)
            ledger_etcd_client(raw.get("kedgeflow"), base_dir)
        except ValueError as e:
            raise _Problem("kedgeflow.ledger.etcd", str(e)) from None
    except _Problem as p:
        raise fail(p) from None
    _check_rule_files(raw, base_dir)
    return raw


def _check_rule_files(raw: dict[str, Any], base_dir: str | None) -> None:
    from planner.rules import RuleFileError, check_rule_files

    try:
        check_rule_files(list(raw.get("rule_files") or []), base_dir)
    except RuleFileError as e:
        raise ConfigError(str(e)) from None


def load_config_file(path: str) -> dict[str, Any]:
    """Read and validate the server YAML; ConfigError names the file, line and field of a problem."""
    data, lines = parse_yaml(read_text(path), path)
    return validate(data, path, lines, str(Path(path).parent))


def _load_strict(path: str, fields: dict[str, Any], parse: Callable[[dict[str, Any], str], Any]) -> Any:
    """A YAML file of one settings shape, checked as strictly as the server YAML: ``parse(data, folder)``
    of the checked mapping; ConfigError naming file:line."""
    data, lines = parse_yaml(read_text(path), path)
    data = data or {}
    try:
        check(fields, data, "")
        return parse(data, str(Path(path).parent))
    except _Problem as p:
        line = _line_of(lines, p.key_path)
        raise ConfigError(f"{path}:{line}: {p.message}" if line else f"{path}: {p.message}") from None
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None


def load_client_config(path: str) -> HTTPClientConfig:
    """A file of Prometheus's HTTP client settings alone (``--cluster.internal-client-config``):
    basic_auth, authorization, tls_config, ... checked as strictly as the server YAML."""
    from ingest.http_client_config import HTTP_CLIENT_FIELDS, HTTPClientConfig

    return _load_strict(path, HTTP_CLIENT_FIELDS, lambda d, folder: HTTPClientConfig.parse(d, "client config", folder))


def load_backends_config(path: str) -> BackendClients:
    """``--cluster.backends-config``: how the roles reach NATS and etcd (credentials, TLS), checked as
    strictly as the server YAML (turboprom/cluster/backend_clients.py)."""
    from turboprom.cluster.backend_clients import BACKENDS_FIELDS, BackendClients

    return _load_strict(path, BACKENDS_FIELDS, BackendClients.parse)


def check_config_file(path: str) -> list[str]:
    """``turboprom check config FILE``: the problems found (empty: the file is valid)."""
    try:
        load_config_file(path)
    except ConfigError as e:
        return [str(e)]
    return []

