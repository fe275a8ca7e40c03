"""MkDocs hook: the command-line reference, generated from the real argument parser.

``docs/cli.md`` holds the marker below; at build time it is replaced by the
``--help`` of ``peermesh`` and of every subcommand, found by walking the
subparsers of ``peermesh.cli.commands.build_parser()``. The page can
therefore never drift from the code.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Iterator

MARKER = "<!-- peermesh-cli-reference -->"
WIDTH = "96"  # columns argparse wraps the help to, whatever terminal runs the build


def commands(parser: argparse.ArgumentParser,
             path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
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


def reference() -> str:
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


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill the marker of the CLI page."""
    if MARKER in markdown:
        return markdown.replace(MARKER, reference())
    return markdown
