"""Simulated networks: thousands of real nodes in one process, on virtual time.

``SimNetwork`` provides the transport interface a ``Node`` uses (mailboxes,
links, beacon sockets, clock), so the node and protocol code run unchanged;
``Simulation`` starts many nodes on one and reports on them. See
``peermesh simulate --help`` for the command line.
"""

from .network import LinkSettings, SimClock, SimNetwork, SimTransport
from .simulation import Simulation

__all__ = ["SimNetwork", "SimClock", "SimTransport", "LinkSettings", "Simulation"]
