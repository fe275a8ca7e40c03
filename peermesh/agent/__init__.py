"""The local agent: a long-lived node behind a control socket, and its client."""
