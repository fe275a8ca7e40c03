"""The ``peermesh`` command: one parser, one signal-handling session per command."""

from .commands import main

__all__ = ["main"]
