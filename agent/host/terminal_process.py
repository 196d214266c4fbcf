"""Is a window's process a terminal? Told by what the process does, not by what it is called:
it holds the master side of a pseudo-terminal (/dev/ptmx open), or a shell runs under it. The
gate asks before the agent types into such a window (agent.run.gate), whatever its class or title
says: GNOME Console, Ptyxis, a terminal started as `xterm -class Anything`.

A window whose process has a shell under it for another reason (a launcher or file manager that
started a terminal, an editor with a terminal panel) counts as a terminal too: the gate asks
more, never less. A tree too large to walk (MAX_DESCENDANTS) is not shown to be a terminal.

Linux only: it reads /proc. A process of another user (a root terminal) shows its children but
not its open files, so only the shell test applies to it. A sandboxed terminal (Flatpak) is
seen from outside its sandbox when the pid comes from the X server (agent.host.focused_window).
Elsewhere the answer is None (unknown), never an error: Windows has no /proc (a console window
belongs to conhost / OpenConsole / WindowsTerminal, whose children would need the Toolhelp API)
and neither has macOS (libproc); there the gate knows terminals by name only, and only where the
focused window can be read at all (X11; see agent.executors.desktop).
"""
from __future__ import annotations

import os
import sys

# Programs that run what is typed into them, by their process name (/proc/PID/comm): shells,
# and the multiplexers that put shells behind a terminal.
SHELLS = frozenset("""sh bash dash zsh fish ksh mksh oksh pdksh ash yash busybox tcsh csh nu pwsh powershell
    elvish xonsh ion osh ysh rc es murex tmux screen zellij""".split())
MAX_DESCENDANTS = 512  # processes looked at under one window (a browser has a few hundred threads)
MAX_FDS = 4096  # open files looked at for a pty master


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def holds_pty_master(pid: int) -> bool:
    """Has process `pid` /dev/ptmx open (it runs a pseudo-terminal)? False when unreadable."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:  # gone, or another user's
        return False
    for fd in fds[:MAX_FDS]:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in ("/dev/ptmx", "/dev/pts/ptmx"):
                return True
        except OSError:
            continue
    return False


# the children of each thread in one file (Linux 4.2+ with CONFIG_PROC_CHILDREN, as distributions build it)
_CHILDREN_FILES = sys.platform.startswith("linux") and os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """The children of `pid`: of every one of its threads (a thread that forks is the parent)."""
    if not _CHILDREN_FILES:  # read every process's parent instead
        return [int(n) for n in os.listdir("/proc") if n.isdigit() and _parent(n) == pid]
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    return [int(c) for tid in tasks for c in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()]


def _parent(pid: str) -> int | None:
    stat = _read(f"/proc/{pid}/stat")  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    return int(stat[stat.rfind(")") + 2:].split(None, 2)[1]) if stat else None


def shell_under(pid: int) -> tuple[str, int] | None:
    """(name, pid) of the first shell among `pid` and its descendants, breadth first; None."""
    todo, seen = [pid], 0
    while todo and seen < MAX_DESCENDANTS:
        p = todo.pop(0)
        seen += 1
        name = (_read(f"/proc/{p}/comm") or "").strip()
        if name in SHELLS:
            return name, p
        todo.extend(_children(p))
    return None


def terminal_evidence(pid: int | None) -> str | None:
    """Why process `pid` is a terminal ("bash runs under it", "it holds a pseudo-terminal"), or
    None when nothing shows it is one (or this is not Linux)."""
    if not pid or not sys.platform.startswith("linux"):
        return None
    shell = shell_under(pid)
    if shell is not None:
        return f"{shell[0]} runs under it" if shell[1] != pid else f"it is {shell[0]}"
    if holds_pty_master(pid):
        return "it holds a pseudo-terminal"
    return None
