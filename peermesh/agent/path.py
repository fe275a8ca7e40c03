"""Where the agent's socket lives.

``$PEERMESH_AGENT`` if set, else ``$XDG_RUNTIME_DIR/peermesh/agent.sock``,
else ``/tmp/peermesh-$UID/agent.sock``; ``--agent PATH`` overrides all three.
Who may serve there, and how the agent makes the path its own, is
``peermesh.agent.claim``. This module loads only ``os``, so the client that
imports it starts fast.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    from typing import Mapping, Optional

__all__ = ["default_agent_path", "tmp_path", "resolve_path", "MAX_PATH"]

#: longest socket path a Unix socket address holds (sun_path is 108 octets with the NUL)
MAX_PATH = 107


def default_agent_path(environ: Optional[Mapping[str, str]] = None,
                       uid: Optional[int] = None) -> str:
    """``$PEERMESH_AGENT``, else ``$XDG_RUNTIME_DIR/peermesh/agent.sock``, else /tmp."""
    env = os.environ if environ is None else environ
    explicit = env.get("PEERMESH_AGENT")
    if explicit:
        return os.path.abspath(explicit)
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "peermesh", "agent.sock")
    return tmp_path(os.getuid() if uid is None else uid)


def tmp_path(uid: int) -> str:
    """The last-resort socket path of user ``uid``."""
    return f"/tmp/peermesh-{uid}/agent.sock"


def resolve_path(path: Optional[str] = None) -> str:
    """``path`` made absolute, or the default; ValueError when too long for a socket."""
    result = os.path.abspath(path) if path else default_agent_path()
    size = len(os.fsencode(result))
    if size > MAX_PATH:
        raise ValueError(f"agent socket path is {size} bytes, longer than a Unix socket "
                         f"allows ({MAX_PATH}): {result}")
    return result
