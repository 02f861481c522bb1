"""Human sizes (`4MiB`, `10GiB`, `1.5TB`) for flags and config values."""

import re

_UNITS = {
    "": 1, "B": 1,
    "K": 1024, "KB": 1000, "KIB": 1024,
    "M": 1024**2, "MB": 1000**2, "MIB": 1024**2,
    "G": 1024**3, "GB": 1000**3, "GIB": 1024**3,
    "T": 1024**4, "TB": 1000**4, "TIB": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in `text`; raises ValueError with a message that says what is accepted."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    match = _SIZE.match(str(text))
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"invalid size {text!r}: use a number with an optional unit "
                         "B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB), e.g. 10GiB")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
