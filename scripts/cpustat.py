"""CPU use read from /proc, for benchmarks that say what else the machine was doing."""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK   # utime, stime


def machine_cpu() -> float:
    """CPU seconds every core of the machine has been busy so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / _TICK   # all but idle and iowait


def busy_pct(seconds: float) -> float:
    """How busy the machine is over the next ``seconds``, in % of one core."""
    cpu, start = machine_cpu(), time.perf_counter()
    time.sleep(seconds)
    return 100 * (machine_cpu() - cpu) / (time.perf_counter() - start)
