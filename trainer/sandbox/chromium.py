"""Chromium for the sandbox's browser environments (MiniWoB++ under chromedriver, the games over
the DevTools pipe): where it is, and a process group that is always reaped.

Reaping. The browser (and its driver, where there is one) live in one process group, led by a
watchdog (`sh`) whose stdin is a pipe that only this process holds open. When this process ends,
by a close or by any signal, SIGKILL included, the pipe closes; the watchdog reads end-of-file
and kills the whole group. (PR_SET_PDEATHSIG would follow the thread that started the browser, not
the process, and would miss the browser's own children.)
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess

BINARY_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FALLBACK_DIRS = ("/usr/bin", "/usr/lib/chromium")


def find_executable(names: tuple[str, ...]) -> str | None:
    """The first of `names` on PATH, else in FALLBACK_DIRS; None when there is none."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    for d in FALLBACK_DIRS:
        for name in names:
            path = os.path.join(d, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
    return None


def group_processes(pgid: int) -> list[int]:
    """Live processes of the process group `pgid` (Linux, from /proc; zombies, which have ended
    and wait only to be reaped, do not count)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(name))
    return pids


def start_watchdog():
    """`sh` leading a new process group: waits for end-of-file on its stdin (this process's
    end, or `end_watchdog`), then SIGKILLs its whole group. None where there are no process groups."""
    if os.name != "posix":
        return None
    return subprocess.Popen(["/bin/sh", "-c", "read _; kill -KILL 0"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)


def kill_group(watchdog) -> None:
    try:
        os.killpg(watchdog.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_watchdog(watchdog) -> None:
    """Kill the watchdog's group now and reap the watchdog."""
    if watchdog is None:
        return
    kill_group(watchdog)
    try:
        watchdog.stdin.close()
    except OSError:
        pass
    watchdog.wait()
