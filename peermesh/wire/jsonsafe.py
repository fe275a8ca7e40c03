"""JSON from remote senders, bounded in size and nesting depth.

``json.loads`` alone is not safe on what a remote sender controls: a text of
nested brackets (``'[' * 3000``) raises ``RecursionError``, which is not a
``ValueError`` and so escapes the handlers that expect malformed input. Every
decoder of remote JSON calls ``loads`` here instead: it raises ``JsonError``
(a ``ValueError``) for text that is not JSON, is longer than ``max_bytes`` or
nests deeper than ``max_depth``, and for nothing else.

Cost: the C scanner decodes as before; the depth is walked only when the text
has more opening brackets than ``max_depth`` (one ``str.count`` each, so a
flat object pays two counts).
"""

from __future__ import annotations

import json
from typing import Any, Union

from ..errors import PeermeshError

__all__ = ["JsonError", "MAX_DEPTH", "HEADER_DEPTH", "loads", "depth"]

#: nesting depth of remote JSON (an object in a list is depth 2)
MAX_DEPTH = 128
#: nesting depth of a HELLO header's JSON value (flat objects, a list of them)
HEADER_DEPTH = 4

_scan_once = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_decode = json.JSONDecoder().decode


class JsonError(PeermeshError, ValueError):
    """Remote JSON that is malformed, too long or too deep."""


def depth(obj: Any) -> int:
    """How deep containers nest in ``obj`` (0 for a scalar), without recursion."""
    deepest = 0
    stack = [(obj, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        if level > deepest:
            deepest = level
        stack.extend((child, level + 1) for child in item
                     if isinstance(child, (dict, list)))
    return deepest


def loads(data: Union[str, bytes], max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value in ``data`` (UTF-8 if bytes); ``JsonError`` if it is not JSON, is
    over ``max_bytes`` octets (characters, for text) or nests over ``max_depth``."""
    if len(data) > max_bytes:
        raise JsonError(f"JSON of {len(data):,} octets is over {max_bytes:,}")
    try:
        text = data if isinstance(data, str) else data.decode("utf-8")
        try:
            obj, end = _scan_once(text, 0)
        except StopIteration:
            end = -1
        if end != len(text):   # whitespace around the value, or not JSON: the full path says
            obj = _decode(text)
    except RecursionError:
        raise JsonError("JSON nests too deeply") from None
    except ValueError as exc:   # JSONDecodeError, UnicodeDecodeError
        raise JsonError(f"not JSON: {str(exc)[:80]}") from None
    if text.count("[") + text.count("{") > max_depth and depth(obj) > max_depth:
        raise JsonError(f"JSON nests deeper than {max_depth}")
    return obj
