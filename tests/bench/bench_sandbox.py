"""Sandbox throughput: environment steps per second (render, screenshot, real input, verify),
in one process and in two, with the scripted expert and the random policy.

    python tests/bench/bench_sandbox.py [--seconds 5] [--width 320 --height 240]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _run(policy: str, seconds: float, width: int, height: int, offset: int) -> tuple[int, int, float]:
    from trainer.sandbox.env import SandboxEnv
    from trainer.sandbox.families import FAMILIES

    env = SandboxEnv(width, height)
    names = list(FAMILIES)
    steps = episodes = 0
    for name in names:  # warm up Qt: fonts, styles and every widget class once
        env.reset(seed=0, options={"family": name})
        env.step(env.expert_action()[1])
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.reset(seed=offset + episodes, options={"family": names[episodes % len(names)]})
        env.action_space.seed(episodes)
        done = False
        while not done:
            action = env.expert_action()[1] if policy == "expert" else env.action_space.sample()
            _, _, term, trunc, _ = env.step(action)
            steps += 1
            done = term or trunc
        episodes += 1
    elapsed = time.perf_counter() - t0
    env.close()
    return steps, episodes, elapsed


def _worker(args):
    return _run(*args)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--width", type=int, default=320)
    ap.add_argument("--height", type=int, default=240)
    a = ap.parse_args()
    print(f"sandbox {a.width}x{a.height}, {os.cpu_count()} cores, {a.seconds:g} s per cell (steps include resets)")
    print(f"{'policy':<8} {'procs':>5} {'steps/s/proc':>13} {'total steps/s':>14} {'episodes/s':>11} {'scaling':>8}")
    ctx = mp.get_context("spawn")
    for policy in ("expert", "random"):
        base = None
        for procs in (1, 2):
            with ctx.Pool(procs) as pool:
                res = pool.map(_worker, [(policy, a.seconds, a.width, a.height, 10_000 * i) for i in range(procs)])
            per = [s / e for s, _, e in res]
            total = sum(per)
            eps = sum(n / e for _, n, e in res)
            base = base or total
            print(f"{policy:<8} {procs:>5} {sum(per) / procs:>13.0f} {total:>14.0f} {eps:>11.1f} {total / base:>7.2f}x")


if __name__ == "__main__":
    main()
