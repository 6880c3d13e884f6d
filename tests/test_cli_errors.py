"""CLI and start-up failures print one line naming the cause (exit code 1, no traceback), through the
real `python -m turboprom` and a real server; listen addresses and argument orders that must work do."""
from __future__ import annotations

import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import REPO, ServerProcess, free_port, wait_http


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turboprom", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def one_line_failure(r: subprocess.CompletedProcess, *expected: str) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for e in expected:
        assert e in lines[0], (e, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    with ServerProcess(tmp / "data") as srv:
        yield srv


def test_port_in_use(server: ServerProcess, tmp_path: Path) -> None:
    r = run_cli("serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{server.port}")
    one_line_failure(r, f"turboprom: cannot listen on 127.0.0.1:{server.port}: address already in use", "--listen")


def test_port_taken_by_another_program(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("serve", "--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}")
    one_line_failure(r, "address already in use")


def test_bad_yaml_names_line_and_column(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: 'a\n")
    r = run_cli("serve", "--data-dir", str(tmp_path / "data"), "--config", str(cfg), "--listen", f"127.0.0.1:{free_port()}")
    line = one_line_failure(r, f"config error: {cfg}:", "invalid YAML")
    assert line.split(f"{cfg}:")[1].split(":")[0].isdigit() and line.split(f"{cfg}:")[1].split(":")[1].isdigit(), line


def test_missing_config_file(tmp_path: Path) -> None:
    r = run_cli("serve", "--data-dir", str(tmp_path / "data"), "--config", str(tmp_path / "none.yml"))
    one_line_failure(r, f"config error: config file {tmp_path / 'none.yml'} not found")


def test_data_dir_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "datafile"
    f.write_text("x")
    r = run_cli("serve", "--data-dir", str(f), "--listen", f"127.0.0.1:{free_port()}")
    one_line_failure(r, f"turboprom: data dir {f} is a file, not a directory")
    r = run_cli("serve", "--data-dir", str(f / "sub"), "--listen", f"127.0.0.1:{free_port()}")
    one_line_failure(r, f"cannot create data dir {f / 'sub'}: a parent of it is a file")
    if Path("/sys/kernel").is_dir():  # not writable even for root
        r = run_cli("serve", "--data-dir", "/sys/kernel", "--listen", f"127.0.0.1:{free_port()}")
        one_line_failure(r, "turboprom: data dir /sys/kernel is not writable: ", "--data-dir")


@pytest.mark.parametrize("listen,expected", [
    ("localhost:abc", "invalid listen address 'localhost:abc': port must be a number"),
    ("127.0.0.1:70000", "port must be a number from 0 to 65535"),
    ("[::1:9090", "invalid listen address '[::1:9090'"),
    ("no-such-host.invalid:9090", "cannot listen on no-such-host.invalid:9090: host not found"),
])
def test_bad_listen_address(tmp_path: Path, listen: str, expected: str) -> None:
    one_line_failure(run_cli("serve", "--data-dir", str(tmp_path / "data"), "--listen", listen), expected)


def test_listen_forms() -> None:
    from turboprom.config import split_listen

    assert split_listen("localhost") == ("localhost", 9090)  # a bare host means port 9090, as Prometheus's default
    assert split_listen("localhost:9090") == ("localhost", 9090)
    assert split_listen("[::1]:9091") == ("::1", 9091)
    assert split_listen(":9092") == ("127.0.0.1", 9092)


def test_listen_localhost_with_port_serves(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "turboprom", "serve", "--data-dir", str(tmp_path / "data"),
                             "--listen", f"localhost:{port}"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=60, proc=proc)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"TurboProm listening on http://localhost:{port}" in out.decode()


def test_plan_with_server_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    one_line_failure(run_cli("plan", "list", "--url", url), f"turboprom: cannot reach {url}: Connection refused", "--url")
    one_line_failure(run_cli("plan", "explain", "--url", url, "sum(up)"), f"cannot reach {url}")
    r = run_cli("cost-report", "--url", url)  # its first line says what it is doing
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith(f"cannot reach TurboProm at {url}")
    assert "Traceback" not in r.stderr


def test_plan_explain_argument_orders(server: ServerProcess) -> None:
    for args in (["plan", "explain", "--url", server.url, "sum(rate(up[5m]))"],
                 ["plan", "explain", "sum(rate(up[5m]))", "--url", server.url]):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("pattern: "), r.stdout
    r = run_cli("plan", "list", "--url", server.url, "extra", "args")
    assert r.returncode == 2 and "unrecognized arguments: extra args" in r.stderr


def test_replay_bad_trace_and_scheduler(tmp_path: Path) -> None:
    one_line_failure(run_cli("replay", "--trace", str(tmp_path / "nope.jsonl")), f"turboprom: replay: trace file {tmp_path / 'nope.jsonl'} not found")
    (tmp_path / "t.txt").write_text("x")
    one_line_failure(run_cli("replay", "--trace", str(tmp_path / "t.txt")), "expected a Mooncake .jsonl or an Azure .csv trace")
    (tmp_path / "t.jsonl").write_text("")
    one_line_failure(run_cli("replay", "--trace", str(tmp_path / "t.jsonl"), "--scheduler", "vesta,vesat"),
                     "turboprom: replay: unknown scheduler 'vesat' (known: vesta, ")
    one_line_failure(run_cli("replay", "--trace", str(tmp_path / "t.jsonl"), "--load", "high"), "replay: --load 'high'")
    one_line_failure(run_cli("replay", "--trace", str(tmp_path / "t.jsonl"), "--disaggregated", "8"), "--disaggregated '8'")


def test_unknown_api_path_is_404_like_prometheus(server: ServerProcess) -> None:
    for path in ("/api/v1/qeury", "/api/v1/no/such/thing"):
        try:
            urllib.request.urlopen(server.url + path, timeout=30)
            raise AssertionError(f"{path} answered 200")
        except urllib.error.HTTPError as e:
            assert e.code == 404 and e.read() == b"404 page not found\n", path
    with urllib.request.urlopen(urllib.request.Request(server.url + "/api/v1/query", method="OPTIONS"), timeout=30) as r:
        assert r.status in (200, 204)  # CORS preflight still answered
    try:
        urllib.request.urlopen(urllib.request.Request(server.url + "/api/v1/write", method="GET"), timeout=30)
    except urllib.error.HTTPError as e:
        assert e.code == 405  # a known path with the wrong method stays 405


def test_debug_shows_traceback(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text("{not json}\n")
    r = run_cli("replay", "--trace", str(tmp_path / "t.jsonl"), "--scheduler", "vesta", "--load", "0.5")
    one_line_failure(r, "turboprom replay: ", "--debug")
    r = run_cli("--debug", "replay", "--trace", str(tmp_path / "t.jsonl"), "--scheduler", "vesta", "--load", "0.5")
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_demo_refuses_a_taken_port_and_a_data_dir_in_use(server: ServerProcess, tmp_path: Path) -> None:
    """`make demo` runs `python -m turboprom.demo`: the server's start-up checks come before the fleet
    and the banner, and fail with one line (no fleet history written, nothing left running)."""
    def demo(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "turboprom.demo", "--history-hours", "0", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)

    r = demo("--data-dir", str(tmp_path / "d"), "--listen", f"127.0.0.1:{server.port}")
    one_line_failure(r, f"turboprom-demo: cannot listen on 127.0.0.1:{server.port}: address already in use")
    assert "TurboProm demo" not in r.stdout
    r = demo("--data-dir", str(server.data_dir), "--listen", f"127.0.0.1:{free_port()}")
    one_line_failure(r, "turboprom-demo: data dir", "in use by another TurboProm process", "--data-dir")
    r = demo("--data-dir", str(tmp_path / "d"), "--listen", "[::1:9090")
    one_line_failure(r, "turboprom-demo: invalid listen address '[::1:9090'")
