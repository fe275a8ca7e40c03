"""Per-key grants on a mesh with keys: tasks and FSS files a public key may use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from peermesh import Node
from peermesh.nfp import NfpNode
from peermesh.nfp.grants import Grants, GrantsError, parse
from peermesh.wire.nfp import Status

from .conftest import wait_until
from .test_curve_nfp import KeyedMesh


@pytest.fixture
def keyed(free_udp_port: int, tmp_path: Path) -> Iterator[KeyedMesh]:
    mesh = KeyedMesh(free_udp_port, tmp_path)
    yield mesh
    mesh.close()


def write_grants(mesh: KeyedMesh, grants: dict[str, dict[str, list[str]]]) -> str:
    """A grants file giving each named key its tasks and files."""
    path = mesh.ring.root / "grants.toml"
    lines = []
    for name, granted in grants.items():
        lines.append("[[grant]]")
        lines.append(f'keys = ["{mesh.ring.public(name).decode()}"]')
        lines.extend(f"{field} = {value!r}".replace("'", '"') for field, value in granted.items())
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def wait_for_w1(client: NfpNode, broker: NfpNode | None) -> None:
    if broker is not None:
        wait_until(lambda: client.current_broker is not None, 5, "broker elected")
        wait_until(lambda: len(broker.broker.dispatcher.services.get(  # type: ignore
            "svc", {})) >= 1, 5, "w1 registered with the broker")
    else:
        wait_until(lambda: "w1" in client.client.direct_workers().get("svc", []), 5, "w1")


@pytest.mark.parametrize("brokered", [False, True], ids=["direct", "brokered"])
def test_tasks_are_granted_per_key(keyed: KeyedMesh, brokered: bool) -> None:
    grants = write_grants(keyed, {"boss": {"tasks": ["svc/*"]},
                                  "reader": {"tasks": ["svc/echo"]}})
    keyed.add("w1", workers=(("svc", "w1"),), grants=grants)
    broker = keyed.add("broker", broker="always") if brokered else None
    boss, reader, other = keyed.add("boss"), keyed.add("reader"), keyed.add("other")
    for client in (boss, reader, other):
        wait_for_w1(client, broker)

    def run(client: NfpNode, task: str, *args: Any) -> Any:
        return client.client.run("svc", task, list(args), target="w1", timeout=5)

    assert run(boss, "echo", 1).body["workers"]["w1"]["result"]["args"] == [1]
    assert run(boss, "fail").body["workers"]["w1"]["failed"]        # ran: granted
    assert run(reader, "echo", 2).status is Status.OK
    for client, task in ((reader, "fail"), (other, "echo")):
        refused = client.client.post("svc", task, [], target="w1", timeout=5)
        assert refused.status is Status.ERROR, refused
        assert f"svc/{task} is not granted to the caller's key" in str(refused.body)
    worker = keyed.members[0][1].workers[0]
    assert worker.stats["not_granted"] == 2
    assert worker.stats["accepted"] == 3          # refused POSTs are not stored
    # reading the management interface stays anyone's
    assert other.client.run("mmi.service.worker", "show_workers", target="w1",
                            timeout=5).status is Status.OK


def test_fss_files_are_granted_per_key(keyed: KeyedMesh) -> None:
    files = keyed.ring.root / "files"
    (files / "public").mkdir(parents=True)
    (files / "public" / "a.txt").write_text("public")
    (files / "secret.txt").write_text("secret")
    fss = ["fss.service.broker/*"]
    grants = write_grants(keyed, {"boss": {"tasks": fss, "files": ["nf://public",
                                                                   "nf://public/*"]},
                                  "other": {"tasks": fss}})
    broker = keyed.add("broker", broker="always", grants=grants, files_root=str(files))
    boss, other = keyed.add("boss"), keyed.add("other")
    for client in (boss, other):
        wait_until(lambda: client.current_broker is not None, 5, "broker elected")

    def fss_call(client: NfpNode, task: str, url: str) -> dict[str, Any]:
        reply = client.client.run("fss.service.broker", task, kwargs={"url": url},
                                  target="any", timeout=5)
        (entry,) = reply.body["workers"].values()
        return entry

    assert fss_call(boss, "list_files", "nf://public")["result"] == ["nf://public/a.txt"]
    assert fss_call(boss, "fetch_file", "nf://public/../public/a.txt")["result"]["size"] == 6
    for client, task, url in ((boss, "fetch_file", "nf://secret.txt"),
                              (boss, "list_files", "nf://"),
                              (boss, "fetch_file", "nf://public/../secret.txt"),
                              (other, "fetch_file", "nf://public/a.txt")):
        refused = fss_call(client, task, url)
        assert refused["failed"], (client, task, url)
        assert "is not granted to the caller's key" in refused["errors"][0]
    assert broker.is_broker


def test_grants_file_is_checked_and_reloaded(tmp_path: Path) -> None:
    key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
    assert parse(f'[[grant]]\nkeys = ["{key}"]\ntasks = ["a/*"]\n[[grant]]\n'
                 f'keys = ["{key}"]\nfiles = ["nf://x"]\n') == {
        key.encode(): (("a/*",), ("nf://x",), False)}
    for text, message in (("[[grant]]\nkeys = []\n", "at least one Z85 public key"),
                          ('[[grant]]\nkeys = ["short"]\n', "not a Z85 public key"),
                          (f'[[grant]]\nkeys = ["{key}"]\ntask = ["a"]\n', "unknown field"),
                          (f'[[grant]]\nkeys = ["{key}"]\ntasks = "a"\n', "list of"),
                          ("[grants]\n", "unknown table"), ("[[grant]\n", "not TOML")):
        with pytest.raises(GrantsError, match=message):
            parse(text)
    with pytest.raises(GrantsError, match="cannot read grants file"):
        Grants(tmp_path / "missing.toml")
    path = tmp_path / "grants.toml"
    path.write_text(f'[[grant]]\nkeys = ["{key}"]\ntasks = ["a/*"]\n')
    grants = Grants(path)
    assert grants.allows_task(key, "a", "t") and not grants.allows_task(key, "b", "t")
    assert not grants.allows_task(None, "a", "t")
    assert grants.allows_task(None, "mmi.service.worker", "show_workers")
    path.write_text(f'[[grant]]\nkeys = ["{key}"]\ntasks = ["b/*"]\n')
    os.utime(path, ns=(1, 1))             # (a change within one clock tick shows too)
    grants.reload()
    assert grants.allows_task(key, "b", "t") and not grants.allows_task(key, "a", "t")
    path.write_text("not toml [")
    os.utime(path, ns=(2, 2))
    grants.reload()                       # logged; the previous grants stay
    assert grants.allows_task(key, "b", "t")


def test_grants_need_a_node_with_keys(tmp_path: Path, free_udp_port: int) -> None:
    node = Node("plain", interface="lo", port=free_udp_port)
    with pytest.raises(ValueError, match="grants need a node with keys"):
        NfpNode(node, data_dir=tmp_path, grants=tmp_path / "grants.toml")
