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
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import peermesh.wire

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
    # a Content header's type and sequence: ``peermesh.wire.mtl.pack_command_head``
    "mtl/client.py": "MTL data command head",
    # the agent IPC's 4-octet length prefix (no wire module yet)
    "agent/client.py": "agent IPC length prefix",
    "agent/server.py": "agent IPC length prefix",
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


# --- no import circles ---------------------------------------------------------------

def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at ``path`` (a package: its ``__init__.py``)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports anywhere (behind
    ``TYPE_CHECKING`` and inside functions too); ``from package import x`` counts as
    an import of the submodule ``x`` when there is one, else of the package."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known or _is_extension(sub) else target)
    return {module for module in found if module in known and module != name}


def _is_extension(module: str) -> bool:
    """True for a compiled submodule of peermesh (``peermesh.io._zmqbatch``)."""
    *package, last = module.split(".")
    folder = PACKAGE_DIR.parent.joinpath(*package)
    return folder.is_dir() and any(p.suffix in (".so", ".pyd") for p in folder.glob(f"{last}.*"))


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package tree it imports."""
    paths = {module_name(p, root): p for p in root.rglob("*.py")}
    known = set(paths)
    return {name: imports_of(ast.parse(path.read_text(encoding="utf-8")), name,
                             path.name == "__init__.py", known)
            for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:  # iterative: no recursion limit
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_no_import_circles() -> None:
    assert circles(import_graph(PACKAGE_DIR)) == []


def test_circle_checker_sees_type_checking_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .a import A\n")
    (package / "sub" / "a.py").write_text("from .b import B\n")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .c import C\n")
    (package / "sub" / "c.py").write_text("def f():\n    from . import a\n")
    (package / "d.py").write_text("from .sub import A\n")   # into the circle, not part of it
    graph = import_graph(package)
    assert graph["pkg.sub.b"] == {"pkg.sub.c"} and graph["pkg.d"] == {"pkg.sub"}
    assert circles(graph) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.c"]]
