"""The layering holds.

* The wire layer is sans-io: no module under peermesh/wire/ may import I/O or
  concurrency machinery (sockets, event loops, threads, clocks).
* Every byte is framed in wire/: outside peermesh/wire/ no module imports
  ``struct`` (``import struct``, ``from struct import ...``) or calls
  ``to_bytes``/``from_bytes`` (``int.to_bytes``, ``int.from_bytes``, on any
  object), except the few listed in ``NOT_WIRE_FRAMING`` (bytes of the kernel's
  or libzmq's ABI, arithmetic on addresses: not a peer protocol) and in
  ``NOT_YET_IN_WIRE``. Other byte work (slicing, ``bytes((n,))``, comparing
  prefixes the wire modules export) is not checked.
* No import circles between the modules of peermesh, counting every import:
  at module level, inside functions and behind ``TYPE_CHECKING`` (a circle the
  type checker sees is still two modules that cannot be read apart).
* No module over ``LONG_MODULE`` lines without a reason: its docstring has a
  line starting ``Kept whole:`` that says why it is one job, except the few
  listed in ``LONG_WITHOUT_REASON``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import peermesh.wire
from test_imports import MODULES, cycles, imports_of

WIRE_DIR = Path(peermesh.wire.__file__).resolve().parent
FORBIDDEN = frozenset({"zmq", "gevent", "socket", "select", "threading", "asyncio", "time"})
WIRE_MODULES = sorted(WIRE_DIR.rglob("*.py"))
PACKAGE_DIR = WIRE_DIR.parent
#: modules outside wire/ that may use ``struct`` / ``to_bytes`` / ``from_bytes``: none of
#: them frames a peer protocol
NOT_WIRE_FRAMING = {
    # the kernel's rtnetlink messages (reading interface addresses), the OS's ABI
    "net/netlink.py": "kernel ABI",
    # IPv4 addresses and netmasks as integers (broadcast address arithmetic)
    "net/interfaces.py": "address arithmetic",
    # libzmq's socket-monitor events and the kernel's struct tcp_info
    "io/connections.py": "libzmq and kernel ABI",
    # libzmq's socket-monitor events
    "sada/_transport.py": "libzmq ABI",
    # IP_PKTINFO ancillary data (struct in_pktinfo) the simulated kernel hands back
    "sim/network.py": "kernel ABI",
    # a content id's two numbers (origin, id) as the store's 16-octet key; the wire
    # carries content ids as opaque 16-octet frames (peermesh.wire.mtl_replication)
    "mtl/store.py": "storage key",
}
#: framing still outside wire/, each with the helper it is to use instead: remove the
#: entry when the module moves (``test_exceptions_are_still_needed`` says when)
NOT_YET_IN_WIRE = {
}


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


# --- every byte in wire/ -----------------------------------------------------------

def framing_uses(tree: ast.AST) -> list[str]:
    """What in ``tree`` frames bytes outside wire/: ``struct`` imports and
    ``to_bytes``/``from_bytes`` calls, as "line: what"."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "struct"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 \
                and (node.module or "").split(".")[0] == "struct":
            found.append(f"{node.lineno}: from struct import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("to_bytes", "from_bytes"):
            found.append(f"{node.lineno}: {node.func.attr}")
    return sorted(found, key=lambda use: int(use.partition(":")[0]))


OUTSIDE_WIRE = sorted(p for p in PACKAGE_DIR.rglob("*.py") if WIRE_DIR not in p.parents)


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE_DIR).as_posix()


@pytest.mark.parametrize("path", OUTSIDE_WIRE, ids=_relative)
def test_no_framing_outside_wire(path: Path) -> None:
    name = _relative(path)
    if name in NOT_WIRE_FRAMING or name in NOT_YET_IN_WIRE:
        return
    found = framing_uses(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    assert not found, f"{name} frames bytes outside peermesh/wire/: {found}"


def test_exceptions_are_still_needed() -> None:
    for name in (*NOT_WIRE_FRAMING, *NOT_YET_IN_WIRE):
        path = PACKAGE_DIR / name
        assert path.exists(), f"{name} is gone: drop its exception"
        assert framing_uses(ast.parse(path.read_text(encoding="utf-8"))), \
            f"{name} frames nothing any more: drop its exception"


def test_framing_checker_detects_struct_and_to_bytes() -> None:
    source = (
        "import struct\n"
        "from struct import pack\n"
        "def f(n):\n"
        "    return n.to_bytes(8, 'big') + bytes((1,))\n"
        "x = int.from_bytes(b'ab', 'big')\n"
        "from .struct import y\n"          # relative: a sibling module, not the stdlib's
    )
    assert framing_uses(ast.parse(source)) == [
        "1: import struct", "2: from struct import", "4: to_bytes", "5: from_bytes"]


# --- no import circles, also behind TYPE_CHECKING --------------------------------------

def test_no_import_circles_also_behind_type_checking() -> None:
    # (test_imports checks the imports that run: these are all of them)
    graph = {module: imports_of(module, path.read_text(encoding="utf-8"), type_checking=True)
             for module, path in MODULES.items()}
    found = cycles(graph)
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in sorted(found))


