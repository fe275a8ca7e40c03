"""A node near the descriptor limit counts the peers it refuses and logs them once a period."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_descriptor_refusals_are_counted_and_logged_once_per_period(free_udp_port):
    # 16 nodes under a soft limit of 400 descriptors cannot all mesh; every beacon
    # (10 a second from each peer) from a peer not connected to is refused again.
    script = textwrap.dedent(f"""
        import resource, gevent, logging, peermesh
        logging.basicConfig(level=logging.ERROR)
        resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))  # hard too: a node raises soft
        nodes = [peermesh.Node(f"n{{i}}", interface="lo", port={free_udp_port}, interval=0.1).start()
                 for i in range(16)]
        gevent.sleep(2.0)
        print("refused", sum(n.stats()["descriptors_refused"] for n in nodes), flush=True)
        for n in nodes:
            n.stop(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if "file descriptors in use" in line]
    refused = int(out.stdout.split("refused", 1)[1])
    assert 1 <= len(lines) <= 16, out.stderr[-2000:]  # at most one line per node in 2 s
    assert refused > len(lines)
