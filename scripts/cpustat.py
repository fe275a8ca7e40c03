"""CPU use read from /proc, under its older name: the readers live in ``harness.py``."""

from harness import busy_pct, machine_cpu, proc_cpu

__all__ = ["busy_pct", "machine_cpu", "proc_cpu"]
