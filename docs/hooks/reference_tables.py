"""MkDocs hook: reference tables generated from the code, so the pages never drift.

* ``<!-- peermesh-cli-reference -->`` becomes the ``--help`` of ``peermesh``
  and of every subcommand, found by walking the subparsers of
  ``peermesh.cli.commands.build_parser()``.
* ``<!-- peermesh-config-table -->`` becomes one row per ``NodeConfig`` field:
  its name, default and the ``#:`` comment above it in ``peermesh/config.py``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Iterator

CLI_MARKER = "<!-- peermesh-cli-reference -->"
CONFIG_MARKER = "<!-- peermesh-config-table -->"
WIDTH = "96"  # columns argparse wraps the help to, whatever terminal runs the build


Command = tuple[tuple[str, ...], argparse.ArgumentParser]


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Command]:
    """(command words, parser) for ``parser`` and, depth first, every subcommand below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a command already listed
                    continue
                seen.add(id(sub))
                yield from commands(sub, (*path, name))


def cli_reference() -> str:
    """Markdown: one section per command, its help text as printed by ``--help``."""
    os.environ["COLUMNS"] = WIDTH
    from peermesh.cli.commands import build_parser

    parts = []
    for path, parser in commands(build_parser()):
        title = " ".join(("peermesh", *path))
        level = "#" * min(2 + max(len(path) - 1, 0), 4)
        help_text = parser.format_help().rstrip()
        parts.append(f"{level} `{title}`\n\n```text\n{help_text}\n```\n")
    return "\n".join(parts)


def config_table() -> str:
    """Markdown table of the node settings, from the dataclass and its comments."""
    import dataclasses
    import inspect

    from peermesh.config import NodeConfig

    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in inspect.getsource(NodeConfig).splitlines():
        text = line.strip()
        if text.startswith("#:"):
            pending.append(text[2:].strip())
        elif pending and ":" in text:
            comments[text.split(":", 1)[0].strip()] = " ".join(pending)
            pending = []
        else:
            pending = []
    defaults = NodeConfig()
    rows = ["| setting | default | variable | meaning |", "| --- | --- | --- | --- |"]
    for field in dataclasses.fields(NodeConfig):
        value = getattr(defaults, field.name)
        shown = list(value) if isinstance(value, tuple) else dict(value) \
            if field.name == "headers" else value
        meaning = comments.get(field.name, "").replace("|", "\\|")
        rows.append(f"| `{field.name}` | `{shown!r}` | `PEERMESH_{field.name.upper()}` "
                    f"| {meaning} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill the markers of the generated pages."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_table())
    return markdown
