"""Per-step overhead of the agent loop without a model, at 1920x1080 on Xvfb.

    python tests/bench/bench_loop.py [--steps 40] [--width 1920 --height 1080]

Measures each phase the loop does around the model (capture with mss, encode for the store and
the request, prompt and message build, parse, execute a click with pyautogui, record in the
store), then whole loop steps (AgentLoop with a replay policy, settle 0). Prints median and p95
in milliseconds. Starts its own Xvfb; needs xdotool/Xvfb installed.
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


def start_xvfb(w, h):
    for n in range(150, 250):
        if not Path(f"/tmp/.X{n}-lock").exists() and not Path(f"/tmp/.X11-unix/X{n}").exists():
            break
    proc = subprocess.Popen(["Xvfb", f":{n}", "-screen", "0", f"{w}x{h}x24", "-nolisten", "tcp", "-ac"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not Path(f"/tmp/.X11-unix/X{n}").exists():
        time.sleep(0.05)
    os.environ["DISPLAY"] = f":{n}"
    os.environ["XDG_SESSION_TYPE"] = "x11"
    return proc


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    args = ap.parse_args()
    xvfb = start_xvfb(args.width, args.height)
    # a real window on screen, so the screenshots are not one flat colour (which encodes for free)
    state = Path(tempfile.mkdtemp()) / "state.json"
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb"}
    target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "desktop_target.py"), str(state)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while not state.exists() and time.time() < deadline:
            time.sleep(0.05)
        return bench(args)
    finally:
        target.terminate()
        xvfb.terminate()


def bench(args) -> int:
    from agent import coords
    from agent.executors.desktop import DesktopExecutor
    from agent.policies import ReplayPolicy
    from agent.policies.memory import Memory, MemoryStep
    from agent.run.loop import AgentLoop, LoopConfig
    from agent.storage.store import Store

    w, h = args.width, args.height
    rh, rw = coords.smart_resize(h, w)
    responses = [f"Thought: Click somewhere harmless.\nAction: click(start_box='({(200 + 7 * i) % rw},{(300 + 5 * i) % rh})')"
                 for i in range(args.steps)]
    ex = DesktopExecutor(settle=0)
    ex.reset()
    ex._pyautogui()  # import once, outside the timings
    rows = {k: [] for k in ("capture (mss)", "encode png", "encode jpeg q90", "prompt + messages", "parse",
                            "execute click", "record (store)")}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(tmp)
        policy = ReplayPolicy(responses)
        memory = Memory()
        from agent.schema import Episode, Observation, Provenance, Step

        ep = Episode("bench", kind="autonomous")
        for i in range(args.steps):
            t = time.perf_counter(); frame = ex.observe(); rows["capture (mss)"].append(time.perf_counter() - t)
            t = time.perf_counter(); png, _ = frame.encode("png"); rows["encode png"].append(time.perf_counter() - t)
            frame.encoded = None
            t = time.perf_counter(); frame.encode("jpeg"); rows["encode jpeg q90"].append(time.perf_counter() - t)
            t = time.perf_counter(); memory.build_messages(policy.prompt("bench"), frame, space=policy.space); rows["prompt + messages"].append(time.perf_counter() - t)
            raw = policy.generate([])
            t = time.perf_counter(); prop = policy.parse(raw, frame); rows["parse"].append(time.perf_counter() - t)
            t = time.perf_counter(); ex.execute(prop.actions[0], frame.geometry); rows["execute click"].append(time.perf_counter() - t)
            t = time.perf_counter()
            hsh = store.put_blob(png)
            ep.steps.append(Step(i, Observation(hsh, w, h, frame.geometry), prop.thought, prop.actions[0], Provenance("agent")))
            store.save_episode(ep)
            rows["record (store)"].append(time.perf_counter() - t)
            memory.add(MemoryStep(prop.thought, prop.actions, frame))
        # whole steps through AgentLoop, both store formats
        for fmt in ("png", "jpeg"):
            loop = AgentLoop(ReplayPolicy(responses), ex, store=store, config=LoopConfig(max_steps=args.steps, image_format=fmt))
            ends = []
            loop.on_step = lambda s, ends=ends: ends.append(time.perf_counter())
            t0 = time.perf_counter()
            loop.run("bench")
            starts = [t0] + ends[:-1]
            rows[f"whole loop step ({fmt})"] = [e - s for s, e in zip(starts, ends, strict=True)]
        store.close()
    ex.close()
    print(f"agent loop overhead without a model, {w}x{h} on Xvfb, {args.steps} steps")
    print(f"{'phase':28} {'median ms':>10} {'p95 ms':>10}")
    for k, xs in rows.items():
        print(f"{k:28} {statistics.median(xs) * 1000:10.2f} {statistics.quantiles(xs, n=20, method='inclusive')[-1] * 1000:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
