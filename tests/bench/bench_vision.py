"""The vision tower's exact savings (agent.vlm.fast_vision) against the stock path, in CPU time
on one thread (time.process_time, so other work on the machine does not distort it):
vision-tower CPU ms per screenshot, rollout turns per CPU-second (bench_throughput's batched
rollouts) and learner tokens per CPU-second (bench_throughput's packed learner).

    OMP_NUM_THREADS=1 python tests/bench/bench_vision.py [--model assets/default_model] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch

from agent.vlm import fast_vision
from agent.vlm.model import load_vlm
from tests.bench import bench_throughput as bt
from trainer.learn.ppo import Learner, PPOConfig
from trainer.learn.sft import load_for_training
from trainer.rollout.actors import VLMActor
from trainer.rollout.runner import EpisodeRunner
from trainer.sandbox.env_process import make_envs


def screenshots(n: int, w: int = 640, h: int = 400):
    from PIL import Image, ImageDraw

    out = []
    for i in range(n):
        img = Image.new("RGB", (w, h), (230, 235, 240))
        d = ImageDraw.Draw(img)
        for j in range(20):
            x, y = (37 * j * (i + 1)) % (w - 40), (53 * j) % (h - 20)
            d.rectangle([x, y, x + 30, y + 15], fill=(j * 10 % 255, 100, 200))
        out.append(img)
    return out


def tower_ms(model, processor, n_images: int, seconds: float) -> dict:
    """CPU ms per screenshot of the vision tower over a batch of n_images, stock and fast (best of 3)."""
    tower = fast_vision.vision_tower(model)
    inputs = processor.image_processor(images=screenshots(n_images), return_tensors="pt")
    pv, grid = inputs["pixel_values"], inputs["image_grid_thw"]
    best = {}
    for _ in range(3):
        for fast in (False, True):
            fast_vision.install(model, force=True) if fast else fast_vision.uninstall(model)
            with torch.no_grad():
                tower(pv, grid_thw=grid)
                t0, n = time.process_time(), 0
                while time.process_time() - t0 < seconds:
                    tower(pv, grid_thw=grid)
                    n += 1
                ms = (time.process_time() - t0) / n / n_images * 1000
            key = "fast" if fast else "stock"
            best[key] = min(best.get(key, ms), ms)
    return best


def rollout_turns_per_cpu_s(model_dir, tickets, n_envs: int, max_new_tokens: int) -> tuple[float, list]:
    """bench_throughput's batched rollouts, the clock (this process's CPU time: the sandbox
    environments run in their own) around the episodes only, not the loading."""
    model, processor = load_vlm(model_dir, device="cpu")
    actor = VLMActor(model, processor, temperature=1.0, max_new_tokens=max_new_tokens)
    envs = make_envs(n_envs)
    try:
        runner = EpisodeRunner(actor, envs)
        t0 = time.process_time()
        trajs = runner.run_all(tickets)
        cpu = time.process_time() - t0
    finally:
        for e in envs:
            e.close()
    return sum(len(t.turns) for t in trajs) / cpu, trajs


def learner_tokens_per_cpu_s(model_dir, trajs, micro_batch_tokens: int) -> float:
    """One packed PPO update (bench_throughput's learner), the clock around the update only."""
    model, processor = load_for_training(model_dir, "cpu")
    lrn = Learner(model, processor, PPOConfig(epochs=1, lr=1e-5, micro_batch_tokens=micro_batch_tokens,
                                              share_prefix=True))
    t0 = time.process_time()
    m = lrn.update(trajs)
    cpu = time.process_time() - t0
    lrn.close()
    return m["policy_tokens"] / cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "assets" / "default_model"))
    ap.add_argument("--images", type=int, default=8, help="screenshots in the vision tower's batch")
    ap.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per tower measurement")
    ap.add_argument("--envs", type=int, default=4)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    model, processor = load_vlm(args.model)
    tower = tower_ms(model, processor, args.images, args.seconds)
    del model
    tickets = [(k, bt.FAMILIES[k % len(bt.FAMILIES)]) for k in range(args.episodes)]
    res = {"vision_ms_per_screenshot": tower, "rollout_turns_per_cpu_s": {}, "learner_tokens_per_cpu_s": {}}
    old = os.environ.get(fast_vision.ENV)
    trajs = None
    try:
        for key, flag in (("stock", "0"), ("fast", "1")):
            os.environ[fast_vision.ENV] = flag  # read by load_vlm
            rate, played = rollout_turns_per_cpu_s(args.model, tickets, args.envs, args.max_new_tokens)
            res["rollout_turns_per_cpu_s"][key] = rate
            trajs = trajs or played  # both learners update on the same trajectories
            res["learner_tokens_per_cpu_s"][key] = learner_tokens_per_cpu_s(args.model, trajs, args.micro_batch_tokens)
    finally:
        if old is None:
            os.environ.pop(fast_vision.ENV, None)
        else:
            os.environ[fast_vision.ENV] = old
    print(f"{'':32}{'stock':>10}{'fast':>10}{'ratio':>8}")
    for name, unit in (("vision_ms_per_screenshot", "vision-tower CPU ms / screenshot"),
                       ("rollout_turns_per_cpu_s", "rollout turns / CPU-s"),
                       ("learner_tokens_per_cpu_s", "learner tokens / CPU-s")):
        r = res[name]
        print(f"{unit:32}{r['stock']:10.2f}{r['fast']:10.2f}{r['stock'] / r['fast'] if 'ms' in name else r['fast'] / r['stock']:7.2f}x")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
