"""Rollout throughput, asynchronous vs synchronous, in one run, with long-tail episode lengths;
and the learner's tokens per second.

    python tests/bench/bench_rollouts.py [--updates 8 --batch 8 --workers 2 --latency 1.0 --remote-workers 8
                                          --scenarios local,remote,learner --learner-repeats 3]

The policy is the tiny VLM (random weights, so most episodes run to their family's step limit);
the families mix step limits of 4 and 14-16 steps, which gives the long tail. Each "update" is
the real PPO learner step of trainer.learn.ppo: the batch's turns scored (proximal log-probs, critic
values, decoupled GAE), then a policy epoch and a critic epoch over every generated token, and
the new weights broadcast. Both modes use the same worker processes (RolloutPool.set_mode), sync
first: in sync mode the workers wait for the whole batch and for the update; in async mode they
keep playing. Learner tokens/s counts generated tokens through one update (scoring, one policy
and one critic epoch), PPOConfig's defaults (vision tower frozen, each screenshot encoded once).

Two scenarios, each sync then async: the local Qt sandbox (every step costs CPU, on the same
cores as the learner), and a remote sandbox where every step also waits `--latency` seconds on
the environment (a VM or a browser, as in UI-TARS-2's and AReaL's setups; WorkerSpec.env_latency_s
sleeps, using no CPU) with `--remote-workers` workers. `--latency 0` skips the second.
"steady" is steps/s from the end of the first update to the end of the last: the pipeline full,
as a long run sees it (async cannot overlap anything before its first batch is in).
Each scenario also runs "no learner" rows (no update, no new weights): the rollout system alone,
where sync waits for each batch's longest episode and async does not.
Eight updates by default: async gains nothing on the first batch, and over four updates that
start-up weighed the whole-run ratio down to 1.82x. Measured on 2 CPU cores (stop 17), remote,
8 updates: sync 2.92 steps/s, async 6.13, 2.10x over the whole run (steady 2.28x); rollouts alone
1.88x (steady 2.01x). The local scenario stays near 1x on 2 cores: there every step and the
learner compete for the same two cores, so there is little idle time for async to fill.
Async batches lean to short episodes (the first to finish), which the last-batch lengths show.
Workers run niced (WorkerSpec.nice), so in async mode the learner keeps its speed while they
take the cycles it leaves. The "learner" scenario times the learner alone on one batch, vision tower frozen (the default)
against trained, the baseline, in the same run; with `--learner-devices cpu,cuda` (the default
where torch sees a GPU) it does both on the CPU and on the GPU, the CPU rows the baseline.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAMILIES = ["click_button", "radio", "list_pick", "click_button", "radio", "form", "settings_chain", "scroll_find"]


def run(mode: str, pool, model, processor, updates: int, batch: int, learn: bool = True) -> dict:
    from trainer.learn.ppo import Learner, PPOConfig

    learner = Learner(model, processor, PPOConfig(epochs=1, lr=1e-4))
    pool.set_mode(mode)
    pool.publish(model)
    t0 = time.perf_counter()
    episodes = steps = tokens = 0
    learn_s = 0.0
    dropped0 = pool.stats["dropped"]
    ends, batch_steps = [], []  # when each update finished, and the steps of its batch
    for _ in range(updates):
        trajs = pool.collect(batch, timeout=600)
        episodes += len(trajs)
        batch_steps.append(sum(len(t.turns) for t in trajs))
        steps += batch_steps[-1]
        if learn:
            m = learner.update(trajs)
            tokens += m["learner_tokens"]
            learn_s += m["learner_seconds"]
            pool.publish(model)
        ends.append(time.perf_counter())
    wall = time.perf_counter() - t0
    learner.close()
    # steady state: after the first update, once the pipeline is full (async has nothing to
    # overlap before its first batch is in)
    steady = sum(batch_steps[1:]) / (ends[-1] - ends[0]) if len(ends) > 1 else float("nan")
    lens = sorted(len(t.turns) for t in trajs)
    return {"mode": mode + ("" if learn else " (no learner)"), "episodes": episodes, "steps": steps, "wall_s": wall, "episodes_per_s": episodes / wall,
            "steps_per_s": steps / wall, "steady_steps_per_s": steady, "learner_tokens_per_s": tokens / learn_s if learn_s else 0.0,
            "learner_share": learn_s / wall, "dropped": pool.stats["dropped"] - dropped0, "last_batch_lengths": lens}


def learner_rows(model_dir, batch: int, repeats: int, devices=("cpu",)) -> list[dict]:
    """The learner alone on one batch, vision tower frozen (each distinct screenshot encoded once
    per batch, the default) against trained (every turn's forward re-encodes its screenshots),
    `repeats` updates each from the same starting weights, on each of `devices` (the first row,
    CPU with the tower trained, is the baseline)."""
    from agent.vlm.model import load_vlm
    from trainer.learn.ppo import Learner, PPOConfig
    from trainer.learn.sft import load_for_training
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import run_episode
    from trainer.sandbox.env import SandboxEnv

    model, processor = load_vlm(model_dir, device="cpu")
    env = SandboxEnv(width=224, height=168)
    try:
        actor = VLMActor(model, processor, max_new_tokens=24)
        trajs = [run_episode(actor, env, s, family=FAMILIES[s % len(FAMILIES)], max_steps=6) for s in range(batch)]
    finally:
        env.close()
    rows = []
    for device in devices:
        for train_vision in (True, False):
            model, processor = load_for_training(model_dir, device)
            learner = Learner(model, processor, PPOConfig(epochs=1, lr=1e-4, train_vision=train_vision))
            tokens = seconds = 0.0
            for _ in range(repeats):
                m = learner.update(trajs)  # its metrics are read back as floats: the GPU has finished
                tokens += m["learner_tokens"]
                seconds += m["learner_seconds"]
            learner.close()
            vision = "trained" if train_vision else "frozen, image bank"
            rows.append({"vision": f"{device}, {vision}" + (" (baseline)" if not rows else ""), "tokens": tokens,
                         "seconds": seconds, "tokens_per_s": tokens / seconds,
                         "turns": sum(len(t.turns) for t in trajs) * repeats})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="workers of the local scenario")
    ap.add_argument("--latency", type=float, default=1.0,
                    help="seconds per step of the remote scenario (0: skip it); VM sandboxes such as OSWorld's "
                         "wait a second or more per step for the screen to settle")
    ap.add_argument("--remote-workers", type=int, default=8)
    ap.add_argument("--scenarios", default="local,remote,learner",
                    help="which to run: local, remote (rollouts with the learner) and learner (the learner alone)")
    ap.add_argument("--learner-repeats", type=int, default=3)
    ap.add_argument("--learner-devices", default="auto",
                    help="devices of the learner scenario, comma-separated (auto: cpu, and cuda when torch sees a GPU)")
    a = ap.parse_args(argv)
    wanted = {x.strip() for x in a.scenarios.split(",") if x.strip()}
    if not wanted or wanted - {"local", "remote", "learner"}:
        ap.error(f"--scenarios takes local, remote and/or learner, got {a.scenarios!r}")
    import torch

    devices = (["cpu"] + (["cuda"] if torch.cuda.is_available() else []) if a.learner_devices == "auto"
               else [d.strip() for d in a.learner_devices.split(",") if d.strip()])
    if any(d.startswith("cuda") for d in devices) and not torch.cuda.is_available():
        ap.error(f"--learner-devices {a.learner_devices}: torch sees no CUDA GPU")
    torch.set_num_threads(1)
    from agent.vlm.model import load_vlm
    from trainer.learn.tiny_model import build_tiny_model
    from trainer.rollout.pool import RolloutPool, WorkerSpec
    from trainer.rollout.specs import ActorSpec, EnvSpec

    scenarios = ([("local", a.workers, 0.0)] if "local" in wanted else []) + (
        [("remote", a.remote_workers, a.latency)] if a.latency > 0 and "remote" in wanted else [])
    results, learner = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny")
        if "learner" in wanted:
            learner = learner_rows(model_dir, a.batch, a.learner_repeats, devices)
        for name, workers, latency in scenarios:
            spec = WorkerSpec(str(model_dir), str(Path(tmp) / f"w-{name}"), env=EnvSpec(width=224, height=168),
                              actor=ActorSpec(max_new_tokens=24), env_latency_s=latency)
            rows = []
            with RolloutPool(spec, workers, mode="sync", max_staleness=2, families=FAMILIES).start(
                    load_vlm(model_dir, device="cpu")[0]) as pool:
                pool.wait_ready()
                for learn in (True, False):
                    for mode in ("sync", "async"):
                        model, processor = load_vlm(model_dir, device="cpu")  # each mode starts from the same weights
                        rows.append(run(mode, pool, model, processor, a.updates, a.batch, learn))
            results.append((f"{name} sandbox, {workers} workers, +{latency:g} s/step", rows))
    for title, rows in results:
        print(f"\n{title}")
        print(f"{'mode':<20} {'episodes':>8} {'steps':>6} {'wall s':>7} {'ep/s':>6} {'steps/s':>7} {'steady':>7} "
              f"{'learner tok/s':>13} {'learner %':>9} {'dropped':>7}  last batch lengths")
        for r in rows:
            print(f"{r['mode']:<20} {r['episodes']:>8} {r['steps']:>6} {r['wall_s']:>7.1f} {r['episodes_per_s']:>6.2f} "
                  f"{r['steps_per_s']:>7.2f} {r['steady_steps_per_s']:>7.2f} {r['learner_tokens_per_s']:>13.0f} "
                  f"{r['learner_share']:>9.0%} {r['dropped']:>7}  {r['last_batch_lengths']}")
        ratio = lambda k, a, b, rows=rows: rows[a][k] / rows[b][k]
        print(f"async / sync throughput (steps/s): with the learner {ratio('steps_per_s', 1, 0):.2f}x "
              f"(steady state after the first update {ratio('steady_steps_per_s', 1, 0):.2f}x), "
              f"rollouts alone {ratio('steps_per_s', 3, 2):.2f}x (steady {ratio('steady_steps_per_s', 3, 2):.2f}x)")
    if learner:
        print(f"\nlearner alone: {a.learner_repeats} PPO updates (score, one policy and one critic epoch) on one batch of "
              f"{a.batch} episodes")
        print(f"{'device, vision tower':<34} {'turns':>6} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} {'vs baseline':>11}")
        for r in learner:
            print(f"{r['vision']:<34} {r['turns']:>6} {r['tokens']:>7.0f} {r['seconds']:>8.1f} {r['tokens_per_s']:>9.0f} "
                  f"{r['tokens_per_s'] / learner[0]['tokens_per_s']:>10.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
