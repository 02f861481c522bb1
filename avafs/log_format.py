"""Log lines that say what happened and nothing else: control characters in a message (a file
name may hold a newline or an escape sequence) are written escaped, so no name can inject a
line of its own or drive the terminal that shows the log."""

from __future__ import annotations

import logging

_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7f, 0xa0))}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


def printable(text: str) -> str:
    """`text` with its control characters escaped as Python writes them."""
    return text.translate(_ESCAPES)


class EscapingFormatter(logging.Formatter):
    """Escapes the message; a traceback appended after it keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = printable(record.message)
        return super().formatMessage(record)
