"""`turboprom` command line."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from turboprom.config import ServerConfig, listen_error, split_listen
from turboprom.durations import parse_duration_ms


def _duration(text: str) -> int:
    try:
        return parse_duration_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _size(text: str) -> int:
    units = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
    t = text.strip().upper()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[: -len(u)]) * units[u])
    return int(t)


def _add_cluster_flags(s: argparse.ArgumentParser) -> None:
    """``--role`` and ``--cluster.*`` (docs/cluster.md); the default role ``all`` is the embedded single node."""
    from turboprom.cluster.settings import DEFAULT_PARTITIONS, DEFAULT_REPLICATION_FACTOR, ROLES

    def urls(text: str) -> list[str]:
        return [u.strip() for u in text.split(",") if u.strip()]

    g = s.add_argument_group("cluster (docs/cluster.md)")
    g.add_argument("--role", choices=ROLES, default="all", help="all = the embedded single node (default); or one cluster role")
    g.add_argument("--cluster.name", dest="cluster_name", default="turboprom", help="cluster name (stream, subjects and etcd keys)")
    g.add_argument("--cluster.nats-urls", dest="cluster_nats_urls", type=urls, default=["nats://127.0.0.1:4222"],
                   help="comma list of NATS servers (JetStream)")
    g.add_argument("--cluster.etcd-endpoints", dest="cluster_etcd_endpoints", type=urls, default=["http://127.0.0.1:2379"],
                   help="comma list of etcd client URLs")
    g.add_argument("--cluster.partitions", dest="cluster_partitions", type=int, default=DEFAULT_PARTITIONS,
                   help=f"virtual partitions (fixed for the life of the stream; default {DEFAULT_PARTITIONS})")
    g.add_argument("--cluster.replication-factor", dest="cluster_rf", type=int, default=DEFAULT_REPLICATION_FACTOR,
                   help=f"ingesters consuming each partition (default {DEFAULT_REPLICATION_FACTOR})")
    g.add_argument("--cluster.stream-replicas", dest="cluster_stream_replicas", type=int, default=3,
                   help="JetStream replicas of the ingest stream (default 3)")
    g.add_argument("--cluster.node-id", dest="cluster_node_id", default="", help="ingester identity (default: from the advertised URL)")
    g.add_argument("--cluster.advertise-url", dest="cluster_advertise_url", default="",
                   help="URL queriers use to reach this ingester (default http://<listen>)")
    g.add_argument("--cluster.publish-timeout", dest="cluster_publish_timeout", type=_duration, default=5000,
                   help="a write JetStream has not acknowledged by then is answered 503 (default 5s)")
    g.add_argument("--cluster.internal-client-config", dest="cluster_internal_client_config", default=None,
                   help="YAML of Prometheus HTTP client settings (basic_auth, authorization, tls_config) a querier uses "
                        "to call the ingesters, when they run with --web.config.file")
    g.add_argument("--cluster.backends-config", dest="cluster_backends_config", default=None,
                   help="YAML of how the roles reach NATS and etcd when those require credentials or TLS "
                        "(nats: user/password, token, nkey_seed_file, tls_config; etcd: username/password, tls_config)")
    g.add_argument("--cluster.pushdown", dest="cluster_pushdown", choices=["true", "false"], default="true",
                   help="a querier computes mergeable aggregations from the ingesters' partial states (default true)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turboprom", description="Prometheus-compatible metrics backend for LLM serving fleets")
    p.add_argument("--debug", action="store_true", help="show a traceback when a command fails")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the server with its embedded store")
    s.add_argument("--data-dir", default="./data")
    s.add_argument("--listen", default="127.0.0.1:9090", help="HOST:PORT (default 127.0.0.1:9090)")
    s.add_argument("--config", default=None, help="YAML config file (scrape_configs, rule_files, ...)")
    s.add_argument("--out-of-order-window", type=_duration, default=0, help="accept out-of-order samples this old (e.g. 10m); default 0 = reject")
    s.add_argument("--retention-time", type=_duration, default=None, help="drop blocks older than this, measured from the newest sample (default 15d)")
    s.add_argument("--retention-size", type=_size, default=0, help="maximum bytes of blocks (e.g. 10GB); 0 = unlimited")
    s.add_argument("--wal-fsync", choices=["always", "batch", "never"], default="always")
    s.add_argument("--web.config.file", dest="web_config_file", default=None,
                   help="auth and TLS config (basic_auth_users, bearer_tokens, roles, tenants, tls_server_config)")
    s.add_argument("--insecure", action="store_true", help="allow listening beyond loopback without auth (logged loudly)")
    s.add_argument("--query.timeout", dest="query_timeout", type=_duration, default=120_000,
                   help="maximum time a query may take before it is aborted (default 2m), like Prometheus's flag")
    s.add_argument("--query.max-samples", dest="query_max_samples", type=int, default=50_000_000,
                   help="maximum samples a single query may hold in memory (default 50000000), like Prometheus's flag")
    s.add_argument("--query.max-depth", dest="query_max_depth", type=int, default=256,
                   help="deepest PromQL expression tree accepted (nesting, operator chains, subqueries; default 256; 0 = no limit)")
    s.add_argument("--query.max-memory", dest="query_max_memory", type=_size, default=2 * 1024**3,
                   help="estimated memory one query may hold at once (e.g. 2GB; default 2GiB; 0 = no limit)")
    s.add_argument("--query.lookback-delta", dest="query_lookback_delta", type=_duration, default=300_000,
                   help="how far back an instant vector selector looks for a sample (default 5m), like Prometheus's flag")
    s.add_argument("--web.enable-admin-api", dest="enable_admin_api", action="store_true",
                   help="enable /api/v1/admin/* (delete_series, clean_tombstones), like Prometheus's flag")
    s.add_argument("--web.enable-lifecycle", dest="enable_lifecycle", action="store_true",
                   help="enable POST/PUT /-/reload (re-read the config and rule files), like Prometheus's flag")
    s.add_argument("--rules.alert.resend-delay", dest="alert_resend_delay", type=_duration, default=60_000,
                   help="minimum wait before resending a firing alert to Alertmanager (default 1m), like Prometheus's flag")
    s.add_argument("--rules.alert.for-outage-tolerance", dest="alert_for_outage_tolerance", type=_duration, default=3_600_000,
                   help="max downtime for which an alert's 'for' state is restored after a restart (default 1h)")
    s.add_argument("--rules.alert.for-grace-period", dest="alert_for_grace_period", type=_duration, default=600_000,
                   help="minimum time between a restart and a restored alert firing (default 10m)")
    s.add_argument("--web.external-url", dest="external_url", default="",
                   help="URL under which this server is reached (alert generatorURL, $externalURL); default http://LISTEN")
    s.add_argument("--alertmanager.notification-queue-capacity", dest="notification_queue_capacity", type=int,
                   default=10_000, help="alerts queued for Alertmanager before the oldest are dropped (default 10000)")
    s.add_argument("--log-level", default="info", type=str.lower, choices=["debug", "info", "warning", "error"])
    s.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show a traceback when start-up fails")
    _add_cluster_flags(s)

    ck = sub.add_parser("check", help="check a config or rule file without starting (like promtool check)")
    cksub = ck.add_subparsers(dest="check_command", required=True)
    ckc = cksub.add_parser("config", help="check server config files (and the rule files they name)")
    ckc.add_argument("files", nargs="+", metavar="FILE")
    ckr = cksub.add_parser("rules", help="check rule files")
    ckr.add_argument("files", nargs="+", metavar="FILE")
    ckd = cksub.add_parser("data", help="read every block of a stopped server's data dir and report damaged ones",
                           description="Opens and reads each block whole, checking it against its meta.json and series "
                                       "index. Exit 1 when a block is damaged (and not repaired). --repair moves damaged "
                                       "blocks to DIR/quarantine/ (never deletes them).")
    ckd.add_argument("data_dir", metavar="DIR")
    ckd.add_argument("--repair", action="store_true", help="move damaged blocks out of blocks/ into quarantine/")

    im = sub.add_parser("import", help="write history (OpenMetrics/Prometheus text with timestamps, or CSV) into blocks",
                        description="Backfill, like promtool tsdb create-blocks-from openmetrics: the samples are written "
                                    "straight into aligned blocks, into a stopped server's --data-dir or through a running "
                                    "server (--url, needs --web.enable-admin-api). Samples older than the retention window, "
                                    "or inside the live head's range, are refused and nothing is written.")
    im.add_argument("file", metavar="FILE", help="OpenMetrics (ends with '# EOF', timestamps in seconds), Prometheus text "
                                                 "(timestamps in ms) or .csv with a header: __name__, labels..., timestamp, value")
    im.add_argument("--data-dir", default="./data", help="data dir of a stopped server (default ./data)")
    im.add_argument("--url", default=None, help="import through this running server instead (POST /api/v1/admin/tsdb/import)")
    im.add_argument("--format", choices=["auto", "openmetrics", "prometheus", "csv"], default="auto",
                    help="default auto: .csv is CSV, a file ending with '# EOF' OpenMetrics, else Prometheus text")
    im.add_argument("--retention-time", type=_duration, default=15 * 86_400_000,
                    help="with --data-dir: the server's --retention-time (default 15d); older samples are refused")
    im.add_argument("--tenant", default="default", help="tenant the series belong to (default: the default tenant)")

    q = sub.add_parser("sql", help="run SQL against the DuckDB catalog and blocks")
    q.add_argument("query")
    q.add_argument("--data-dir", default="./data")
    rp = sub.add_parser("replay", help="replay an LLM serving trace through the bundled schedulers (simulator)")
    rp.add_argument("--trace", required=True, help="Mooncake .jsonl or Azure .csv trace, or a generated agent trace: agent[:sessions=600,seed=1,...]")
    rp.add_argument("--instances", type=int, default=32)
    rp.add_argument("--scheduler", default="vesta,smetric", help="comma list: vesta, vesta-noprice, smetric, smetric:SECONDS (overload threshold), round-robin, least-queue, prefix-affinity, llm-d, dynamo")
    rp.add_argument("--load", default="0.5,0.7,0.9", help="comma list of offered prefill utilizations")
    rp.add_argument("--disaggregated", default=None, metavar="PxD", help="prefill/decode split, e.g. 24x8 (overrides --instances)")
    rp.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    rp.add_argument("--signals", choices=["tracker", "oracle"], default="tracker", help="where schedulers read backlog/price (default: TurboProm's congestion tracker, in process)")
    rp.add_argument("--gpus-per-nic", type=int, default=None, help="GPUs of a node sharing one NIC (default 8: one 200 Gb/s NIC per node; 1: one per GPU)")
    rp.add_argument("--live", default=None, metavar="URL", help="live mode: push worker metrics to this TurboProm and poll its congestion API")
    rp.add_argument("--speed", type=float, default=20.0, help="live mode: simulated seconds per wall second")
    rp.add_argument("--out", default=None, help="write DIR/results.csv and DIR/ttft_vs_load.png")

    cr = sub.add_parser("cost-report", help="what each recurring query costs raw vs from summaries, incl. ingest-side cost")
    cr.add_argument("--since", default="24h", help="look-back window (Prometheus duration, default 24h)")
    cr.add_argument("--format", choices=["text", "json", "csv", "html"], default="text")
    cr.add_argument("--out", default=None, help="write to FILE instead of stdout")
    cr.add_argument("--url", default="http://127.0.0.1:9090", help="running TurboProm server")
    cr.add_argument("--tenant", default=None)

    au = sub.add_parser("audit", help="KedgeFlow audit log tools")
    ausub = au.add_subparsers(dest="audit_command", required=True)
    av = ausub.add_parser("verify", help="recompute the hash chain and check every signed head")
    av.add_argument("--data-dir", default="./data")
    av.add_argument("--public-key", default=None, help="PEM public key to verify heads with (default: the data dir's signing key)")
    av.add_argument("--head-every", type=int, default=64, help="the server's head-signing interval (kedgeflow.audit_head_every)")
    av.add_argument("--limit", type=int, default=100, help="list the last N entries (0: all, -1: none)")
    ak = ausub.add_parser("export-key", help="print the audit signing public key (PEM), to keep outside the data dir")
    ak.add_argument("--data-dir", default="./data")
    from planner.cli import add_parser as add_plan_parser  # H: `turboprom plan list|show|explain`

    add_plan_parser(sub)
    return p


def _cost_report(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    from turboprom.cost_report import render

    params = {"since": args.since, "format": "json"}
    url = args.url.rstrip("/") + "/api/v1/cost_report?" + urllib.parse.urlencode(params)
    sys.stderr.write(f"building cost report from {args.url} (since {args.since})...\n")
    headers = {"X-Scope-OrgID": args.tenant} if args.tenant else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=300) as r:
            rep = json.loads(r.read())["data"]
    except urllib.error.HTTPError as e:
        print(f"cost report failed: {e.code} {e.read().decode(errors='replace')}", file=sys.stderr)
        return 1
    except urllib.error.URLError as e:
        print(f"cannot reach TurboProm at {args.url}: {e.reason}", file=sys.stderr)
        return 1
    text = render(rep, args.format)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        sys.stderr.write(f"wrote {args.out}\n")
    else:
        sys.stdout.write(text)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from pathlib import Path

    from scheduler_metrics.sim.replay import SCHEDULERS, main_replay, scheduler_known

    dis = None
    if args.disaggregated:
        p, _, d = args.disaggregated.lower().partition("x")
        if not (p.isdigit() and d.isdigit() and int(p) > 0 and int(d) > 0):
            raise CliError(f"replay: --disaggregated {args.disaggregated!r}: expected PxD with positive counts, e.g. 24x8")
        dis = (int(p), int(d))
    scheds = [s.strip() for s in args.scheduler.split(",") if s.strip()]
    unknown = [s for s in scheds if not scheduler_known(s)]
    if unknown or not scheds:
        raise CliError(f"replay: unknown scheduler {', '.join(map(repr, unknown)) or repr(args.scheduler)} "
                       f"(known: {', '.join(SCHEDULERS)}, smetric:SECONDS)")
    try:
        loads = [float(x) for x in args.load.split(",") if x.strip()]
    except ValueError:
        raise CliError(f"replay: --load {args.load!r}: expected a comma list of utilizations, e.g. 0.5,0.7,0.9") from None
    if not loads or any(not 0 < x for x in loads):
        raise CliError(f"replay: --load {args.load!r}: utilizations must be positive, e.g. 0.5,0.7,0.9")
    trace = Path(args.trace)
    if args.trace == "agent" or args.trace.startswith("agent:"):
        from scheduler_metrics.sim.agent_trace import parse_spec

        try:
            parse_spec(args.trace)
        except ValueError as e:
            raise CliError(f"replay: {e}") from None
    elif not trace.is_file():
        raise CliError(f"replay: trace file {args.trace} not found" if not trace.exists()
                       else f"replay: trace {args.trace} is not a file")
    elif trace.suffix not in (".jsonl", ".csv"):
        raise CliError(f"replay: trace {args.trace}: expected a Mooncake .jsonl or an Azure .csv trace")
    if args.live:
        from scheduler_metrics.sim.live import main_live

        main_live(args.trace, args.live, args.instances, scheds, loads, args.out, limit=args.limit, speed=args.speed)
        return 0
    if args.gpus_per_nic is not None and not 1 <= args.gpus_per_nic <= 8:
        raise CliError(f"replay: --gpus-per-nic {args.gpus_per_nic}: expected 1..8")
    main_replay(args.trace, args.instances, scheds, loads, args.out, disaggregated=dis, limit=args.limit, signals=args.signals,
                gpus_per_nic=args.gpus_per_nic)
    return 0


def _audit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cryptography.hazmat.primitives import serialization

    from scheduler_metrics.kedgeflow.audit import entry_summary, iter_entries, verify
    from scheduler_metrics.kedgeflow.grant import load_or_create_key

    base = Path(args.data_dir) / "kedgeflow"
    key_path = base / "signing-key.pem"
    if args.audit_command == "export-key":
        pub = load_or_create_key(key_path).public_key()
        print(pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode(), end="")
        return 0
    if args.public_key:
        pub = serialization.load_pem_public_key(Path(args.public_key).read_bytes())
    elif key_path.exists():
        pub = load_or_create_key(key_path).public_key()
    else:
        print(f"no audit signing key at {key_path}", file=sys.stderr)
        return 2
    rep = verify(base / "audit", pub, args.head_every)  # type: ignore[arg-type]
    print(f"audit log: {rep.entries} entries, {rep.heads} signed heads")
    if args.limit >= 0:
        entries = list(iter_entries(base / "audit" / "audit.jsonl"))
        shown = entries[-args.limit:] if args.limit else entries
        if len(shown) < len(entries):
            print(f"  ({len(entries) - len(shown)} earlier entries not listed; --limit 0 lists all)")
        for e in shown:
            print(entry_summary(e))
    for p in rep.problems:
        print(f"PROBLEM: {p}")
    print("OK: no tampering detected" if rep.ok else f"FAILED: {len(rep.problems)} problem(s)")
    return 0 if rep.ok else 1


class CliError(Exception):
    """A failure the operator can act on: printed as one line, exit code 1."""


def _normalized_listen(listen: str) -> str:
    host, port = split_listen(listen)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_data_dir(path: str) -> None:
    import os
    import tempfile
    from pathlib import Path

    p = Path(path)
    if p.exists() and not p.is_dir():
        raise CliError(f"data dir {path} is a file, not a directory: pass --data-dir with a directory (it is created if missing)")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except PermissionError:
        raise CliError(f"cannot create data dir {path}: permission denied (choose another --data-dir)") from None
    except (FileExistsError, NotADirectoryError):
        raise CliError(f"cannot create data dir {path}: a parent of it is a file, not a directory") from None
    except OSError as e:
        raise CliError(f"cannot create data dir {path}: {e.strerror or e}") from None
    try:
        fd, probe = tempfile.mkstemp(dir=p, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise CliError(f"data dir {path} is not writable: {e.strerror or e} (fix its permissions or choose another --data-dir)") from None


def _check_port_free(host: str, port: int, listen: str) -> None:
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise CliError(listen_error(listen, e)) from None
    family, typ, proto, _, addr = infos[0]
    with socket.socket(family, typ, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            raise CliError(listen_error(listen, e)) from None


def _config_from_args(a: argparse.Namespace) -> ServerConfig:
    cfg = ServerConfig(data_dir=a.data_dir, listen=_normalized_listen(a.listen), config_file=a.config)
    cfg.storage.out_of_order_window_ms = a.out_of_order_window
    if a.retention_time is not None:
        cfg.storage.retention_ms = a.retention_time
    cfg.storage.retention_bytes = a.retention_size
    cfg.storage.wal_fsync = a.wal_fsync
    cfg.web_config_file = a.web_config_file
    cfg.insecure = a.insecure
    cfg.enable_admin_api = a.enable_admin_api
    cfg.enable_lifecycle = a.enable_lifecycle
    if a.query_timeout <= 0 or a.query_max_samples <= 0 or a.query_lookback_delta <= 0:
        raise SystemExit("turboprom: --query.timeout, --query.max-samples and --query.lookback-delta must be positive")
    cfg.query_timeout_s = a.query_timeout / 1000.0
    cfg.query_max_samples = a.query_max_samples
    if a.query_max_depth < 0 or a.query_max_memory < 0:
        raise SystemExit("turboprom: --query.max-depth and --query.max-memory must not be negative")
    cfg.query_max_depth = a.query_max_depth
    cfg.query_max_memory_bytes = a.query_max_memory
    cfg.lookback_delta_ms = a.query_lookback_delta
    c = cfg.cluster
    c.role, c.name, c.nats_urls, c.etcd_endpoints = a.role, a.cluster_name, a.cluster_nats_urls, a.cluster_etcd_endpoints
    c.partitions, c.replication_factor, c.stream_replicas = a.cluster_partitions, a.cluster_rf, a.cluster_stream_replicas
    c.node_id, c.advertise_url, c.publish_timeout_s = a.cluster_node_id, a.cluster_advertise_url, a.cluster_publish_timeout / 1000.0
    c.pushdown = a.cluster_pushdown == "true"
    try:
        c.validate()
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.cluster_internal_client_config:
        from turboprom.config import ConfigError, load_client_config

        try:
            c.internal_client = load_client_config(a.cluster_internal_client_config)
        except ConfigError as e:
            raise CliError(f"--cluster.internal-client-config: {e}") from None
    if a.cluster_backends_config:
        from turboprom.config import ConfigError, load_backends_config

        try:
            c.backends = load_backends_config(a.cluster_backends_config)
        except ConfigError as e:
            raise CliError(f"--cluster.backends-config: {e}") from None
    if a.notification_queue_capacity <= 0:
        raise CliError("--alertmanager.notification-queue-capacity must be positive")
    cfg.alert_resend_delay_s = a.alert_resend_delay / 1000.0
    cfg.alert_for_outage_tolerance_s = a.alert_for_outage_tolerance / 1000.0
    cfg.alert_for_grace_period_s = a.alert_for_grace_period / 1000.0
    cfg.external_url = a.external_url
    cfg.notification_queue_capacity = a.notification_queue_capacity
    cfg.load_file()
    return cfg


def _check_data(args: argparse.Namespace) -> int:
    """``check data DIR [--repair]``: one line per block problem, then a summary; exit 1 when a
    damaged block is left in place. Holds the data dir's lock (never under a running server)."""
    from pathlib import Path

    from storage.check import check_blocks, quarantine
    from turboprom.data_lock import DataDirLocked, lock_data_dir, unlock_data_dir

    if not Path(args.data_dir).is_dir():
        raise CliError(f"data dir {args.data_dir} does not exist or is not a directory")
    try:
        fd = lock_data_dir(args.data_dir)
    except DataDirLocked as e:
        raise CliError(f"{e}: stop it before checking its blocks") from None
    try:
        results = check_blocks(args.data_dir)
        bad = [r for r in results if r.problem is not None]
        for r in bad:
            print(f"  FAILED: block {r.name} {r.problem}")
            if args.repair:
                print(f"    moved to {quarantine(args.data_dir, r.name)}")
        ok_blocks = [r for r in results if r.problem is None]
        print(f"{len(results)} blocks checked: {len(ok_blocks)} sound ({sum(r.samples for r in ok_blocks)} samples), "
              f"{len(bad)} damaged" + (" (moved to quarantine/)" if bad and args.repair else ""))
        return 1 if bad and not args.repair else 0
    finally:
        unlock_data_dir(fd)


