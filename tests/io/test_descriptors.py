"""The descriptor limit: raised to the hard limit when a node is made, and the peer cap
that follows from it."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

import pytest

from peermesh.io.descriptors import FD_RESERVE, FDS_PER_PEER

CHILD = textwrap.dedent("""
    import json, resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))   # as many systems start one
    from peermesh import Node
    node = Node("fds", interface="lo", discovery=())
    print(json.dumps({"soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "hard": hard,
                      "max_peers": node.config.max_peers,
                      "max_connections": node.config.max_connections,
                      "max_pending": node.config.max_pending}))
""")


def test_a_node_raises_the_descriptor_limit_and_holds_as_many_peers_as_it_allows() -> None:
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] <= 300:
        pytest.skip("the hard descriptor limit is too low to show a raise")
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    hard = got["hard"] if got["hard"] != resource.RLIM_INFINITY else 1 << 20
    assert got["soft"] == hard
    assert got["max_peers"] == (hard - FD_RESERVE) // FDS_PER_PEER
    assert got["max_connections"] == got["max_peers"] + got["max_pending"]
