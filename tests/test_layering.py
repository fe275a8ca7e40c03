"""The wire layer is sans-io: no module under peermesh/wire/ may import I/O or
concurrency machinery (sockets, event loops, threads, clocks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import peermesh.wire

WIRE_DIR = Path(peermesh.wire.__file__).resolve().parent
FORBIDDEN = frozenset({"zmq", "gevent", "socket", "select", "threading", "asyncio", "time"})
WIRE_MODULES = sorted(WIRE_DIR.rglob("*.py"))


def imported_top_level_names(tree: ast.AST) -> set[str]:
    """Top-level names of every absolute import in ``tree`` (anywhere, not just module level)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
              and (getattr(node.func, "id", None) == "__import__"
                   or getattr(node.func, "attr", None) == "import_module")
              and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value.split(".")[0])
    return names


def test_wire_modules_exist() -> None:
    assert any(path.name == "zre.py" for path in WIRE_MODULES), WIRE_MODULES


@pytest.mark.parametrize("path", WIRE_MODULES, ids=lambda p: str(p.relative_to(WIRE_DIR)))
def test_wire_module_is_sans_io(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    bad = imported_top_level_names(tree) & FORBIDDEN
    assert not bad, f"{path} imports {sorted(bad)}"


def test_checker_detects_forbidden_imports() -> None:
    source = (
        "import zmq.green as zmq\n"
        "from gevent import socket\n"
        "def f():\n"
        "    import time\n"
        "from . import select\n"          # relative: a sibling module, allowed
        "import datetime\n"
    )
    found = imported_top_level_names(ast.parse(source)) & FORBIDDEN
    assert found == {"zmq", "gevent", "time"}
