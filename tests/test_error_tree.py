"""The error tree: one root per overlay under ``PeermeshError``, names that keep working,
and the tree docs/api.md shows is the package's own.

The classes are collected in a child process that imports every module of
``peermesh`` (so that importing them all has no effect on this one).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

import peermesh
from peermesh import errors
from peermesh.flux.errors import FluxError, FluxOverlayError, FluxStateError
from peermesh.flux.topology import TopologyError
from peermesh.mtl import client
from peermesh.mtl.credentials import CredentialsError
from peermesh.mtl.errors import MtlError
from peermesh.mtl.store import StoreFull
from peermesh.nfp.errors import NfpError
from peermesh.sada.errors import EndpointError, SadaError, ServerLost
from peermesh.spark.errors import SparkError

ROOT = Path(__file__).resolve().parent.parent


class Entry(NamedTuple):
    """A public error class: where it is defined, its parent in the tree (its first base
    that is a ``PeermeshError``) and its other ``PeermeshError`` bases."""

    module: str
    parent: str
    also: tuple[str, ...]


COLLECT = """
import importlib, json, pkgutil, peermesh
from peermesh.errors import PeermeshError
for info in pkgutil.walk_packages(peermesh.__path__, "peermesh."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
seen, stack, out = set(), [PeermeshError], {}
while stack:
    cls = stack.pop()
    for sub in cls.__subclasses__():
        if sub in seen:
            continue
        seen.add(sub)
        stack.append(sub)
        if sub.__name__.startswith("_"):
            continue
        bases = [b.__name__ for b in sub.__bases__ if issubclass(b, PeermeshError)]
        assert sub.__name__ not in out, f"two error classes named {sub.__name__}"
        out[sub.__name__] = [sub.__module__, bases[0], bases[1:]]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def package_tree() -> dict[str, Entry]:
    done = subprocess.run([sys.executable, "-c", COLLECT], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return {name: Entry(module, parent, tuple(also))
            for name, (module, parent, also) in json.loads(done.stdout).items()}


def documented_tree() -> dict[str, Entry]:
    """The tree in docs/api.md's Errors section, read from its box-drawing lines."""
    page = (ROOT / "docs" / "api.md").read_text()
    block = page.split("## Errors", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    line_re = re.compile(r"^(?P<indent>[│├└─ ]*)(?P<name>\w+) \((?P<module>[\w.]+)"
                         r"(?:; also a (?P<also>[\w, ]+))?\)$")
    tree: dict[str, Entry] = {}
    path: list[str] = []
    for line in block.splitlines():
        found = line_re.match(line)
        assert found, f"docs/api.md: not a line of the error tree: {line!r}"
        depth = len(found["indent"]) // 4
        del path[depth:]
        if path:
            also = tuple(found["also"].split(", ")) if found["also"] else ()
            tree[found["name"]] = Entry(found["module"], path[-1], also)
        path.append(found["name"])
    return tree


def test_the_docs_show_the_package_error_tree(package_tree: dict[str, Entry]) -> None:
    documented = documented_tree()
    missing = sorted(set(package_tree) - set(documented))
    extra = sorted(set(documented) - set(package_tree))
    assert not missing and not extra, f"not in docs/api.md: {missing}; gone: {extra}"
    wrong = {name: (documented[name], entry) for name, entry in package_tree.items()
             if documented[name] != entry}
    assert not wrong, f"docs/api.md says (first), the package has (second): {wrong}"


def test_the_tree_reader_sees_a_misplaced_class() -> None:
    documented = documented_tree()
    assert documented["ServerLost"] == Entry("peermesh.sada.errors", "RequestTimeout", ())
    assert documented["EndpointError"].also == ("BindError",)
    assert documented["LocalProtocolError"].parent == "ProtocolError"


#: each overlay's package and its one root
ROOTS = {"peermesh.sada.": SadaError, "peermesh.mtl.": MtlError,
         "peermesh.flux.": FluxOverlayError, "peermesh.nfp.": NfpError,
         "peermesh.spark.": SparkError}


@pytest.mark.parametrize("prefix", sorted(ROOTS))
def test_an_overlay_has_one_root(package_tree: dict[str, Entry], prefix: str) -> None:
    root = ROOTS[prefix].__name__
    mine = {name: entry for name, entry in package_tree.items()
            if entry.module.startswith(prefix)}
    assert root in mine and mine[root].parent == "PeermeshError"

    def ancestors(name: str) -> list[str]:
        chain = [name]
        while chain[-1] in package_tree:
            chain.append(package_tree[chain[-1]].parent)
        return chain

    strays = [name for name in mine if root not in ancestors(name)]
    assert not strays, f"{strays} are not a {root}"


def test_existing_names_keep_working() -> None:
    assert issubclass(errors.LocalProtocolError, errors.ProtocolError)
    assert issubclass(errors.RemoteProtocolError, errors.ProtocolError)
    assert peermesh.LocalProtocolError is errors.LocalProtocolError
    assert peermesh.RemoteProtocolError is errors.RemoteProtocolError
    remote = errors.RemoteProtocolError("short frame")
    assert isinstance(remote, peermesh.PeermeshError) and remote.reason == "short frame"
    for cls in (FluxError, FluxStateError, TopologyError):
        assert issubclass(cls, FluxOverlayError)
    assert issubclass(TopologyError, ValueError)
    assert FluxError(38, topic="x.y").errnum == 38
    for cls in (client.ClientError, client.GatewayUnavailable, client.AuthenticationFailed,
                client.RequestRefused, CredentialsError, StoreFull):
        assert issubclass(cls, MtlError)
    assert issubclass(EndpointError, SadaError) and issubclass(ServerLost, SadaError)
    refused = client.RequestRefused("Summon 'chat'", 403, "not yours")
    assert (refused.status, refused.reason) == (403, "not yours")
    for root in (NfpError, SparkError, MtlError, FluxOverlayError, SadaError):
        assert root.__bases__ == (errors.PeermeshError,)
