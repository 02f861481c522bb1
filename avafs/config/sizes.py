"""Sizes in flags, YAML config values and CSI volume attributes: one parser for all three.

Kubernetes quantities are read as Kubernetes reads them: `Ki Mi Gi Ti Pi` are powers of 1024,
`k M G T P` powers of 1000 (so `10G` is 10^9 bytes and `10Gi` is 10 * 2^30). The byte-unit
spellings people also write stay accepted with their usual meaning: `KiB MiB GiB TiB` are
powers of 1024, `KB MB GB TB` powers of 1000. Units are case-insensitive except `m`, which
Kubernetes reads as milli: `10m` is refused rather than guessed. Sizes are shown in powers of
1024 only (`format_size`), so one report never mixes the two systems.

A one-letter decimal unit (`10G`) reads two ways: Kubernetes means 10^9, rclone and most mount
tools 2^30. It keeps Kubernetes' meaning (the CSI driver's volume attributes are Kubernetes
quantities) and `decimal_letter_warning` says so when a mount is given one; `10GB` says 10^9
without that doubt.
"""

from __future__ import annotations

import re

_BINARY = {"KI": 1, "MI": 2, "GI": 3, "TI": 4, "PI": 5}
_DECIMAL = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")

UNITS_HELP = ("Ki Mi Gi Ti (powers of 1024, also KiB..TiB) or k M G T (powers of 1000, "
              "also KB..TB), as Kubernetes reads them")
"""What `--help` and error messages say about units."""


def _multiplier(unit: str) -> int | None:
    if unit == "m":
        return None
    upper = unit.upper()
    if upper in ("", "B"):
        return 1
    if upper.endswith("IB") and upper[:-1] in _BINARY:
        return 1024 ** _BINARY[upper[:-1]]
    if upper in _BINARY:
        return 1024 ** _BINARY[upper]
    if upper.endswith("B") and upper[:-1] in _DECIMAL:
        return 1000 ** _DECIMAL[upper[:-1]]
    if upper in _DECIMAL:
        return 1000 ** _DECIMAL[upper]
    return None


def parse_size(text: str | int) -> int:
    """Bytes in `text`; raises ValueError with a message that says what is accepted."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    multiplier = _multiplier(match.group(2)) if match else None
    if match is None or multiplier is None:
        raise ValueError(f"invalid size {text!r}: use a number with an optional unit "
                         f"{UNITS_HELP}, e.g. 10Gi")
    return int(float(match.group(1)) * multiplier)


def decimal_letter_warning(text: str | int, where: str) -> str | None:
    """A one-line warning for a size written with a one-letter decimal unit (`10G`), which
    rclone's users read as powers of 1024; None for any other spelling."""
    match = None if isinstance(text, int) else _SIZE.match(text)
    if match is None or match.group(2).upper() not in _DECIMAL or match.group(2) == "m":
        return None
    number, unit = match.group(1), match.group(2)
    power = _DECIMAL[unit.upper()]
    return (f"{where} {number}{unit} is {number}*10^{3 * power} bytes (Kubernetes reads {unit} "
            f"as a power of 1000, rclone as a power of 1024): write {number}{unit.upper()}i "
            f"for {number}*2^{10 * power} bytes, or {number}{unit.upper()}B to keep powers of "
            "1000 without this warning")


def format_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
