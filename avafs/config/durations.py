"""Durations in flags and config values: one parser for every option that takes seconds.

A number is seconds (`90`, `0.5`), as avafs has always read it; a number with a unit is read as
rclone and Go write durations, parts added up: `ms s m h d` (`90s`, `5m`, `1h30m`, `2d`). `m` is
minutes here, while a size reads `m` as milli and refuses it (sizes.py): a duration has no
milli to confuse it with. `inf` is parsed too; each option says whether it takes it.
"""

from __future__ import annotations

import math
import re
from typing import Any

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")

DURATION_HELP = "a number of seconds or a duration such as 90s, 5m or 1h30m"
"""What `--help` and error messages say about durations."""
_EXAMPLES = "a duration such as 90s, 5m or 1h30m"


def parse_duration(value: Any) -> float:
    """Seconds in `value` (math.inf for `inf`); a ValueError says what is accepted."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip().lower()
        if text in ("inf", "infinity"):
            seconds = math.inf
        elif _NUMBER.fullmatch(text):
            seconds = float(text)
        elif text and "".join(part.group(0) for part in _PART.finditer(text)) == text:
            seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text))
        else:
            seconds = math.nan
    if math.isnan(seconds):
        raise ValueError(f"must be a number of seconds or {_EXAMPLES}, got {value!r}")
    return seconds


def positive_duration(value: Any) -> float:
    """A duration above 0 and finite: a timeout or an interval."""
    try:
        seconds = parse_duration(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < math.inf:
        raise ValueError(f"must be a number of seconds above 0, or {_EXAMPLES}, got {value!r}")
    return seconds
