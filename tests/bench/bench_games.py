"""Game throughput (trainer.sandbox.games): env steps per second per browser instance and per process,
with one and two instances in one process (each stepped by a thread of its own: a step waits on
Chromium, not on Python), under the fake clock and in real time (the game's clock following the wall
clock, so a step lasts its step_ms: what a browser game is without the fake clock), and where a
step's time goes: in the browser (input events, the clock's advance and getState), the screenshot,
the policy (the random player) and the rest (Python: the env's bookkeeping).

    python tests/bench/bench_games.py [--seconds 5] [--games snake,merge] [--json]

Needs Chromium. Steps include the resets between episodes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_table import print_table


def _play(env, game: str, seconds: float, offset: int, out: dict) -> None:
    """Random-player steps on `env` for `seconds`; the counts and time split into `out`."""
    env.reset(seed=offset, options={"game": game})  # warm: browser started, page loaded once
    base = dict(env.timing)
    steps = episodes = 0
    policy = 0.0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.reset(seed=offset + episodes, options={"game": game})
        env.action_space.seed(offset + episodes)
        done = False
        while not done and time.perf_counter() - t0 < seconds:
            p0 = time.perf_counter()
            action = env.action_space.sample()
            policy += time.perf_counter() - p0
            _, _, term, trunc, _ = env.step(action)
            steps += 1
            done = term or trunc
        episodes += 1
    elapsed = time.perf_counter() - t0
    spent = {k: env.timing[k] - base[k] for k in base}
    out.update(steps=steps, episodes=episodes, seconds=elapsed, policy=policy, **spent)


def measure(game: str, instances: int, realtime: bool, seconds: float) -> dict:
    from trainer.sandbox.games.env import GameEnv

    envs = [GameEnv(game, realtime=realtime) for _ in range(instances)]
    results = [{} for _ in envs]
    try:
        threads = [threading.Thread(target=_play, args=(env, game, seconds, 1000 * i, res))
                   for i, (env, res) in enumerate(zip(envs, results, strict=True))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for env in envs:
            env.close()
    steps = sum(r["steps"] for r in results)
    wall = max(r["seconds"] for r in results)
    busy = sum(r["seconds"] for r in results)
    browser = sum(r["input"] + r["advance"] for r in results)
    shot = sum(r["screenshot"] for r in results)
    policy = sum(r["policy"] for r in results)
    return {"game": game, "clock": "real time" if realtime else "fake", "instances": instances,
            "steps": steps, "episodes": sum(r["episodes"] for r in results),
            "per_process": steps / wall, "per_instance": steps / wall / instances,
            "browser": browser / busy, "screenshot": shot / busy, "policy": policy / busy,
            "rest": max(0.0, 1 - (browser + shot + policy) / busy)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (default 5)")
    ap.add_argument("--games", default="snake,merge", help="comma-separated games (default snake,merge)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from trainer.sandbox.games.registry import parse_games

    rows = []
    for game in parse_games(a.games):
        for realtime in (False, True):
            for instances in (1, 2):
                rows.append(measure(game, instances, realtime, a.seconds))
    if a.json:
        print(json.dumps({"cores": os.cpu_count(), "seconds": a.seconds, "rows": rows}))
        return
    print(f"games, random player, {os.cpu_count()} cores, {a.seconds:g} s per row (steps include resets)")
    print_table(rows, [("game", "game", ""), ("clock", "clock", ""), ("instances", "instances", "d"),
                       ("steps", "steps", "d"), ("steps/s/process", "per_process", ".1f"),
                       ("steps/s/instance", "per_instance", ".1f"), ("browser", "browser", ".0%"),
                       ("screenshot", "screenshot", ".0%"), ("policy", "policy", ".1%"), ("rest", "rest", ".0%")])


if __name__ == "__main__":
    main()
