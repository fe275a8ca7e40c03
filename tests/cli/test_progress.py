"""Progress bars: drawn on a terminal (a pty here), never into a pipe or a file."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator

import pytest

from cliprocess import PEERMESH, _env
from peermesh.cli import output
from peermesh.cli.progress import Progress, shown


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """(master, slave) of a pty 100 columns wide (a pty starts 0 wide: tqdm would draw
    nothing)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        yield master, slave
    finally:
        for fd in (master, slave):
            try:
                os.close(fd)
            except OSError:
                pass


def _read_all(master: int) -> str:
    data = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace")


def test_simulate_draws_a_bar_on_a_terminal(terminal: tuple[int, int]) -> None:
    master, slave = terminal
    process = subprocess.Popen([*PEERMESH, "simulate", "--nodes", "4", "--duration", "2",
                                "--json", "--seed", "1"], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=slave, env=_env())
    os.close(slave)
    drawn = _read_all(master)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    assert "simulating:" in drawn and "/2.0" in drawn, drawn
    assert b'"nodes": 4' in out  # the report itself is untouched on stdout


def test_simulate_prints_plain_lines_into_a_pipe() -> None:
    result = subprocess.run([*PEERMESH, "simulate", "--nodes", "4", "--duration", "2",
                             "--seed", "1"], stdin=subprocess.DEVNULL, capture_output=True,
                            env=_env(), timeout=120, encoding="utf-8")
    assert result.returncode == 0, result.stderr
    assert "simulating:" not in result.stderr and "\r" not in result.stderr
    assert "starting 4 nodes" in result.stderr


def test_a_bar_on_a_terminal_counts_and_is_erased_at_the_end(terminal: tuple[int, int],
                                        monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    master, slave = terminal
    with capsys.disabled():
        stream = os.fdopen(os.dup(slave), "w", encoding="utf-8")
        monkeypatch.setattr(sys, "stderr", stream)
        assert shown()
        with Progress("fetching", total=4096, unit="B") as bar:
            assert bar.active
            bar.update(1024)
            bar.advance_to(3072, "3 of 4 chunks")
            bar.advance_to(2048)  # never backwards
            assert bar._bar.n == 3072
        stream.flush()
        stream.close()
    os.close(slave)
    drawn = _read_all(master)
    assert drawn.startswith("\rfetching:") and "/4.00k" in drawn, drawn
    assert drawn.endswith(" \r"), drawn  # (leave=False) the line is blanked


def test_no_bar_without_a_terminal_or_with_json_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    bar = Progress("x", total=3)
    assert not bar.active  # pytest captures stderr: not a terminal
    bar.update()
    bar.close()
    monkeypatch.setattr(output, "note_sink", lambda message: None)
    assert not shown()
