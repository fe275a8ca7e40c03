"""Broker services without sockets: FSS path safety and chunks, SID files, MMI authorisation."""

from __future__ import annotations

import base64
import builtins
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from peermesh.nfp.services import (NotAuthorised, authorise, fss_tasks, resolve_nf_url,
                                   sid_tasks, yaml_available)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "files"
    (base / "configs").mkdir(parents=True)
    (base / "configs" / "r1.txt").write_text("hostname r1\n")
    (tmp_path / "secret.txt").write_text("outside")
    os.symlink(tmp_path / "secret.txt", base / "escape.txt")
    return base


@pytest.mark.parametrize("url", ["nf://../../etc/passwd", "nf://../secret.txt",
                                 "nf://configs/../../secret.txt", "nf://escape.txt",
                                 "nf:///../etc/passwd", "nf://configs/\x00x",
                                 "file:///etc/passwd", "nf:/etc/passwd", "/etc/passwd"])
def test_paths_outside_the_root_are_refused(root: Path, url: str) -> None:
    with pytest.raises(ValueError):
        resolve_nf_url(root, url)
    tasks = fss_tasks(root)
    with pytest.raises(ValueError):
        tasks["fetch_file"](None, url)


def test_paths_inside_the_root(root: Path) -> None:
    assert resolve_nf_url(root, "nf://configs/r1.txt") == (root / "configs" / "r1.txt").resolve()
    assert resolve_nf_url(root, "nf:///configs/r1.txt") == (root / "configs/r1.txt").resolve()
    assert resolve_nf_url(root, "nf://configs/./x/../r1.txt").name == "r1.txt"
    assert resolve_nf_url(root, "nf://") == root.resolve()


def test_details_and_chunks_reassemble_with_checksums(root: Path) -> None:
    data = os.urandom(10_000)
    (root / "blob.bin").write_bytes(data)
    tasks = fss_tasks(root)
    details = tasks["file_details"](None, "nf://blob.bin", chunk_size=4096)
    assert details["size"] == 10_000 and details["chunks"] == 3
    assert details["sha256"] == hashlib.sha256(data).hexdigest()
    out = b""
    for i in range(details["chunks"]):
        part = tasks["fetch_file"](None, "nf://blob.bin", chunk=i, chunk_size=4096)
        piece = base64.b64decode(part["data"])
        assert hashlib.sha256(piece).hexdigest() == part["sha256"]
        assert part["eof"] == (i == 2)
        out += piece
    assert out == data
    assert tasks["list_files"](None, "nf://") == ["nf://blob.bin", "nf://configs/",
                                                  "nf://escape.txt"]
    with pytest.raises(ValueError):
        tasks["fetch_file"](None, "nf://blob.bin", chunk_size=0)
    with pytest.raises(FileNotFoundError):
        tasks["file_details"](None, "nf://nope")


def test_no_root_serves_nothing() -> None:
    with pytest.raises(LookupError):
        fss_tasks(None)["file_details"](None, "nf://x")


def test_sid_reads_json_and_yaml(tmp_path: Path) -> None:
    (tmp_path / "w1.json").write_text('{"hosts": ["r1", "r2"]}')
    (tmp_path / "w2.yaml").write_text("hosts:\n  - r3\n")
    tasks = sid_tasks(tmp_path)
    assert tasks["get_inventory"](None, name="w1") == {"hosts": ["r1", "r2"]}
    if yaml_available():
        assert tasks["get_inventory"](None, name="w2") == {"hosts": ["r3"]}
    assert tasks["list_inventory"](None) == ["w1", "w2"]
    for bad in ("../w1", "w1/..", "", ".hidden", None):
        with pytest.raises((ValueError, LookupError)):
            tasks["get_inventory"](None, name=bad)
    with pytest.raises(LookupError):
        tasks["get_inventory"](None, name="w3")


def test_sid_without_pyyaml_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "w2.yaml").write_text("hosts: [r3]\n")
    (tmp_path / "w1.json").write_text('{"a": 1}')
    real_import = builtins.__import__

    def no_yaml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "yaml":
            raise ImportError("no yaml here")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_yaml)
    tasks = sid_tasks(tmp_path)
    assert not yaml_available()
    assert tasks["get_inventory"](None, name="w1") == {"a": 1}
    with pytest.raises(RuntimeError, match="PyYAML"):
        tasks["get_inventory"](None, name="w2")


def test_destructive_mmi_needs_the_configured_token() -> None:
    with pytest.raises(NotAuthorised, match="no admin token"):
        authorise(None, "anything", "shutdown")
    with pytest.raises(NotAuthorised, match="wrong token"):
        authorise("s3cret", "guess", "shutdown")
    with pytest.raises(NotAuthorised):
        authorise("s3cret", None, "restart")
    authorise("s3cret", "s3cret", "restart")



def test_the_services_module_needs_neither_worker_nor_broker() -> None:
    """No import cycle: the worker and the broker import the services, not the reverse."""
    import ast
    import peermesh.nfp.services as services
    tree = ast.parse(Path(services.__file__).read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level == 1}
    assert imported.isdisjoint({"worker", "broker", "mesh", "client"}), imported
