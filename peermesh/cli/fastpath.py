"""The fast path: ``peers``, ``shout`` and ``whisper`` through the agent without argparse.

A plain command line (the command, its positionals, ``--agent PATH`` and
``--json`` for peers) is read here, and when an agent answers the command
runs at once; anything else, or no agent, goes through ``build_parser``. A
command through the agent so loads only msgpack and
``peermesh.agent.client``: argparse, pyzmq, gevent, the node, the config
machinery, logging and the overlays' commands are imported where needed.
"""

from __future__ import annotations

from .meshcommands import WAIT_PEERS, WAIT_SEND, cmd_peers, cmd_shout, cmd_whisper

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing at run time
if TYPE_CHECKING:
    from typing import Any, Optional, Sequence

__all__ = ["plain_agent_args", "probe_agent", "PLAIN"]

#: commands whose plain form (positionals, --agent PATH and these flags) skips argparse
PLAIN: dict[str, tuple[tuple[str, ...], frozenset[str], float]] = {
    "peers": ((), frozenset({"--json"}), WAIT_PEERS),
    "shout": (("target", "message"), frozenset(), WAIT_SEND),
    "whisper": (("target", "message"), frozenset(), WAIT_SEND),
}


def plain_agent_args(argv: Sequence[str]) -> Optional[Any]:
    """The arguments of ``peers``, ``shout`` or ``whisper`` in their plain form, or None.

    Plain: the command first, its positionals, ``--agent PATH`` and ``--json``
    (peers) and nothing else that starts with "-". The result has every
    attribute the command reads when it goes through the agent, with
    argparse's defaults; anything else (and a plain command that finds no
    agent) goes through argparse, so both read a command line the same way.
    """
    from types import SimpleNamespace

    if not argv or argv[0] not in PLAIN:
        return None
    names, flags, wait = PLAIN[argv[0]]
    positionals: list[str] = []
    found: dict[str, Any] = {"agent": None, **{flag[2:]: False for flag in flags}}
    tokens = iter(argv[1:])
    for token in tokens:
        if token in flags:
            found[token[2:]] = True
        elif token == "--agent":
            found["agent"] = next(tokens, None)
            if found["agent"] is None:
                return None
        elif token.startswith("--agent="):
            found["agent"] = token[len("--agent="):]
        elif token.startswith("-"):
            return None
        else:
            positionals.append(token)
    if len(positionals) != len(names) or found["agent"] == "" \
            or not all(p.strip() and p.isprintable() for p in positionals[:1]):
        return None  # argparse says what is wrong with it
    return SimpleNamespace(
        command=argv[0], handler=PLAIN_HANDLERS[argv[0]], agent_first=True, node_options=True,
        verbose=0, wait=wait, no_agent=False, interface=None, port=None,
        **dict(zip(names, positionals)), **found)


def probe_agent(path: Optional[str]) -> Any:
    """A connected ``AgentClient``, the ``NoAgent`` saying why not, or None (a bad path:
    argparse's path reports it)."""
    from ..agent.client import AgentClient, NoAgent, resolve_path

    try:
        return AgentClient.connect(resolve_path(path))
    except NoAgent as exc:
        return exc
    except ValueError:
        return None


#: the commands ``plain_agent_args`` reads
PLAIN_HANDLERS = {"peers": cmd_peers, "shout": cmd_shout, "whisper": cmd_whisper}
