"""Many nodes on real sockets in one process, and the descriptor ceiling."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import gevent

import peermesh


def test_thirty_nodes_on_real_sockets_in_one_process_mesh_fully(free_udp_port):
    nodes = []
    try:
        for i in range(30):
            nodes.append(peermesh.Node(f"n{i}", interface="lo", port=free_udp_port,
                                       interval=0.1).start())
        deadline = time.monotonic() + 20
        while not all(len(n.peers()) == 29 for n in nodes):
            assert time.monotonic() < deadline, [len(n.peers()) for n in nodes]
            gevent.sleep(0.05)
    finally:
        for node in nodes:
            node.stop(0)


def test_running_out_of_descriptors_is_a_clear_error_not_a_stall(free_udp_port):
    # With the soft limit at 400, 16 nodes (a full mesh needs ~3*16*15 = 720
    # descriptors) cannot all mesh: nodes must say why, and keep running.
    script = textwrap.dedent(f"""
        import resource, time, gevent, logging, peermesh
        logging.basicConfig(level=logging.ERROR)
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))  # hard too: a node raises soft
        nodes = [peermesh.Node(f"n{{i}}", interface="lo", port={free_udp_port}, interval=0.1).start()
                 for i in range(16)]
        gevent.sleep(2.0)
        print("peers", sorted(len(n.peers()) for n in nodes), flush=True)
        for n in nodes:
            n.stop(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "file descriptors in use: one more peer" in out.stderr
    assert "would exhaust them" in out.stderr
    counts = eval(out.stdout.split("peers", 1)[1])
    assert max(counts) < 15  # not a full mesh, and said so instead of stalling
