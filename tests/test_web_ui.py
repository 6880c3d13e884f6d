"""The built-in page in a real headless browser (Debian's chromium): the graph renders data."""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

from tests.helpers import ServerProcess, require_binary


def _chromium(args: list[str], tmp: Path, timeout: float = 90) -> subprocess.CompletedProcess:
    exe = require_binary("chromium")
    base = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp / 'chrome-profile'}", "--virtual-time-budget=8000", "--window-size=1280,900"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


def test_graph_page_renders_series(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as srv:
        now = int(time.time())
        lines = []
        for k in range(60):
            t = (now - 600 + k * 10) * 1000
            lines.append(f'demo_load{{gpu="0"}} {50 + 40 * np.sin(k / 6):.3f} {t}')
            lines.append(f'demo_load{{gpu="1"}} {30 + 10 * np.cos(k / 9):.3f} {t}')
        req = urllib.request.Request(srv.url + "/api/v1/import/prometheus", data="\n".join(lines).encode() + b"\n", method="POST")
        urllib.request.urlopen(req, timeout=30).read()
        url = f"{srv.url}/graph?expr={urllib.parse.quote('demo_load')}#query"
        dom = _chromium(["--dump-dom", url], tmp_path)
        assert 'data-rendered="2"' in dom.stdout, dom.stdout[-3000:] + dom.stderr[-2000:]
        assert 'gpu="1"' in dom.stdout  # legend lists both series
        shot = Path(os.environ.get("TURBOPROM_SCREENSHOT_DIR", tmp_path)) / "graph.png"
        r = _chromium([f"--screenshot={shot}", url], tmp_path)
        assert shot.exists(), r.stderr[-2000:]
        img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
        # The first series is drawn in #e6522c and the second in #1f77b4: both must show up as lines.
        orange = (abs(img[..., 0] - 0xE6) < 30) & (abs(img[..., 1] - 0x52) < 30) & (abs(img[..., 2] - 0x2C) < 30)
        blue = (abs(img[..., 0] - 0x1F) < 30) & (abs(img[..., 1] - 0x77) < 30) & (abs(img[..., 2] - 0xB4) < 30)
        assert orange[150:, :].sum() > 300 and blue[150:, :].sum() > 300, (orange.sum(), blue.sum())
        # The congestion and planner views load their APIs without errors.
        with urllib.request.urlopen(srv.url + "/static/app.js", timeout=10) as resp:
            assert b"renderCongestion" in resp.read()
        with urllib.request.urlopen(srv.url + "/api/v1/congestion", timeout=10) as resp:
            assert json.loads(resp.read())["status"] == "success"
