"""Recorder benchmark at 1920x1080 on Xvfb (run on demand, not collected by the test run):

    python tests/bench/bench_recorder.py [--fps 10] [--seconds 30] [--rate 100] [--format jpeg] [--quality 80]

Starts its own Xvfb and the Qt target window (tests/desktop_target.py), runs the `record` CLI in
a subprocess and drives real input with xdotool: clicks on the buttons and the text field and
typing at about --rate input events per second (a keystroke is two events: press and release).
Prints: capture fps achieved vs asked; the recorder's CPU share of one core while recording
(from /proc, so everything the process does: hooks, capture, encoding, SQLite); stored bytes per
active minute (blobs + database); events dropped out of those sent; the pre-action frame age
(median, p95) against the issue's targets.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fps", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=30.0, help="active input time")
    ap.add_argument("--rate", type=float, default=100.0, help="input events per second sent by xdotool")
    ap.add_argument("--format", default="jpeg")
    ap.add_argument("--quality", type=int, default=80)
    args = ap.parse_args()

    from tests.conftest import _free_display

    n = _free_display()
    display = f":{n}"
    # -r: no key auto-repeat, so a keystroke delayed under load is not counted twice
    xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", "1920x1080x24", "-nolisten", "tcp", "-ac", "-r"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-rec-"))
    env = {**os.environ, "DISPLAY": display, "XDG_SESSION_TYPE": "x11", "QT_QPA_PLATFORM": "xcb"}
    procs = []
    try:
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            time.sleep(0.05)
        state = tmp / "state.json"
        target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "desktop_target.py"), str(state)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(target)
        while not (state.exists() and json.loads(state.read_text()).get("ready")):
            time.sleep(0.05)
        st = json.loads(state.read_text())
        centre = {k: (x + w // 2, y + h // 2) for k, (x, y, w, h) in st["widgets"].items()}

        data = tmp / "data"
        rec = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "record", "--instruction", "benchmark", "--fps", str(args.fps),
                                "--format", args.format, "--quality", str(args.quality), "--data", str(data)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        procs.append(rec)
        first = rec.stdout.readline()
        if not first:
            print(rec.stderr.read())
            return 1
        episode_id = json.loads(first)["episode"]
        time.sleep(1.0)
        cpu0, wall0 = cpu_seconds(rec.pid), time.monotonic()

        def xdo(*a):
            subprocess.run(["xdotool", *map(str, a)], env=env, check=True)

        sent = 0
        rng = random.Random(0)
        delay_ms = int(round(2000 / args.rate))  # two events per keystroke
        t_end = time.monotonic() + args.seconds
        while time.monotonic() < t_end:
            xdo("mousemove", *centre["alpha" if rng.random() < 0.5 else "beta"], "click", "--delay", 0, 1)
            xdo("mousemove", *centre["field"], "click", "--delay", 0, 1)
            sent += 4
            text = "".join(rng.choice("abcdefghij klmnop") for _ in range(40))
            xdo("type", "--delay", delay_ms, text)
            xdo("key", "--delay", delay_ms, "ctrl+a", "BackSpace")
            sent += 2 * len(text) + 4 + 2  # ctrl+a is ctrl and a, pressed and released
        active_s = time.monotonic() - wall0
        time.sleep(1.0)
        cpu1, wall1 = cpu_seconds(rec.pid), time.monotonic()
        rec.send_signal(signal.SIGTERM)
        out, err = rec.communicate(timeout=60)
        if rec.returncode != 0:
            print(err)
            return 1

        from agent.storage.store import Store

        with Store(data) as store:
            ep = store.load_episode(episode_id)
            raw = store.raw_events(episode_id)
        got = sum(1 for e in raw if e["kind"] in ("key_down", "key_up", "mouse_down", "mouse_up"))
        ages = [s.info["frame_age_s"] for s in ep.steps if "frame_age_s" in s.info]
        p95 = statistics.quantiles(ages, n=20, method="inclusive")[-1] if len(ages) > 1 else (ages or [float("nan")])[0]
        size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
        rec_meta = ep.meta["recording"]
        period = 1.0 / args.fps
        cpu = (cpu1 - cpu0) / (wall1 - wall0)
        per_min = size / (active_s / 60)
        rows = [
            ("capture fps (asked / achieved)", f"{args.fps:g} / {rec_meta['achieved_fps']:.2f}", ""),
            ("recorder CPU, share of one core", f"{100 * cpu:.1f}%", "<= 20% at 10 fps"),
            ("stored bytes per active minute", f"{per_min / 1e6:.2f} MB ({args.format} q{args.quality})", "<= 15 MB"),
            ("input events dropped", f"{sent - got} of {sent} sent ({sent / active_s:.0f}/s)", "0"),
            ("pre-action frame age median / p95", f"{1000 * statistics.median(ages):.0f} / {1000 * p95:.0f} ms "
             f"({statistics.median(ages) / period:.2f} / {p95 / period:.2f} periods)", "<= 1.5 periods"),
            ("steps / frames kept", f"{len(ep.steps)} / {len(ep.blob_hashes())}", ""),
        ]
        print(f"Recorder at 1920x1080 on Xvfb, {active_s:.0f} s of input, {os.cpu_count()} cores")
        w = max(len(r[0]) for r in rows)
        for name, val, goal in rows:
            print(f"  {name:<{w}}  {val:<44} {goal}")
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        xvfb.terminate()
        xvfb.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
