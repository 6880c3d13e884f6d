"""Number formatting as Go's fmt/strconv render it, for annotation texts and label values."""
from __future__ import annotations

import math
from decimal import Decimal


def _shortest_digits(v: float) -> tuple[str, int]:
    """Shortest round-trip decimal digits of |v| and the decimal exponent of the first digit."""
    d = Decimal(repr(abs(v)))
    sign, digits, exp = d.as_tuple()
    ds = "".join(map(str, digits)).lstrip("0") or "0"
    # value = int(digits) * 10**exp ; first digit exponent:
    strip = len(digits) - len("".join(map(str, digits)).lstrip("0"))
    ndig = len(digits) - strip
    first_exp = exp + ndig - 1 if ds != "0" else 0
    ds = ds.rstrip("0") or "0"
    return ds, first_exp


def format_go_g(v: float) -> str:
    """strconv.FormatFloat(v, 'g', -1, 64), i.e. fmt's %g for a float64."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    digits, exp = _shortest_digits(v)
    sign = "-" if v < 0 else ""
    if exp < -4 or exp >= 6:  # Go uses precision 6 for this decision with shortest digits
        mant = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        es = "-" if exp < 0 else "+"
        return f"{sign}{mant}e{es}{abs(exp):02d}"
    if exp >= len(digits) - 1:
        return sign + digits + "0" * (exp - len(digits) + 1)
    if exp >= 0:
        return sign + digits[: exp + 1] + "." + digits[exp + 1 :]
    return sign + "0." + "0" * (-exp - 1) + digits
