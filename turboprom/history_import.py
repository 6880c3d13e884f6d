"""``turboprom import FILE``: history into blocks, into a stopped server's data dir or through a
running server (``POST /api/v1/admin/tsdb/import``, turboprom/routes/backfill_api.py).

The file is read by ``ingest.history_file`` (one columnar batch, line numbers kept for messages) and
written by ``TSDB.import_history`` (storage/backfill.py: checked as a whole, cut into aligned
blocks). This module joins them: refusals as one line naming the file, line, series, time and the
window that applies; the progress line; the HTTP client of the server mode.
"""
from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

from ingest.errors import IngestError
from ingest.history_file import HistoryData, detect_format, read_history
from promql.printer import format_duration_ms as format_duration
from storage.backfill import BackfillError, BackfillResult
from storage.labels import format_labels
from storage.options import StorageOptions
from turboprom.rejections import format_time_ms, hint
from turboprom.tenancy import DEFAULT_TENANT, label_batch

FORMATS = ("openmetrics", "prometheus", "csv")
CONTENT_TYPES = {"openmetrics": "application/openmetrics-text", "prometheus": "text/plain", "csv": "text/csv"}


class ImportRefused(Exception):
    """The file or one of its samples was refused; ``str()`` is the one-line message."""


def refusal_message(e: BackfillError, data: HistoryData, name: str) -> str:
    b = data.batch
    pos = e.position
    where = f"{name}:{data.line_of(pos)}: {format_labels(b.series[int(b.series_index[pos])])} @ {format_time_ms(int(b.timestamps[pos]))}"
    count = f" ({e.count} samples like it)" if e.count > 1 else ""
    h = hint(e.reason, e.bounds)
    return f"{where}: {e.message}{count}{'; ' + h if h else ''}; nothing was imported"


def import_file(tsdb: Any, path: Path, fmt: str, *, name: str | None = None, tenant: str = DEFAULT_TENANT,
                progress: Callable[[str], None] | None = None, deliver: Callable[[Any, Any], None] | None = None
                ) -> tuple[HistoryData, BackfillResult]:
    """Read ``path`` and write it as blocks into ``tsdb`` (a storage.tsdb.TSDB). ``deliver(batch,
    append_result)`` hands the written samples to ingest sinks (a running server's summaries).
    Raises ImportRefused with the one-line message."""
    name = name or path.name

    def read_progress(done: int, total: int, samples: int) -> None:
        if progress is not None:
            pct = 100.0 * done / total if total else 100.0
            progress(f"reading {name}: {pct:5.1f}% ({done / 1e6:.1f} of {total / 1e6:.1f} MB, {samples:,} samples)")

    try:
        data = read_history(path, fmt, read_progress, name)
    except IngestError as e:
        raise ImportRefused(e.message) from None
    if len(data.batch) == 0:
        raise ImportRefused(f"{name}: no samples in the file")
    batch = label_batch(data.batch, tenant)

    def block_progress(done: int, total: int) -> None:
        if progress is not None:
            progress(f"writing blocks: {done}/{total}")

    try:
        res = tsdb.import_history(batch, block_progress)
    except BackfillError as e:
        raise ImportRefused(refusal_message(e, data, name)) from None
    if deliver is not None and res.samples:
        deliver(batch, res.stored_as_append(len(batch)))
    return data, res


def summary(res: BackfillResult | dict, seconds: float) -> str:
    r = res if isinstance(res, dict) else result_json(res)
    blocks = r["blocks"]
    span = (f" [{format_time_ms(min(b['minTime'] for b in blocks))} .. {format_time_ms(max(b['maxTime'] for b in blocks))}]"
            if blocks else "")
    dup = f", {r['duplicates']:,} already stored or repeated (skipped)" if r["duplicates"] else ""
    return (f"imported {r['samples']:,} samples of {r['series']:,} series into {len(blocks)} block(s) of "
            f"{format_duration(r['blockRangeMs'])}{span}{dup} in {seconds:.1f}s")


def result_json(res: BackfillResult) -> dict:
    return {"samples": res.samples, "series": res.series, "duplicates": res.duplicates, "blocks": res.blocks,
            "blockRangeMs": res.block_range_ms}


