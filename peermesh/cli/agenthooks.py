"""The agent's event handlers (``--handler``) and web view (``--web``): options and start.

``add_options(parser)`` adds the options to ``peermesh agent``;
``AgentHooks.start(args, node)`` starts what they ask for on the agent's hub
and gives ``publish(event)`` (every event of the node) and ``close()``.
See ``peermesh.agent.handlers`` and ``peermesh.agent.web``.
"""

from __future__ import annotations

import os

from .output import PROG, clean, note

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without loading typing (``status``)
if TYPE_CHECKING:
    import argparse
    from typing import Any, Optional

__all__ = ["add_options", "AgentHooks", "status_rows", "TOKEN_ENV"]

#: environment variable holding the web view's token (instead of --web-token-file)
TOKEN_ENV = "PEERMESH_WEB_TOKEN"


def _handler(text: str) -> Any:
    """Option type of ``--handler``: ``[EVENTS=]COMMAND``."""
    import argparse

    from ..agent.handlers import parse_handler

    try:
        return parse_handler(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _listen(text: str) -> tuple[str, int]:
    """Option type of ``--web``: ``HOST:PORT`` or ``PORT``."""
    import argparse

    from ..config import parse_host_port

    try:
        return parse_host_port(text, "web view address")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_options(agent: argparse.ArgumentParser) -> None:
    """Add the handler and web view options to the ``agent`` parser."""
    from ..agent import handlers
    from ..argtypes import positive_count, seconds

    hooks = agent.add_argument_group("event handlers")
    hooks.add_argument(
        "--handler", dest="handlers", type=_handler, action="append", default=[],
        metavar="[EVENTS=]COMMAND",
        help="run COMMAND (with /bin/sh -c) for each event EVENTS selects (default every "
             "event): a comma-separated list of ENTER, EXIT, JOIN, LEAVE, WHISPER, SHOUT, "
             "EVASIVE, SILENT, LEADER, *; JOIN, LEAVE, SHOUT and LEADER may name a group "
             "(SHOUT:alerts). The event is in PEERMESH_EVENT, PEERMESH_PEER_NAME, "
             "PEERMESH_PEER_UUID, PEERMESH_GROUP ..., the message on stdin. Repeatable")
    hooks.add_argument("--handler-timeout", type=seconds, default=handlers.TIMEOUT,
                       metavar="SECONDS",
                       help="end a handler command that runs longer (default: %(default)g)")
    hooks.add_argument("--handler-concurrency", type=positive_count, default=1, metavar="N",
                       help="commands of one handler running at once (default 1: one after "
                            "the other, in the order of the events)")
    hooks.add_argument("--handler-queue", type=positive_count, default=handlers.QUEUE,
                       metavar="N", help="events waiting per handler; more are dropped and "
                                         "counted (default: %(default)s)")
    web = agent.add_argument_group("web view")
    web.add_argument("--web", type=_listen, metavar="HOST:PORT",
                     help="serve a live view of the mesh at http://HOST:PORT/ (PORT alone: "
                          "on 127.0.0.1; a loopback address unless --web-public)")
    web.add_argument("--web-public", action="store_true",
                     help="allow --web on an address other than loopback; the page then "
                          f"needs a token (--web-token-file, ${TOKEN_ENV}, or one made and "
                          "printed at start)")
    web.add_argument("--web-token-file", metavar="PATH",
                     help="read the web view's token from PATH (first line)")


def _token(args: argparse.Namespace) -> Optional[str]:
    """The web view's token from --web-token-file or the environment; None: make one."""
    if args.web_token_file:
        try:
            with open(args.web_token_file, encoding="utf-8") as f:
                token = f.readline().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --web-token-file {args.web_token_file}: "
                             f"{exc.strerror or exc}") from None
        if len(token) < 16:
            raise ValueError(f"the token in {args.web_token_file} is shorter than 16 characters")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


class AgentHooks:
    """The handlers and the web view of one agent (either may be absent)."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.web: Any = None

    @staticmethod
    def check(args: argparse.Namespace) -> None:
        """Refuse what cannot be served before anything starts (ValueError: usage)."""
        from ..agent.web import is_loopback

        if args.web is not None and not is_loopback(args.web[0]) and not args.web_public:
            raise ValueError(f"--web {args.web[0]}:{args.web[1]} is not a loopback address: "
                             "the page shows the mesh to whoever connects; add --web-public "
                             "to serve it there behind a token")
        if args.web is not None and (args.web_public or args.web_token_file):
            _token(args)

    @classmethod
    def start(cls, args: argparse.Namespace, node: Any) -> "AgentHooks":
        """Start what ``args`` asks for; ValueError (usage) or RuntimeError (cannot bind)."""
        hooks = cls()
        try:
            if args.web is not None:
                hooks._start_web(args, node)
            if args.handlers:
                from ..agent.client import resolve_path
                from ..agent.handlers import HandlerRunner

                hooks.runner = HandlerRunner(
                    args.handlers, concurrency=args.handler_concurrency,
                    timeout=args.handler_timeout, queue=args.handler_queue,
                    node_name=node.name, node_uuid=node.uuid.hex,
                    env={"PEERMESH_AGENT": resolve_path(args.agent)}).start()
        except BaseException:
            hooks.close()
            raise
        return hooks

    def _start_web(self, args: argparse.Namespace, node: Any) -> None:
        from ..agent.web import WebView

        host, port = args.web
        token = _token(args) if args.web_public or args.web_token_file else None
        try:
            self.web = WebView(node, host, port, public=args.web_public, token=token).start()
        except OSError as exc:
            raise RuntimeError(f"cannot serve the web view at {host}:{port}: "
                               f"{exc.strerror or exc}") from None
        shown = self.web.url if token is None else self.web.url.split("?")[0]
        note(f"web view at {shown}")
        if self.web.token and token is None:
            note(f"open it with its token: {self.web.url} (give one with --web-token-file "
                 f"or ${TOKEN_ENV} to keep it across restarts; see `{PROG} agent --help`)")

    def publish(self, event: Any) -> None:
        """Hand ``event`` to the handlers and the web view (never blocks)."""
        if self.runner is not None:
            self.runner.submit(event)
        if self.web is not None:
            self.web.publish(event)

    def stats(self) -> dict[str, Any]:
        """What ``status`` shows of them: handler counters, pages following the view."""
        result: dict[str, Any] = {}
        if self.runner is not None:
            result["handlers"] = self.runner.stats()
        if self.web is not None:
            result["web"] = {"url": self.web.url.split("?")[0], "pages": self.web.streams,
                             "refused": self.web.refused}
        return result

    def close(self) -> None:
        """Stop the web view and the handlers (commands still running are ended)."""
        if self.web is not None:
            self.web.close()
        if self.runner is not None:
            self.runner.close()


def status_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """Lines of ``peermesh status`` for the handlers and the web view an agent runs."""
    hooks = info.get("hooks")
    rows: list[tuple[str, str]] = []
    if not isinstance(hooks, dict):
        return rows
    handlers = hooks.get("handlers")
    if isinstance(handlers, dict):
        rows.append(("handlers", " ".join(f"{clean(str(k))}={v}" for k, v in handlers.items())))
    web = hooks.get("web")
    if isinstance(web, dict):
        rows.append(("web view", f"{clean(str(web.get('url')))} ({web.get('pages')} pages "
                                 f"following, {web.get('refused')} requests refused)"))
    return rows
