"""What the gate's fresh look at the focus costs before each action (agent.run.loop reads it again
before every action of a reply): the X11 query for the focused window (title, class, pid via
X-Resource), the /proc test for a terminal (agent.host.terminal_process) on a real xterm, on a window
whose process has no children, and on a process tree shaped like a browser's (40 children of
8 threads each, no shell), and the whole DesktopExecutor.focus_now, beside a full observe().
Starts its own Xvfb; needs Xvfb and xterm.

    python tests/bench/bench_gate_focus.py [--reps 200]

Measured on the reference machine (2 CPU cores shared with other jobs, load 3.9), median (p95)
ms: X11 focus read 0.75 (1.00); /proc on the xterm 0.04 (0.05), on a lone process 0.16 (0.20),
on 41 processes x 8 threads 5.07 (5.58); focus_now on the xterm 0.93 (1.19); a whole observe()
at 1920x1080 1.99 (7.86).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_loop import start_xvfb
from tests.bench.bench_table import print_table

# a parent of 40 processes of 8 threads each, none of them a shell
TREE = """
import subprocess, sys
kids = [subprocess.Popen([sys.executable, "-c", "import threading, time\\n"
                          "[threading.Thread(target=time.sleep, args=(600,), daemon=True).start() for _ in range(7)]\\n"
                          "time.sleep(600)"]) for _ in range(40)]
print("ready", flush=True)
kids[0].wait()
"""


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args(argv)
    xvfb = start_xvfb(1920, 1080)
    procs = []
    try:
        from agent.executors.desktop import DesktopExecutor
        from agent.host.focused_window import FocusedWindow
        from agent.host.terminal_process import terminal_evidence

        term = subprocess.Popen(["xterm", "-geometry", "80x24+0+0", "-title", "bench-shell", "-e", "bash", "--norc"],
                                cwd=tempfile.gettempdir())
        procs.append(term)
        tree = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(tree)
        assert tree.stdout.readline().strip() == "ready"
        deadline = time.time() + 15
        while not subprocess.run(["xdotool", "search", "--name", "^bench-shell$"], capture_output=True).stdout:
            assert time.time() < deadline, "the xterm did not come up"
            time.sleep(0.1)
        subprocess.run(["xdotool", "mousemove", "100", "100"], check=True)  # no window manager: focus follows it
        time.sleep(0.5)
        fw = FocusedWindow()
        title, app, pid = fw.describe()
        assert pid == term.pid and terminal_evidence(pid) == "bash runs under it", (title, app, pid)
        ex = DesktopExecutor(password_fields=False)
        frame = ex.observe()
        rows = [
            ("X11: focused window, class, title, pid", timed(fw.describe, a.reps)),
            ("/proc: xterm (bash under it)", timed(lambda: terminal_evidence(term.pid), a.reps)),
            ("/proc: one process, no children", timed(lambda: terminal_evidence(os.getpid()), a.reps)),
            ("/proc: 41 processes x 8 threads, no shell", timed(lambda: terminal_evidence(tree.pid), a.reps)),
            ("focus_now before an action (xterm)", timed(lambda: ex.focus_now(frame), a.reps)),
            ("observe(): screenshot + focus, 1920x1080", timed(ex.observe, max(20, a.reps // 10))),
        ]
        ex.close()
        fw.close()
    finally:
        for p in procs:
            if p.poll() is None:
                if p is procs[-1]:
                    os.killpg(p.pid, 9)
                else:
                    p.terminate()
                p.wait()
        xvfb.terminate()
    print(f"the gate's look at the focus, {a.reps} reps (ms)")
    print_table([{"what": w, "median": statistics.median(xs) * 1000,
                  "p95": statistics.quantiles(xs, n=20, method="inclusive")[-1] * 1000} for w, xs in rows],
                [("what", "what", ""), ("median", "median", ".2f"), ("p95", "p95", ".2f")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
