"""Which offered service version serves a requested one.

The rule, applied by channels when choosing servers and by servers when
dispatching a REQ:

1. **No version asked** (``None``): the highest version offered.
2. **Exact**: a version string equal to the one asked always wins.
3. **Compatible**: otherwise, versions that read as dotted numbers
   (``MAJOR[.MINOR[.PATCH...]]``, e.g. ``1``, ``1.2``, ``2.0.3``) are compatible
   when they have the same MAJOR and are not lower than the one asked
   (missing parts count as 0, so ``1`` = ``1.0`` = ``1.0.0``); the highest
   compatible one is chosen. ``1.2`` is served by ``1.2.0``, ``1.3`` or
   ``1.10``, never by ``1.1`` or ``2.0``.
4. Versions that are not dotted numbers (``beta``, ``v2``) only match exactly.

"Highest" compares dotted numbers numerically; versions that are not
dotted numbers sort below all that are, among themselves as strings.
"""

from __future__ import annotations

from typing import Iterable, Optional

__all__ = ["parse_version", "is_compatible", "choose_version", "version_key"]


def parse_version(version: str) -> Optional[tuple[int, ...]]:
    """``"1.2.3"`` as ``(1, 2, 3)``; None when it is not dotted decimal numbers."""
    parts = version.split(".")
    if not all(p.isdigit() and p.isascii() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _padded(a: tuple[int, ...], size: int) -> tuple[int, ...]:
    return a + (0,) * (size - len(a))


def is_compatible(offered: str, requested: str) -> bool:
    """True when a server offering ``offered`` may serve a request for ``requested``."""
    if offered == requested:
        return True
    have, want = parse_version(offered), parse_version(requested)
    if have is None or want is None or have[0] != want[0]:
        return False
    size = max(len(have), len(want))
    return _padded(have, size) >= _padded(want, size)


def version_key(version: str) -> tuple[int, tuple[int, ...], str]:
    """Sort key: dotted numbers above anything else, numerically, then the string."""
    parsed = parse_version(version)
    if parsed is None:
        return (0, (), version)
    return (1, _padded(parsed, 8), version)


def choose_version(offered: Iterable[str], requested: Optional[str]) -> Optional[str]:
    """The offered version that serves ``requested`` by the rule above, or None."""
    offered = list(offered)
    if not offered:
        return None
    if requested is None:
        return max(offered, key=version_key)
    if requested in offered:
        return requested
    compatible = [v for v in offered if is_compatible(v, requested)]
    if not compatible:
        return None
    return max(compatible, key=version_key)
