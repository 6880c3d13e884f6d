"""`turboprom` command line."""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from turboprom.config import ServerConfig
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="turboprom", description="Prometheus-compatible metrics backend for LLM serving fleets")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the server with its embedded store")
    s.add_argument("--data-dir", default="./data")
    s.add_argument("--listen", default="127.0.0.1:9090", help="HOST:PORT (default 127.0.0.1:9090)")
    s.add_argument("--config", default=None, help="YAML config file (scrape_configs, rule_files, ...)")
    s.add_argument("--out-of-order-window", type=_duration, default=0, help="accept out-of-order samples this old (e.g. 10m); default 0 = reject")
    s.add_argument("--retention-time", type=_duration, default=None, help="drop blocks older than this, measured from the newest sample (default 15d)")
    s.add_argument("--retention-size", type=_size, default=0, help="maximum bytes of blocks (e.g. 10GB); 0 = unlimited")
    s.add_argument("--wal-fsync", choices=["always", "batch", "never"], default="always")
    s.add_argument("--log-level", default="info")

    q = sub.add_parser("sql", help="run SQL against the DuckDB catalog and blocks")
    q.add_argument("query")
    q.add_argument("--data-dir", default="./data")
    au = sub.add_parser("audit", help="KedgeFlow audit log tools")
    ausub = au.add_subparsers(dest="audit_command", required=True)
    av = ausub.add_parser("verify", help="recompute the hash chain and check every signed head")
    av.add_argument("--data-dir", default="./data")
    av.add_argument("--public-key", default=None, help="PEM public key to verify heads with (default: the data dir's signing key)")
    ak = ausub.add_parser("export-key", help="print the audit signing public key (PEM), to keep outside the data dir")
    ak.add_argument("--data-dir", default="./data")
    return p


def _audit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cryptography.hazmat.primitives import serialization

    from scheduler_metrics.kedgeflow.audit import verify
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
    rep = verify(base / "audit", pub)  # type: ignore[arg-type]
    print(f"audit log: {rep.entries} entries, {rep.heads} signed heads")
    for p in rep.problems:
        print(f"PROBLEM: {p}")
    print("OK: no tampering detected" if rep.ok else f"FAILED: {len(rep.problems)} problem(s)")
    return 0 if rep.ok else 1


def _config_from_args(a: argparse.Namespace) -> ServerConfig:
    cfg = ServerConfig(data_dir=a.data_dir, listen=a.listen, config_file=a.config)
    cfg.storage.out_of_order_window_ms = a.out_of_order_window
    if a.retention_time is not None:
        cfg.storage.retention_ms = a.retention_time
    cfg.storage.retention_bytes = a.retention_size
    cfg.storage.wal_fsync = a.wal_fsync
    cfg.load_file()
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from turboprom.server import serve

        asyncio.run(serve(_config_from_args(args)))
        return 0
    if args.command == "audit":
        return _audit(args)
    if args.command == "sql":
        from storage.catalog import run_sql

        print(run_sql(args.data_dir, args.query))
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