def _check(args: argparse.Namespace) -> int:
    """``check config|rules FILE...``: promtool's output shape; exit 1 when any file has a problem."""
    from pathlib import Path

    if args.check_command == "data":
        return _check_data(args)

    from planner.rules import RuleFileError, check_rule_files
    from turboprom.config import ConfigError, load_config_file

    failed = False
    for f in args.files:
        print(f"Checking {f}")
        try:
            if args.check_command == "config":
                raw = load_config_file(f)
                n = len(check_rule_files(list(raw.get("rule_files") or []), str(Path(f).parent)))
                print(f"  SUCCESS: {n} rule files found")
                print(f" SUCCESS: {f} is valid TurboProm config file syntax")
            else:
                if not Path(f).is_file():
                    raise RuleFileError(f"rule file {f} not found" if not Path(f).exists() else f"{f} is not a file")
                from planner.rules import load_rule_files

                groups = load_rule_files([str(Path(f).resolve())], None, 60.0)
                print(f"  SUCCESS: {sum(len(g.rules) for g in groups)} rules found")
        except (ConfigError, RuleFileError) as e:
            failed = True
            print("  FAILED:")
            for line in str(e).splitlines():
                print(f"    {line}")
        print()
    return 1 if failed else 0


def serve_preflight(data_dir: str, host: str, port: int, listen: str) -> None:
    """What a server checks before it starts (``turboprom serve`` and the demo): the data dir is a
    usable directory, the port is free, and no other process holds the data dir (the lock is kept
    until the process ends). Each failure is a ``CliError`` naming the cause and the fix."""
    _check_data_dir(data_dir)
    _check_port_free(host, port, listen)
    from turboprom.data_lock import DataDirLocked, lock_data_dir

    try:
        lock_data_dir(data_dir)
    except DataDirLocked as e:
        raise CliError(f"{e}: stop it, or choose another --data-dir") from None