def test_circle_checker_reads_type_checking_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .outputs import Send\n"
        "if TYPE_CHECKING:\n"
        "    from .membership import Child\n"
    )
    assert imports_of("peermesh.flux.routing", source) == {"peermesh.flux.outputs"}
    assert imports_of("peermesh.flux.routing", source, type_checking=True) == {
        "peermesh.flux.outputs", "peermesh.flux.membership"}


# --- no long module without a reason -------------------------------------------------

#: lines over which a module must say, in a docstring line starting ``KEPT_WHOLE``, why
#: it is one job and stays whole
LONG_MODULE = 600
KEPT_WHOLE = "Kept whole:"
#: long modules without that line, each with why: remove the entry when the module is
#: split or says why it stays whole (``test_long_module_exceptions_are_still_needed``)
LONG_WITHOUT_REASON: dict[str, str] = {}


def kept_whole(source: str, c: bool = False) -> bool:
    """Whether the module docstring of ``source`` (``c``: its opening ``/* */`` comment, a
    line's leading `` * `` aside) has a line starting ``KEPT_WHOLE``."""
    if c:
        opening = source.partition("*/")[0] if source.lstrip().startswith("/*") else ""
        lines = [line.strip().lstrip("/*").strip() for line in opening.splitlines()]
    else:
        lines = (ast.get_docstring(ast.parse(source)) or "").splitlines()
    return any(line.startswith(KEPT_WHOLE) for line in lines)


def _long(path: Path) -> bool:
    return len(path.read_text(encoding="utf-8").splitlines()) > LONG_MODULE


ALL_MODULES = sorted([*PACKAGE_DIR.rglob("*.py"), *PACKAGE_DIR.rglob("*.c")])


@pytest.mark.parametrize("path", [p for p in ALL_MODULES if _long(p)], ids=_relative)
def test_long_module_says_why_it_stays_whole(path: Path) -> None:
    name = _relative(path)
    if name in LONG_WITHOUT_REASON:
        return
    assert kept_whole(path.read_text(encoding="utf-8"), c=path.suffix == ".c"), (
        f"{name} has over {LONG_MODULE} lines: split it by concern, or say why it is one "
        f"job in a docstring (C: opening comment) line starting {KEPT_WHOLE!r}")


def test_long_module_exceptions_are_still_needed() -> None:
    for name in LONG_WITHOUT_REASON:
        path = PACKAGE_DIR / name
        assert path.exists(), f"{name} is gone: drop its exception"
        assert _long(path), f"{name} is no longer long: drop its exception"
        assert not kept_whole(path.read_text(encoding="utf-8"), c=path.suffix == ".c"), \
            f"{name} says why it stays whole: drop its exception"


def test_kept_whole_checker_reads_the_module_docstring_only() -> None:
    assert kept_whole('"""One job.\n\nKept whole: one state machine.\n"""\n')
    assert not kept_whole('"""One job, kept whole: said mid-line."""\n')
    assert not kept_whole('x = 1\n"""Kept whole: not the module docstring."""\n')
    assert not kept_whole('def f():\n    """Kept whole: a function\'s."""\n')


def test_kept_whole_checker_reads_a_c_files_opening_comment_only() -> None:
    assert kept_whole("/*\n * One job.\n * Kept whole: one table.\n */\nint x;\n", c=True)
    assert kept_whole("/* Kept whole: said on the first line. */\n", c=True)
    assert not kept_whole("/*\n * One job, kept whole: mid-line.\n */\n", c=True)
    assert not kept_whole("int x;\n/* Kept whole: not the opening comment. */\n", c=True)
    assert not kept_whole("/* One job. */\n/* Kept whole: a later comment. */\n", c=True)
