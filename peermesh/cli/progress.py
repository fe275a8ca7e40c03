"""Progress of a long command on a terminal: a ``tqdm`` bar on stderr, only when stderr is a
TTY (and the log format is text), so pipes, files and log collectors never see one.

``with Progress("fetching", total=size, unit="B") as bar: bar.update(n)``; ``bar.emit(line)``
prints a result line on stdout without tearing the bar. Without a terminal each call
does nothing but ``emit``; tqdm is imported only when a bar is shown.
"""

from __future__ import annotations

import sys

from . import output
from .output import emit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional

__all__ = ["Progress", "shown"]


def shown() -> bool:
    """True when a bar may be drawn: stderr is a terminal and notes are plain text."""
    stderr = sys.stderr
    try:
        tty = stderr is not None and stderr.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and output.note_sink is None


class Progress:
    """A bar of ``total`` (None: a counter) in ``unit`` ("B": octets, scaled), or nothing."""

    def __init__(self, description: str, total: Optional[float] = None, unit: str = "it") -> None:
        self._bar: Any = None
        if shown():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=description, unit=unit, file=sys.stderr,
                             unit_scale=unit == "B", unit_divisor=1024 if unit == "B" else 1000,
                             leave=False, dynamic_ncols=True, mininterval=0.2)

    def update(self, count: float = 1) -> None:
        """``count`` more done."""
        if self._bar is not None:
            self._bar.update(count)

    @property
    def active(self) -> bool:
        """True when a bar is shown."""
        return self._bar is not None

    def advance_to(self, done: float, status: str = "") -> None:
        """Set how much is done (never backwards) and a short status after the bar."""
        bar = self._bar
        if bar is not None:
            if done > bar.n:
                bar.update(done - bar.n)
            if status:
                bar.set_postfix_str(status, refresh=False)

    def set_total(self, total: float) -> None:
        """The total, once known."""
        if self._bar is not None and self._bar.total != total:
            self._bar.total = total
            self._bar.refresh()

    def emit(self, line: str) -> None:
        """A result line on stdout (above the bar when both share the terminal)."""
        if self._bar is not None and sys.stdout.isatty():
            self._bar.write(line, file=sys.stdout)
        else:
            emit(line)

    def close(self) -> None:
        """Remove the bar."""
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