def _serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = _config_from_args(args)
    serve_preflight(cfg.data_dir, cfg.host, cfg.port, cfg.listen)
    from turboprom.cluster.roles import serve_role
    from turboprom.server import StartupError

    try:
        asyncio.run(serve_role(cfg))
    except StartupError as e:
        raise CliError(str(e)) from None
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        return _serve(args)
    if args.command == "check":
        return _check(args)
    if args.command == "cost-report":
        return _cost_report(args)
    if args.command == "replay":
        return _replay(args)
    if args.command == "audit":
        return _audit(args)
    if args.command == "plan":
        from planner.cli import run as run_plan

        return run_plan(args)
    if args.command == "import":
        from turboprom.history_import import ImportRefused, run_cli

        try:
            return run_cli(args)
        except ImportRefused as e:
            raise CliError(str(e)) from None
    if args.command == "sql":
        from storage.catalog import run_sql

        print(run_sql(args.data_dir, args.query))
        return 0
    return 2


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= 500 else text[:497] + "..."


def _failure(e: BaseException, args: argparse.Namespace, debug: bool) -> str:
    """The one line printed for a failed command."""
    import json
    import urllib.error

    from turboprom.config import ConfigError

    if isinstance(e, ConfigError):
        return f"config error: {e}"
    if isinstance(e, CliError):
        return f"turboprom: {e}"
    url = getattr(args, "url", None)
    if isinstance(e, urllib.error.HTTPError):
        return f"turboprom: {url} answered {e.code} {e.reason}"
    if isinstance(e, (urllib.error.URLError, ConnectionError, TimeoutError)):
        reason = getattr(e, "reason", None) or e
        reason = getattr(reason, "strerror", None) or reason
        return f"turboprom: cannot reach {url or 'the server'}: {reason} (is the server running? set --url)"
    if isinstance(e, json.JSONDecodeError) and url:
        return f"turboprom: {url} did not answer with JSON (is it a TurboProm server?)"
    return f"turboprom {args.command}: {type(e).__name__}: {_one_line(e)}" + ("" if debug else " (run with --debug for a traceback)")


def main(argv: list[str] | None = None) -> int:
    import traceback

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # `plan explain --url URL 'QUERY'`: argparse binds the optional positional before the flags.
        if args.command == "plan" and getattr(args, "arg", None) is None and len(extra) == 1:
            args.arg = extra[0]
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = bool(getattr(args, "debug", False))
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - one line instead of a traceback; --debug shows it
        if debug:
            traceback.print_exception(e)
        print(" ".join(_failure(e, args, debug).split("\n")), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
