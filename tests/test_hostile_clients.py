"""Hostile clients against a real server with web-config auth: slow uploads, slowloris headers and
idle connections, audit-log growth by a read-only user, and a wrong-credential flood.

Each test runs its attack with small configured limits (a few seconds), bounded in count and time,
on loopback only, while a ResponsivenessMonitor polls /-/healthy and /api/v1/congestion.
"""
from __future__ import annotations

import base64
import json
import secrets
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
import pytest

from ingest.snappy_block import compress
from tests.helpers import ServerProcess
from tests.hostile_monitor import ResponsivenessMonitor
from tests.test_ingest_support import v1_payload

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 3.0
IDLE_TIMEOUT_S = 4.0
MAX_QUEUE = 4
SLACK_S = 2.5
RESPONSIVE_P99_S = 0.15

BASIC = {"alice": ("alice-pw", ["admin"]), "wally": ("wally-pw", ["write"]), "rita": ("rita-pw", ["read"]),
         **{f"user{i}": (f"user{i}-pw", ["read"]) for i in range(6)}}
BEARER = {"grafana": "grafana-token-0123456789", "sched": "scheduler-token-0123456789"}


def _auth(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{BASIC[user][0]}".encode()).decode()


def _bearer(user: str) -> str:
    return "Bearer " + BEARER[user]


def _start(tmp: Path, extra_yaml: str = "", rounds: int = 4, args: tuple[str, ...] = ()) -> ServerProcess:
    def h(pw: str) -> str:
        return bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=rounds)).decode()

    roles = {**{u: r for u, (_, r) in BASIC.items()}, "grafana": ["read"], "sched": ["read", "scheduler"]}
    web = {"basic_auth_users": {u: h(pw) for u, (pw, _) in BASIC.items()},
           "bearer_tokens": [{"user": u, "hash": h(t)} for u, t in BEARER.items()],
           "roles": roles}
    (tmp / "web.yml").write_text(json.dumps(web))  # JSON is YAML
    (tmp / "server.yml").write_text(
        f"web:\n  read_header_timeout: {HEADER_TIMEOUT_S:g}s\n  read_body_timeout: {BODY_TIMEOUT_S:g}s\n"
        f"  idle_timeout: {IDLE_TIMEOUT_S:g}s\n"
        f"ingest:\n  max_queue: {MAX_QUEUE}\n" + extra_yaml)
    return ServerProcess(tmp / "data", ["--web.config.file", str(tmp / "web.yml"), "--config", str(tmp / "server.yml"),
                                        *args]).start()


def _monitor(srv: ServerProcess) -> ResponsivenessMonitor:
    return ResponsivenessMonitor(srv.url, auth=("rita", BASIC["rita"][0]), timeout=3.0)


def _call(url: str, *, auth: str | None = None, data: bytes | None = None, headers: dict | None = None,
          timeout: float = 15.0) -> tuple[int, bytes, dict]:
    h = dict(headers or {})
    if auth:
        h["Authorization"] = auth
    req = urllib.request.Request(url, data=data, headers=h, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def _remote_write(url: str, name: str) -> int:
    body = compress(v1_payload([({"__name__": name, "job": "hostile"}, [(int(time.time() * 1000), 1.0)])]))
    return _call(url + "/api/v1/write", auth=_auth("wally"), data=body,
                 headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
                          "X-Prometheus-Remote-Write-Version": "0.1.0"})[0]


