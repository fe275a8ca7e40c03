"""Network interfaces: which addresses and broadcast a node uses (no sockets of its own)."""