class ProgressLine:
    """One status line on stderr: rewritten in place on a terminal; elsewhere (logs, CI) printed when
    its stage changes and at most every 2 s within a stage."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._last = 0.0
        self._shown = ""
        self._pending = ""

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r" + text.ljust(len(self._shown)))
            self._shown = text
        elif now - self._last >= 2.0 or text.split(":", 1)[0] != self._shown.split(":", 1)[0]:
            if self._pending and text.split(":", 1)[0] != self._pending.split(":", 1)[0]:
                self.stream.write(self._pending + "\n")  # where the previous stage ended
            self.stream.write(text + "\n")
            self._shown, self._last, self._pending = text, now, ""
        elif text != self._shown:
            self._pending = text
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self._shown:
            self.stream.write("\n")
        elif self._pending:
            self.stream.write(self._pending + "\n")
        self._shown = self._pending = ""
        self.stream.flush()


def _format_of(path: Path, fmt: str) -> str:
    return detect_format(path) if fmt == "auto" else fmt


def _check_file(path: Path) -> None:
    if not path.exists():
        raise ImportRefused(f"import: file {path} not found")
    if not path.is_file():
        raise ImportRefused(f"import: {path} is not a file")


def run_local(path: Path, data_dir: str, fmt: str, retention_ms: int, tenant: str, progress: ProgressLine) -> str:
    """Into a stopped server's data dir (the data dir lock refuses a running one)."""
    from storage.tsdb import TSDB
    from turboprom.data_lock import DataDirLocked, lock_data_dir, unlock_data_dir

    d = Path(data_dir)
    if d.exists() and not d.is_dir():
        raise ImportRefused(f"import: data dir {data_dir} is a file, not a directory")
    d.mkdir(parents=True, exist_ok=True)
    try:
        fd = lock_data_dir(d)
    except DataDirLocked as e:
        raise ImportRefused(f"import: {e}: stop it first, or import through it with --url http://HOST:PORT "
                            "(needs --web.enable-admin-api)") from None
    try:
        if any((d / "planner" / "sds").glob("*")):
            raise ImportRefused(f"import: data dir {data_dir} holds query summaries (planner/sds) that would not see the "
                                "imported samples: import through the running server with --url instead, so they fold them")
        t0 = time.monotonic()
        with TSDB(str(d), StorageOptions(retention_ms=retention_ms), background=False) as db:
            _, res = import_file(db, path, fmt, tenant=tenant, progress=progress)
        progress.done()
        return summary(res, time.monotonic() - t0)
    finally:
        unlock_data_dir(fd)


class _Upload:
    """The file as a request body, reporting bytes sent."""

    def __init__(self, path: Path, progress: ProgressLine):
        self.f = open(path, "rb")
        self.total = path.stat().st_size
        self.sent = 0
        self.progress = progress
        self.name = path.name

    def read(self, n: int = -1) -> bytes:
        chunk = self.f.read(1 << 20 if n is None or n < 0 else n)
        self.sent += len(chunk)
        pct = 100.0 * self.sent / self.total if self.total else 100.0
        self.progress(f"uploading {self.name}: {pct:5.1f}% ({self.sent / 1e6:.1f} of {self.total / 1e6:.1f} MB)")
        return chunk

    def close(self) -> None:
        self.f.close()


def run_remote(path: Path, url: str, fmt: str, tenant: str, progress: ProgressLine) -> str:
    """Through a running server: the server writes the blocks and folds the samples into its summaries."""
    q = urllib.parse.urlencode({"format": fmt, "filename": path.name})
    body = _Upload(path, progress)
    headers = {"Content-Type": CONTENT_TYPES[fmt], "Content-Length": str(body.total)}
    if tenant != DEFAULT_TENANT:
        headers["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(url.rstrip("/") + "/api/v1/admin/tsdb/import?" + q, data=body, headers=headers, method="POST")
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=3600) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            msg = json.loads(raw).get("error") or raw.decode(errors="replace")
        except ValueError:
            msg = raw.decode(errors="replace")[:300]
        progress.done()
        raise ImportRefused(f"import: {url} refused the import ({e.code}): {msg}") from None
    finally:
        body.close()
    progress.done()
    return summary(answer["data"], time.monotonic() - t0)


def run_cli(args: Any) -> int:
    from turboprom.tenancy import validate_tenant

    path = Path(args.file)
    _check_file(path)
    try:
        validate_tenant(args.tenant)
    except ValueError as e:
        raise ImportRefused(f"import: --tenant: {e}") from None
    fmt = _format_of(path, args.format)
    progress = ProgressLine()
    if args.url:
        print(run_remote(path, args.url, fmt, args.tenant, progress))
    else:
        print(run_local(path, args.data_dir, fmt, args.retention_time, args.tenant, progress))
    return 0