class _Conn:
    """A raw client connection that sends what it is told, as slowly as it is told, and notes when
    the server answered or closed."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.sock.settimeout(0.05)
        self.opened = time.monotonic()
        self.closed_at: float | None = None
        self.answer = b""

    def poll(self) -> bool:
        """True once the server closed (or answered and closed)."""
        if self.closed_at is not None:
            return True
        try:
            data = self.sock.recv(4096)
        except socket.timeout:
            return False
        except OSError:
            data = b""
        if data:
            self.answer += data
            return False
        self.closed_at = time.monotonic()
        return True

    def send(self, data: bytes) -> bool:
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            self.poll()
            if self.closed_at is None:
                self.closed_at = time.monotonic()
            return False

    def status(self) -> int | None:
        line = self.answer.split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) > 1 and line[1].isdigit() else None

    def close(self) -> None:
        self.sock.close()


def _trickle(conns: list[_Conn], payload_byte: bytes, interval: float, limit_s: float) -> None:
    """Send one byte per connection every `interval` until each is closed by the server or `limit_s` passes."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end and any(c.closed_at is None for c in conns):
        for c in conns:
            if c.closed_at is None and not c.poll():
                c.send(payload_byte)
        time.sleep(interval)
    for c in conns:
        c.poll()


def test_slow_uploads_are_cut_off_and_hold_no_ingest_slot(tmp_path: Path) -> None:
    srv = _start(tmp_path)
    try:
        assert _remote_write(srv.url, "warm_up") == 204  # wally's credential verified once
        head = (f"POST /api/v1/write HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {_auth('wally')}\r\n"
                "Content-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\nContent-Length: 100000\r\n\r\n").encode()
        with _monitor(srv) as mon:
            slow = [_Conn(srv.port) for _ in range(MAX_QUEUE * 2)]  # twice the ingest queue, all authenticated
            for c in slow:
                c.send(head)
            # The deadline holds on every route, not only ingest: a form query and a KedgeFlow proposal.
            for path, ctype in (("/api/v1/query", "application/x-www-form-urlencoded"),
                                ("/api/v1/kedgeflow/propose", "application/json")):
                c = _Conn(srv.port)
                c.send(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {_auth('rita')}\r\n"
                       f"Content-Type: {ctype}\r\nContent-Length: 5000\r\n\r\n".encode())
                slow.append(c)
            t = threading.Thread(target=_trickle, args=(slow, b"\x00", 0.25, BODY_TIMEOUT_S + 10), daemon=True)
            t.start()
            time.sleep(1.0)
            # While they upload at 4 bytes/s, legitimate writes are accepted.
            codes = [_remote_write(srv.url, f"during_slow_{i}") for i in range(5)]
            t.join(BODY_TIMEOUT_S + 15)
        print(f"\nslow uploads cut after {[round(c.closed_at - c.opened, 2) for c in slow if c.closed_at]} s, "
              f"status {[c.status() for c in slow]}; writes during them {codes}; {mon.report()}")
        assert codes == [204] * 5, codes
        for c in slow:
            assert c.closed_at is not None, "a slow upload was still being read well past the body timeout"
            took = c.closed_at - c.opened
            assert took <= BODY_TIMEOUT_S + SLACK_S, f"slow upload cut off only after {took:.1f}s"
            assert c.status() in (408, None), c.answer[:200]
            c.close()
        assert any(c.status() == 408 for c in slow), "the server should say 408 to a body that missed its deadline"
        mon.assert_responsive(RESPONSIVE_P99_S)
        # The queue is free again and nothing of the cut-off bodies was stored.
        assert _remote_write(srv.url, "after_slow") == 204
    finally:
        srv.stop()


