"""The package's layering is a test: no import cycles, and no layer imports one above it.

Every module of ``peermesh`` is read with ``ast``; every import counts,
relative or absolute, at module level or inside a function, except those
under ``if TYPE_CHECKING:`` (they never run). Layers, bottom up::

    errors, config, events, argtypes, counters, logs, core  <  wire  <  net  <  io  <  discovery
        <  zre, aio  <  overlay, metrics  <  sada, nfp, spark, sim  <  agent, cli (and every
        commands.py)

plus the package's own ``__init__``/``__main__`` on top. Modules of one layer
may import each other (but not in a cycle). ``from .. import __version__``
reads a constant of the package, which is always loaded before any of its
modules: dunder names of the package itself are not counted.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import peermesh

PACKAGE_DIR = Path(peermesh.__file__).resolve().parent

LAYERS: dict[str, int] = {
    "errors": 0, "config": 0, "events": 0, "argtypes": 0, "counters": 0, "storefile": 0,
    "logs": 0, "core": 0, "metrics": 6,
    "wire": 1, "net": 2, "io": 3, "discovery": 4, "zre": 5, "aio": 5, "overlay": 6,
    "sada": 7, "nfp": 7, "spark": 7, "sim": 7, "mtl": 7, "flux": 7,
    "agent": 8, "cli": 8,
}
TOP = 9  # peermesh/__init__.py and __main__.py
COMMANDS = 8  # an overlay's commands.py is part of the command line
#: the modules an overlay's ``commands`` (its parser) runs its actions in: command line too
COMMAND_MODULES = {
    "peermesh.flux.cliclient", "peermesh.flux.clientcommands", "peermesh.flux.runcommand",
    "peermesh.nfp.cliconfig", "peermesh.nfp.clientcommands", "peermesh.nfp.servecommands",
    "peermesh.mtl.passwords", "peermesh.mtl.usercommands", "peermesh.mtl.clientcommands",
    "peermesh.mtl.gatewaycommand",
}



def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST, type_checking: bool = False) -> Iterator[ast.AST]:
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` (with
    ``type_checking``: every node)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if not type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


#: compiled extensions (``peermesh/io/_zmqbatch.c`` is ``peermesh.io._zmqbatch``; the other
#: parts of it, ``_zmqbatch_zre.c`` and the like, name no module anyone imports): leaves
#: that import nothing of peermesh, so never part of a cycle or of a layer's imports
EXTENSIONS = {module_name(p.with_suffix(".py")) for p in PACKAGE_DIR.rglob("*.c")}


def _resolve(name: str) -> str | None:
    """The module of ``peermesh`` that ``name`` is, or lives in; None if outside."""
    if name in EXTENSIONS:
        return None
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, source: str, type_checking: bool = False) -> set[str]:
    """The ``peermesh`` modules that ``module`` (with this source) imports at run time
    (with ``type_checking``: also those it imports under ``if TYPE_CHECKING:``)."""
    is_package = MODULES.get(module, Path()).name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(source), type_checking):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # "from pkg import name": name may be a submodule or an attribute of pkg
            names = [f"{stem}.{alias.name}" for alias in node.names
                     if not (stem == "peermesh" and alias.name.startswith("__"))]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return TOP
    if (parts[-1] == "commands" and len(parts) == 3) or module in COMMAND_MODULES:
        return COMMANDS
    return LAYERS[parts[1]]


GRAPH: dict[str, set[str]] = {m: imports_of(m, p.read_text(encoding="utf-8"))
                              for m, p in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Every strongly connected group of two or more modules (Tarjan), as sorted tuples."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.add(tuple(sorted(group)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_top_level_part_has_a_layer() -> None:
    for module in MODULES:
        layer(module)  # KeyError names a new part that needs a place


def test_no_import_cycles() -> None:
    found = cycles(GRAPH)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in sorted(found))


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {("a", "b", "c")}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_layer_imports_a_layer_above_it(module: str) -> None:
    above = sorted(t for t in GRAPH[module] if layer(t) > layer(module))
    assert not above, f"{module} (layer {layer(module)}) imports " + ", ".join(
        f"{t} (layer {layer(t)})" for t in above)


def test_checker_reads_every_kind_of_import() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import peermesh.wire.zre\n"
        "from ..net import interfaces\n"
        "from . import session\n"
        "from .peer import PeerLink\n"
        "def later():\n"
        "    from ..io.transport import ZmqTransport\n"
        "from .. import __version__\n"
        "if TYPE_CHECKING:\n"
        "    from ..sim.network import SimNetwork\n"
        "else:\n"
        "    from ..events import Event\n"
    )
    assert imports_of("peermesh.zre.node", source) == {
        "peermesh.wire.zre", "peermesh.net.interfaces", "peermesh.zre.session",
        "peermesh.zre.peer", "peermesh.io.transport", "peermesh.events"}


def test_cycle_finder_finds_a_three_module_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == {("a", "b", "c")}


# --------------------------------------------------------------------------
# What a plain node loads (its memory: scripts/bench_mesh.py reports it idle)

#: modules a node without keys, on beacons, never needs
NOT_FOR_A_PLAIN_NODE = ("asyncio", "msgpack", "zeroconf", "pathlib", "ctypes", "subprocess",
                        "peermesh.io.curve",
                        "peermesh.io.zap", "peermesh.io.keys", "peermesh.zre.curve",
                        "peermesh.discovery.mdns", "peermesh.overlay", "peermesh.sada",
                        "peermesh.nfp", "peermesh.flux", "peermesh.mtl", "peermesh.sim",
                        "peermesh.agent", "peermesh.cli", "peermesh.spark")

PLAIN_NODE = """
import json, sys
before = set(sys.modules)
import gevent
from peermesh import EventType, Node
node = Node("plain", interface="lo", port=int(sys.argv[1])).start()
gevent.sleep(0.2)
node.stop()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def test_a_plain_node_loads_only_what_it_needs(free_udp_port: int) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERMESH_")}
    # -S: what site's .pth files load (pathlib, say) is not counted as the node's
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_DIR.parent), *sys.path[1:]])
    done = subprocess.run([sys.executable, "-S", "-c", PLAIN_NODE, str(free_udp_port)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.splitlines()[-1])
    wrong = [m for m in loaded if m.split(".")[0] in NOT_FOR_A_PLAIN_NODE
             or any(m == n or m.startswith(n + ".") for n in NOT_FOR_A_PLAIN_NODE)]
    assert wrong == []


def test_command_modules_exist() -> None:
    assert COMMAND_MODULES <= set(MODULES), sorted(COMMAND_MODULES - set(MODULES))
