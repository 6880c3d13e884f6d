"""Prometheus duration syntax (``1h30m``, ``5m1ms``, ``100y``, ``0``) to int64 milliseconds."""
from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000, "y": 31_536_000_000}
_PART = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_ORDER = ["y", "w", "d", "h", "m", "s", "ms"]
MAX_DURATION_MS = (2**63 - 1) // 1_000_000  # Prometheus durations are int64 nanoseconds


def parse_duration_ms(text: str) -> int:
    """Parse a Prometheus duration; raises ValueError naming the bad input."""
    s = text.strip()
    if s == "0":
        return 0
    if not s:
        raise ValueError("empty duration string")
    pos, total, last_rank = 0, 0, -1
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        rank = _ORDER.index(m.group(2))
        if rank <= last_rank:
            raise ValueError(f"not a valid duration string: {text!r} (units out of order)")
        last_rank = rank
        total += int(m.group(1)) * _UNITS_MS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"not a valid duration string: {text!r}")
    if total > MAX_DURATION_MS:
        raise ValueError(f"duration out of range: {text!r} is more than the largest duration (about 292y: int64 nanoseconds)")
    return total
