"""``peermesh agent --max-connections N``: the agent serves at most N local clients at once."""

from __future__ import annotations

import os
import subprocess
from contextlib import ExitStack
from pathlib import Path

import pytest

from peermesh.agent.server import AgentClient
from peermesh.errors import PeermeshError

from childprocs import terminate
from cliprocess import PEERMESH, WAIT, _env
from test_security import _answers, _wait


def test_the_agent_serves_at_most_max_connections_clients(tmp_path: Path,
                                                          free_udp_port: int) -> None:
    path = str(tmp_path / "agent.sock")
    agent = subprocess.Popen([*PEERMESH, "agent", "--agent", path, "--max-connections", "2",
                              "--interface", "lo", "--port", str(free_udp_port)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=_env(), start_new_session=True)
    try:
        _wait(lambda: agent.poll() is not None or (os.path.exists(path) and _answers(path)),
              "the agent to answer")
        assert agent.poll() is None, agent.stderr.read().decode() if agent.stderr else ""
        with ExitStack() as held:
            for _ in range(2):
                held.enter_context(AgentClient.connect(path, timeout=WAIT)).call("peers")
            with pytest.raises(PeermeshError, match="clients already"):
                with AgentClient.connect(path, timeout=WAIT) as third:
                    third.call("peers")
        _wait(lambda: _answers(path), "the agent to serve again once they closed")
    finally:
        terminate(agent, WAIT)


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_max_connections_is_a_usage_error(tmp_path: Path, value: str) -> None:
    out = subprocess.run([*PEERMESH, "agent", "--agent", str(tmp_path / "a.sock"),
                          "--interface", "lo", "--max-connections", value],
                         capture_output=True, text=True, env=_env(), timeout=WAIT * 4)
    assert out.returncode == 2
    assert "--max-connections" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "a.sock").exists()
