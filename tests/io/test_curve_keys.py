"""CURVE key files: the certificate format ZeroMQ's zcert writes, modes, and clear errors."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
from zmq.utils import z85

from peermesh.cli.commands import main
from peermesh.io.keys import (Keypair, KeyFileError, generate, load_keypair, load_public_key,
                              write_keypair)

# A secret certificate laid out as CZMQ's zcert_save_secret writes it (keys filled in).
CZMQ_SECRET = """\
#   ****  Generated on 2024-05-01 10:00:00 by CZMQ  ****
#   ZeroMQ CURVE **Secret** Certificate
#   DO NOT PROVIDE THIS FILE TO OTHER USERS nor change its permissions.

metadata
    name = "zyre node"
curve
    public-key = "{public}"
    secret-key = "{secret}"
"""


@pytest.fixture
def umask_000():
    old = os.umask(0)
    yield
    os.umask(old)


def test_written_files_load_back_and_match_zcert_layout(tmp_path: Path, umask_000: None) -> None:
    keypair = generate()
    public, secret = write_keypair(tmp_path / "node.key", keypair, {"name": "alice"})
    assert (public, secret) == (str(tmp_path / "node.key"), str(tmp_path / "node.key_secret"))
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(public).st_mode) == 0o644
    assert load_keypair(secret) == keypair
    assert load_public_key(public) == keypair.public
    assert load_public_key(secret) == keypair.public
    text = Path(public).read_text()
    assert "secret-key" not in text and keypair.secret.decode() not in text
    body = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert body == ["metadata", '    name = "alice"', "curve",
                    f'    public-key = "{keypair.public.decode()}"']
    assert len(keypair.public_raw) == 32 and z85.encode(keypair.public_raw) == keypair.public


def test_reads_a_czmq_certificate(tmp_path: Path) -> None:
    public, secret = zmq.curve_keypair()
    path = tmp_path / "zyre.cert_secret"
    path.write_text(CZMQ_SECRET.format(public=public.decode(), secret=secret.decode()))
    path.chmod(0o600)
    assert load_keypair(path) == Keypair(public, secret)


def test_does_not_overwrite_unless_asked(tmp_path: Path) -> None:
    first = generate()
    write_keypair(tmp_path / "k", first)
    with pytest.raises(KeyFileError, match="exists already"):
        write_keypair(tmp_path / "k", generate())
    assert load_keypair(tmp_path / "k_secret") == first
    second = generate()
    write_keypair(tmp_path / "k", second, overwrite=True)
    assert load_keypair(tmp_path / "k_secret") == second


@pytest.mark.parametrize("content, match", [
    (None, "no key file at"),
    ("metadata\ncurve\n    public-key = \"{public}\"\n", "holds no secret key"),
    ("curve\n    public-key = \"{public}\"\n    secret-key = \"short\"\n", "not 40 Z85"),
    ("curve\n    public-key = \"{public}\"\n    secret-key = \"{other}\"\n", "does not belong"),
    ("curve\n  = nonsense =\n", "not ZPL"),
    ("\xff\xfe", "not UTF-8"),
])
def test_bad_secret_files_say_what_is_wrong(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "node.key_secret"
    if content is not None:
        keypair, other = generate(), generate()
        text = content.format(public=keypair.public.decode(), other=other.secret.decode())
        path.write_bytes(text.encode("latin-1") if "\xff" in text else text.encode())
        path.chmod(0o600)
    with pytest.raises(KeyFileError, match=match):
        load_keypair(path)


def test_secret_open_to_others_is_refused(tmp_path: Path) -> None:
    _, secret = write_keypair(tmp_path / "node.key", generate())
    os.chmod(secret, 0o640)
    with pytest.raises(KeyFileError, match=r"open to others \(mode 0640\); run: chmod 600"):
        load_keypair(secret)


def test_unreadable_and_directory(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="is a directory"):
        load_public_key(tmp_path)
    if os.geteuid() != 0:  # root reads anything
        path = tmp_path / "locked"
        path.write_text("x")
        path.chmod(0)
        with pytest.raises(KeyFileError, match="cannot read"):
            load_public_key(path)


def test_keygen_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "alice.key"
    assert main(["keygen", str(target), "--name", "alice", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["secret"] == f"{target}_secret"
    assert load_keypair(printed["secret"]).public.decode() == printed["public_key"]
    assert main(["keygen", str(target)]) == 1
    assert "exists already" in capsys.readouterr().err


def test_keygen_secret_mode_whatever_the_umask(tmp_path: Path) -> None:
    # a process of its own: the umask is process-wide
    code = ("import os, sys; os.umask(0); from peermesh.cli.commands import main; "
            "sys.exit(main(['keygen', sys.argv[1]]))")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "n.key")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "n.key_secret").st_mode) == 0o600
    assert load_keypair(tmp_path / "n.key_secret").public.decode() == result.stdout.strip()


def test_generated_keys_never_start_with_a_zero_octet():
    # one raw key in 256 does; 3,000 keys pass a generator that does not skip them
    # with a chance of 1 in 120,000
    assert all(generate().public_raw[0] != 0 for _ in range(3000))


def test_a_loaded_key_starting_with_a_zero_octet_is_warned_about(tmp_path, caplog):
    from peermesh.io.curve import Curve
    while True:   # about 256 tries
        keypair = Keypair(*zmq.curve_keypair())
        if keypair.public_raw[0] == 0:
            break
    _, secret = write_keypair(tmp_path / "zero", keypair)
    with caplog.at_level("WARNING", logger="peermesh.io.curve"):
        Curve.load(secret)
    assert "starts with a zero octet" in caplog.text and "peermesh keygen" in caplog.text
    caplog.clear()
    _, secret = write_keypair(tmp_path / "good", generate())
    with caplog.at_level("WARNING", logger="peermesh.io.curve"):
        Curve.load(secret)
    assert "zero octet" not in caplog.text
