"""fp32 against bf16 inference for rollouts and evaluation (issue 42): the same greedy held-out
episodes played by the same checkpoint loaded in each dtype, and how far apart they come out.

    OMP_NUM_THREADS=1 python -m tests.bench.bench_inference_dtype --episodes 112 --envs 16 --json

Reports, per dtype, the success rate with its Wilson 95% interval and the model's CPU-seconds
per turn (this process's CPU time at one torch thread: generation, parsing and memory; the
sandboxes run in processes of their own); and between them: the share of turns whose replies are
identical (turn k of an episode against turn k of the same episode; a turn one side never played
counts as different), the share of episodes with the same outcome, the paired difference of the
success rates (bf16 - fp32, Newcombe's interval), and the mean |log-prob difference| between the
bf16 actor's recorded log-probs and the fp32 learner's recomputation of the same tokens (what
PPO's importance ratio sees), beside the same for the fp32 actor (the pointer's rewritten
coordinates make that nonzero too). The model defaults to the shipped element-list model, at the
screen size and observation it was trained with (as `sandbox eval --policy default`).
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def play(model_dir, dtype: str, tickets, envs: int, max_new_tokens: int, env_kw: dict):
    from agent.vlm.model import load_vlm
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import EpisodeRunner
    from trainer.sandbox.env_process import make_envs

    model, processor = load_vlm(model_dir, device="cpu", dtype=dtype)
    actor = VLMActor(model, processor, max_new_tokens=max_new_tokens)
    pool = make_envs(min(envs, len(tickets)), **env_kw)
    try:
        runner = EpisodeRunner(actor, pool, greedy=True, platform="desktop")
        c0, w0 = time.process_time(), time.perf_counter()
        trajs = runner.run_all(tickets)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    finally:
        for env in pool:
            env.close()
    return trajs, cpu, wall, model, processor


def agreement(a: list, b: list) -> dict:
    """Turn and outcome agreement of two plays of the same tickets (episode i of each on one task)."""
    same_turns = total_turns = same_eps = same_replies_eps = 0
    for x, y in zip(a, b, strict=True):
        assert (x.family, x.seed) == (y.family, y.seed)
        n = max(len(x.turns), len(y.turns))
        same = sum(1 for s, t in zip(x.turns, y.turns, strict=False) if s.text == t.text)
        same_turns, total_turns = same_turns + same, total_turns + n
        same_eps += x.success == y.success
        same_replies_eps += same == n
    return {"turns": total_turns, "identical_turns": same_turns / max(1, total_turns),
            "same_outcome": same_eps / len(a), "identical_episodes": same_replies_eps / len(a)}


def logprob_gap(trajs, model_fp32, processor, limit: int) -> dict:
    """Mean and max |bf16 actor's log-prob - fp32 learner's| over the generated tokens of up to
    `limit` turns, scored as PPO scores them (trainer.learn.ppo_batch)."""
    import torch

    from trainer.learn.ppo_batch import build_turns, pack_logprobs, packs

    turns = [tb for tb in build_turns(trajs, processor) if tb.behaviour_lp is not None][:limit]
    gaps = []
    with torch.no_grad():
        for p in packs(turns, model_fp32.config, model_fp32.device, 0):
            lp = pack_logprobs(model_fp32, p, 1.0)
            gaps.append((lp - torch.cat([tb.behaviour_lp for tb in p.turns])).abs())
    g = torch.cat(gaps)
    # beyond 0.2 the importance ratio leaves PPO's clip range (0.8-1.28) either way
    return {"turns": len(turns), "tokens": int(g.numel()), "mean_abs": float(g.mean()), "median_abs": float(g.median()),
            "p99_abs": float(g.quantile(0.99)), "max_abs": float(g.max()), "over_0.2": float((g > 0.2).float().mean())}


def main(argv=None) -> int:
    import torch

    from agent.storage.model_files import DEFAULT_MODEL_DIR
    from trainer.rollout.runner import plan
    from trainer.rollout.sandbox_cli import model_screen, trained_families
    from trainer.sandbox.env import observation_for
    from trainer.stats import paired_difference, rate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--episodes", type=int, default=112)
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--logprob-turns", type=int, default=200, help="turns whose log-probs the fp32 learner rescores")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    screen = model_screen(args.model_dir)
    env_kw = {"width": screen.get("width", 320), "height": screen.get("height", 240),
              "observation": observation_for(args.model_dir)}
    tickets = plan(args.episodes, "heldout", trained_families(args.model_dir))
    runs, models = {}, {}
    for dtype in ("fp32", "bf16"):
        trajs, cpu, wall, model, processor = play(args.model_dir, dtype, tickets, args.envs, args.max_new_tokens, env_kw)
        n_turns = sum(len(t.turns) for t in trajs)
        runs[dtype] = {"trajs": trajs, **rate([t.success for t in trajs]), "turns": n_turns,
                       "cpu_s_per_turn": cpu / max(1, n_turns), "wall_s": wall}
        models[dtype] = (model, processor)
        print(f"{dtype}: {runs[dtype]['success']:.3f} over {len(trajs)} episodes, {n_turns} turns, "
              f"{runs[dtype]['cpu_s_per_turn']:.3f} CPU-s/turn", file=sys.stderr, flush=True)
    a, b = runs["fp32"]["trajs"], runs["bf16"]["trajs"]
    out = {"model_dir": args.model_dir, "episodes": len(tickets), "threads": args.threads, "env": env_kw,
           "fp32": {k: v for k, v in runs["fp32"].items() if k != "trajs"},
           "bf16": {k: v for k, v in runs["bf16"].items() if k != "trajs"},
           "agreement": agreement(a, b),
           "paired_difference": paired_difference([t.success for t in a], [t.success for t in b]),
           # the fp32 actor's own gap is the baseline: the pointer rewrites the coordinate digits it writes, and the
           # token after them was sampled after the model's own digits, so the learner's rescoring differs there
           # whatever the dtype; bf16's cost is its gap beyond that
           "logprob_gap": {"bf16_actor": logprob_gap(b, *models["fp32"], args.logprob_turns),
                           "fp32_actor": logprob_gap(a, *models["fp32"], args.logprob_turns)}}
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
