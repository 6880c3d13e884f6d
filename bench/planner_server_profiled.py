"""``turboprom serve`` with every ``PlannedEngine`` query run under cProfile (for bench/planner_http_profile.py).

The stats of all queries accumulate into one profile, written to ``$PLANNER_PROFILE_OUT`` when the
server exits. Usage: ``python bench/planner_server_profiled.py serve --data-dir ...``.
"""
from __future__ import annotations

import atexit
import cProfile
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planner.planned_engine import PlannedEngine  # noqa: E402
from turboprom.cli import main  # noqa: E402

_prof = cProfile.Profile()
_lock = threading.Lock()
_orig = PlannedEngine._run


def _profiled(self, *a, **kw):  # one query at a time under the profiler (the bench sends them serially)
    with _lock:
        _prof.enable()
        try:
            return _orig(self, *a, **kw)
        finally:
            _prof.disable()


PlannedEngine._run = _profiled
atexit.register(lambda: _prof.dump_stats(os.environ.get("PLANNER_PROFILE_OUT", "/tmp/planner-server.prof")))
sys.exit(main())
