"""How many torch threads a process should run: the cores it may use that other work leaves free.

torch's default (one thread per core) oversubscribes a machine that is running anything else:
OpenMP threads spin waiting for one another while another process holds their core, and on a
busy 2-core machine 2 threads were measured 8x slower than 1. So the benchmark and the trainer
pick their count here: the CPUs this process may use (its affinity, capped by a cgroup CPU quota)
minus the load other processes put on them (sampled from /proc/stat over a short interval), at
least 1. An explicit choice wins: a --threads flag, else the TANDEM_THREADS environment variable.

`pick_threads` is the pure rule; `read_cores` and `read_busy` read the machine; `choose_threads`
puts them together and says what it chose (`ThreadChoice.line()`). No torch import at the top:
`apply` imports it when a count is set.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from agent.errors import TandemError

ENV = "TANDEM_THREADS"
# a core at most this busy with other work still counts as free: an idle desktop shows a few
# percent of background load, which should not halve a 2-core machine's threads
SLACK = 0.25
SAMPLE_S = 0.25  # the /proc/stat interval: 25 ticks per CPU at USER_HZ 100


class ThreadsError(TandemError, ValueError):
    """A thread count that cannot work (from --threads or TANDEM_THREADS); the message names it."""


@dataclass(frozen=True)
class ThreadChoice:
    """A process's torch thread count and why: `cores` it may use, `busy` of them taken by other
    work (0 when an explicit count made sampling needless), `workers` processes sharing them,
    `source` "auto", the flag, or "TANDEM_THREADS"; `flag` is what the line tells a user to pass."""
    threads: int
    cores: int
    busy: float
    workers: int = 1
    source: str = "auto"
    flag: str = "--threads"

    def line(self, what: str = "torch threads") -> str:
        """One line for a program's output, e.g. "torch threads: 1 (2 cores, 1.3 busy with other work;
        --threads to override)"."""
        per = f" each of {self.workers} processes" if self.workers > 1 else ""
        if self.source != "auto":  # the load was not sampled
            return f"{what}: {self.threads}{per} (set by {self.source}; {self.cores} cores)"
        return f"{what}: {self.threads}{per} ({self.cores} cores, {self.busy:.1f} busy with other work; {self.flag} to override)"

    def apply(self) -> ThreadChoice:
        """Set torch's intra-op thread count of this process to `threads`; returns self."""
        set_threads(self.threads)
        return self


def set_threads(n: int) -> None:
    """torch.set_num_threads(n), torch imported only now."""
    import torch

    torch.set_num_threads(check_threads(n, "threads"))


def pick_threads(cores: int, busy: float, workers: int = 1) -> int:
    """Threads for each of `workers` processes on `cores` CPUs of which other work keeps `busy`
    busy: the free cores (a core at most SLACK busy counts as free) split evenly, never more than
    the free cores, at least 1 each (so with more workers than free cores the machine is
    oversubscribed by the workers themselves, one thread each)."""
    if cores < 1 or workers < 1:
        raise ThreadsError(f"cores and workers must be at least 1, got {cores} and {workers}")
    free = max(0.0, cores - max(0.0, busy))
    return max(1, min(cores, math.floor(free + SLACK)) // workers)


def check_threads(value, source: str = "--threads") -> int:
    """An explicit thread count as an int >= 1, or ThreadsError naming `source`."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ThreadsError(f"{source} must be a whole number of threads, got {value!r}") from None
    if n < 1:
        raise ThreadsError(f"{source} must be at least 1, got {n}")
    return n


def read_cores() -> int:
    """The CPUs this process may run on: its affinity mask (os.cpu_count where there is none),
    capped by a cgroup v2 CPU quota (/sys/fs/cgroup/cpu.max, "QUOTA PERIOD"), rounded up."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def cpu_ticks(cpus: set[int], stat: str = "/proc/stat") -> tuple[float, float]:
    """(busy, total) ticks summed over `cpus` from `stat` (/proc/stat's format; idle and iowait
    count as not busy)."""
    busy = total = 0.0
    with open(stat) as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                continue
            ticks = [float(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def read_busy(cores: int, sample_s: float = SAMPLE_S, stat: str = "/proc/stat") -> float:
    """Cores' worth of CPU other processes used over the next `sample_s` seconds, on the CPUs this
    process may use (this process's own use in the interval is subtracted). Where /proc/stat is
    missing: the 1-minute load average, capped at `cores`; 0 where there is neither."""
    try:
        cpus = os.sched_getaffinity(0)
        b0, t0 = cpu_ticks(cpus, stat)
        own0 = time.process_time()
        time.sleep(sample_s)
        b1, t1 = cpu_ticks(cpus, stat)
        own = time.process_time() - own0
    except (AttributeError, OSError, ValueError):
        try:
            return min(float(cores), os.getloadavg()[0])
        except (AttributeError, OSError):
            return 0.0
    if t1 <= t0:
        return 0.0
    # ticks -> cores: the busy share of all ticks times the CPUs sampled; minus this process's seconds
    used = (b1 - b0) / (t1 - t0) * len(cpus) - own / sample_s
    return min(float(cores), max(0.0, used))


def choose_threads(explicit=None, *, workers: int = 1, reserved: float = 0.0, cores: int | None = None,
                   busy: float | None = None, env=None, flag: str = "--threads") -> ThreadChoice:
    """Threads for each of `workers` processes of this program: `explicit` (a --threads value) when
    given, else TANDEM_THREADS when set, else pick_threads over the free cores, less `reserved`
    cores this program's other threads take (a learner running beside its rollout workers).
    `cores` and `busy` are read from the machine when None (tests give them)."""
    env = os.environ if env is None else env
    cores = read_cores() if cores is None else cores
    if explicit is not None:
        return ThreadChoice(check_threads(explicit, flag), cores, 0.0, workers, flag, flag)
    if env.get(ENV, "").strip():
        return ThreadChoice(check_threads(env[ENV], ENV), cores, 0.0, workers, ENV, flag)
    busy = read_busy(cores) if busy is None else busy
    return ThreadChoice(pick_threads(cores, busy + reserved, workers), cores, busy, workers, "auto", flag)