def test_slowloris_headers_and_idle_connections_are_dropped(tmp_path: Path) -> None:
    srv = _start(tmp_path)
    try:
        with _monitor(srv) as mon:
            trickling = [_Conn(srv.port) for _ in range(60)]
            for c in trickling:
                c.send(b"GET /api/v1/query?query=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            silent = [_Conn(srv.port) for _ in range(20)]  # connect and never send anything
            # A kept-alive connection that completed one request, then goes quiet.
            idle = _Conn(srv.port)
            idle.send(b"GET /-/healthy HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            deadline = time.monotonic() + 5
            while b"\r\n\r\n" not in idle.answer and time.monotonic() < deadline:
                idle.poll()
            assert idle.answer.startswith(b"HTTP/1.1 200"), idle.answer[:100]
            answered = time.monotonic()
            t = threading.Thread(target=_trickle, args=(trickling, b"a", 0.3, HEADER_TIMEOUT_S + 8), daemon=True)
            t.start()
            end = time.monotonic() + IDLE_TIMEOUT_S + 6
            while time.monotonic() < end and not all(c.poll() for c in silent + [idle]):
                time.sleep(0.05)
            t.join(HEADER_TIMEOUT_S + 10)
            # Meanwhile a normal client is served.
            assert _call(srv.url + "/api/v1/query?query=1", auth=_auth("rita"))[0] == 200
        print(f"\nheader senders closed after max {max((c.closed_at or 99) - c.opened for c in trickling):.2f} s, "
              f"silent after max {max((c.closed_at or 99) - c.opened for c in silent):.2f} s, "
              f"idle after {(idle.closed_at or 99) - answered:.2f} s; {mon.report()}")
        for c in trickling + silent:
            assert c.closed_at is not None, "a connection that never completed its headers was kept open"
            took = c.closed_at - c.opened
            assert took <= HEADER_TIMEOUT_S + SLACK_S, f"header timeout took {took:.1f}s"
            c.close()
        assert any(c.status() == 408 for c in trickling), "a partial request should be told 408 before the close"
        assert idle.closed_at is not None, "an idle kept-alive connection was never closed"
        idle_for = idle.closed_at - answered
        assert IDLE_TIMEOUT_S - 1.0 <= idle_for <= IDLE_TIMEOUT_S + SLACK_S, f"idle connection closed after {idle_for:.1f}s"
        idle.close()
        mon.assert_responsive(RESPONSIVE_P99_S)
    finally:
        srv.stop()


def _propose(url: str, auth: str, body: dict | bytes) -> tuple[int, dict, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    st, raw, headers = _call(url + "/api/v1/kedgeflow/propose", auth=auth, data=data,
                             headers={"Content-Type": "application/json"})
    try:
        return st, json.loads(raw), headers
    except ValueError:
        return st, {}, headers


def test_audit_growth_per_request_is_bounded_and_proposals_are_rate_limited(tmp_path: Path) -> None:
    burst = 6
    srv = _start(tmp_path, f"kedgeflow:\n  rate_limit:\n    requests_per_second: 1\n    burst: {burst}\n",
                 args=("--web.enable-admin-api",))
    log = tmp_path / "data" / "kedgeflow" / "audit" / "audit.jsonl"

    def size() -> int:
        return log.stat().st_size if log.exists() else 0

    try:
        reader = _auth("rita")
        delete = {"verb": "tsdb.delete_series", "target": "tsdb", "params": {"match[]": ["x"]}}
        with _monitor(srv) as mon:
            # 1 MB of unused parameters: refused before anything is recorded.
            before = size()
            st, out, _ = _propose(srv.url, reader, {**delete, "params": {"match[]": ["x"], "junk": "j" * 1_000_000}})
            assert st == 413, (st, out)
            assert size() - before == 0
            # Unknown parameters of a verb with a known parameter set, and unknown fields: 400, nothing recorded.
            st, out, _ = _propose(srv.url, reader, {**delete, "params": {"match[]": ["x"], "junk": "j" * 100}})
            assert st == 400 and "unknown parameter" in out["error"], out
            st, out, _ = _propose(srv.url, reader, {**delete, "comment": "c" * 1000})
            assert st == 400 and "unknown" in out["error"], out
            assert size() - before == 0
            # A refused proposal with bulky (but valid) parameters records a digest and a preview.
            long_sel = 'x{a="' + "v" * 6000 + '"}'
            st, out, _ = _propose(srv.url, reader, {**delete, "params": {"match[]": [long_sel]}})
            assert st == 200 and not out["data"]["decision"]["approved"], out
            grown = size() - before
            assert 0 < grown <= 4096, f"one refused proposal grew the audit log by {grown} bytes"
            # A flood from the read-only user: 429 + Retry-After once the burst is spent.
            before = size()
            codes, retry = [], []
            for _ in range(30):
                st, _, headers = _propose(srv.url, reader, delete)
                codes.append(st)
                if st == 429:
                    retry.append(headers.get("Retry-After"))
            accepted = codes.count(200)
            print(f"\nflood of 30 proposals: {accepted} accepted, {codes.count(429)} x 429 (Retry-After {set(retry)}), "
                  f"audit grew {size() - before} bytes")
            assert codes.count(429) >= 20 and accepted <= burst + 2, codes
            assert retry and all(r and int(r) >= 1 for r in retry), retry
            grown = size() - before
            assert grown <= accepted * 2048, f"{accepted} accepted proposals grew the log by {grown} bytes"
            # Another principal has its own budget.
            st, out, _ = _propose(srv.url, _auth("alice"), {"verb": "tsdb.delete_series", "target": "tsdb",
                                                            "params": {"match[]": ["nothing_here"]}})
            assert st == 200 and out["data"]["decision"]["approved"], out
            time.sleep(0.5)  # enough polls to judge
        mon.assert_responsive(RESPONSIVE_P99_S)
        st, raw, _ = _call(srv.url + "/api/v1/audit/verify", auth=_auth("alice"))
        v = json.loads(raw)["data"]
        assert st == 200 and v["ok"], v
        for line in log.read_bytes().splitlines():
            assert len(line) <= 20_000, f"an audit entry of {len(line)} bytes"
    finally:
        srv.stop()


def test_valid_credentials_stay_fast_during_wrong_credential_flood(tmp_path: Path) -> None:
    srv = _start(tmp_path, rounds=9)
    stop = threading.Event()
    flood_codes: list[int] = []

    def flood(k: int) -> None:
        while not stop.is_set():
            if k % 2:
                auth = "Bearer " + secrets.token_hex(12)  # a fresh wrong token every time: compared with every hash
            else:
                auth = "Basic " + base64.b64encode(f"alice:{secrets.token_hex(6)}".encode()).decode()  # password guessing
            try:
                flood_codes.append(_call(srv.url + "/api/v1/query?query=1", auth=auth, timeout=10)[0])
            except OSError:
                flood_codes.append(-1)

    try:
        with _monitor(srv) as mon:
            threads = [threading.Thread(target=flood, args=(k,), daemon=True) for k in range(40)]
            for t in threads:
                t.start()
            time.sleep(1.5)  # the flood is in full swing
            first, again = [], []
            valid = [_auth(u) for u in BASIC if u.startswith("user")] + [_bearer(u) for u in BEARER]
            for auth in valid:
                t0 = time.perf_counter()
                st = _call(srv.url + "/api/v1/query?query=1", auth=auth)[0]
                first.append(time.perf_counter() - t0)
                assert st == 200, st
                t0 = time.perf_counter()
                assert _call(srv.url + "/api/v1/query?query=1", auth=auth)[0] == 200
                again.append(time.perf_counter() - t0)
            stop.set()
            for t in threads:
                t.join(15)
        print(f"\nfirst use during flood: {[round(x, 3) for x in first]}; again: {[round(x, 3) for x in again]}; "
              f"flood answers: {len(flood_codes)} ({flood_codes.count(429)} x 429); {mon.report()}")
        assert flood_codes and set(flood_codes) <= {401, 429}, set(flood_codes)
        assert flood_codes.count(401) >= 10, "the flood did not actually exercise bcrypt"
        assert statistics.median(first) < 0.2, f"first use of valid credentials during the flood: {[round(x, 3) for x in first]}"
        assert max(first) < 1.0, f"first use of valid credentials during the flood: {[round(x, 3) for x in first]}"
        assert statistics.median(again) < 0.05, again
        mon.assert_responsive(RESPONSIVE_P99_S)
    finally:
        stop.set()
        srv.stop()


@pytest.mark.parametrize("bad", ["0s", "-1", "soon"])
def test_bad_timeout_settings_are_refused(bad: str) -> None:
    from turboprom.http_guard import Timeouts

    with pytest.raises(ValueError):
        Timeouts.from_config({"web": {"read_body_timeout": bad}})
    assert Timeouts.from_config({}).read_header_s > 0


class _Req:
    """What the authenticator reads from a request."""

    def __init__(self, auth: str, remote: str = "127.0.0.1"):
        self.headers = {"Authorization": auth}
        self.remote = remote


def _authenticator(monkeypatch, limits: dict, delay: float = 0.05):
    """An Authenticator whose bcrypt comparison takes `delay` and records the thread it ran on."""
    import turboprom.auth as auth_mod

    threads: list[str] = []
    real = auth_mod.bcrypt.checkpw

    def slow_checkpw(secret: bytes, h: bytes) -> bool:
        threads.append(threading.current_thread().name)
        time.sleep(delay)
        return real(secret, h)

    monkeypatch.setattr(auth_mod.bcrypt, "checkpw", slow_checkpw)
    cfg = auth_mod.WebConfig()
    cfg.basic_users = {"alice": bcrypt.hashpw(b"alice-pw", bcrypt.gensalt(rounds=4))}
    cfg.bearer = [(f"svc{i}", bcrypt.hashpw(f"token-{i}".encode(), bcrypt.gensalt(rounds=4))) for i in range(3)]
    return auth_mod.Authenticator(cfg, {"workers": 1, **limits}), threads


def test_authenticator_single_flight_caches_and_never_on_the_loop(monkeypatch) -> None:
    import asyncio

    auth, threads = _authenticator(monkeypatch, {})

    async def run() -> list:
        same = _Req("Bearer token-2")
        return await asyncio.gather(*(auth.identify_async(same) for _ in range(20)))

    assert asyncio.run(run()) == ["svc2"] * 20
    assert auth.stats["bcrypt_checks"] == 3 and auth.stats["coalesced"] == 19  # one check for 20 requests
    assert set(threads) == {"auth-bcrypt-0"}  # the authenticator's own thread, not the event loop
    assert auth.cached(_Req("Bearer token-2")) == (True, "svc2")
    assert asyncio.run(auth.identify_async(_Req("Basic " + base64.b64encode(b"nobody:x").decode()))) is None
    assert auth.stats["bcrypt_checks"] == 3  # an unknown basic-auth user costs no bcrypt
    auth.close()


def test_authenticator_puts_fresh_checks_first_and_sheds_a_flooding_source(monkeypatch) -> None:
    import asyncio

    from turboprom.auth import AuthOverloaded

    auth, _ = _authenticator(monkeypatch, {"max_pending_per_source": 4, "max_pending": 8})

    async def run():
        wrong = [asyncio.ensure_future(auth.identify_async(_Req(f"Bearer wrong-{i}"))) for i in range(12)]
        await asyncio.sleep(0.3)  # the flood is queued and some of it failed: the source is failing
        t0 = time.perf_counter()
        user = await auth.identify_async(_Req("Bearer token-1"))  # same source as the flood, valid
        took = time.perf_counter() - t0
        other = await auth.identify_async(_Req("Basic " + base64.b64encode(b"alice:alice-pw").decode(), "127.0.0.2"))
        results = await asyncio.gather(*wrong, return_exceptions=True)
        return user, took, other, results

    user, took, other, results = asyncio.run(run())
    assert user == "svc1" and other == "alice"
    assert took < 0.5, f"a valid token waited {took:.2f}s behind the flood (one comparison is 0.05 s)"
    shed = [r for r in results if isinstance(r, AuthOverloaded)]
    assert len(shed) >= 12 - 4 - 2, results  # at most 4 waiting from that source (+ in progress)
    assert all(r is None or isinstance(r, AuthOverloaded) for r in results)
    auth.close()
