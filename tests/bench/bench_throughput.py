"""Learning throughput in one run, on one model, the same seeds and this machine: rollout turns
per second, sequential (today's path: one env, one episode, a batch-of-one `generate` that
re-encodes every screenshot each turn) against batched (trainer.rollout.runner.EpisodeRunner over
`--envs` sandbox processes, one batched generation per round, each screenshot preprocessed and
encoded once, each slot's last turn kept so a turn computes only its new tokens; also measured
without kept turns); and learner generated-tokens per second, sequential (one turn per forward,
PPOConfig.micro_batch_tokens = 0, share_prefix and chain_turns off) against packed (padded
micro-batches of many turns, the prompt start they share forwarded once, an episode's turns that
extend one another in one row; also measured without chained turns).

    python tests/bench/bench_throughput.py [--envs 32 --episodes 48 --learner-batch 16 --repeats 2] [--json]

Rollouts are sampled (temperature 1, what PPO plays) from the shipped default model on the six
families it was trained on, training seeds 0..episodes-1 for both paths. The learner rows run a
full PPO update (scoring, one policy pass, one critic pass) on the same batch of trajectories,
each from a fresh copy of the weights. torch uses every core in both paths. With --json the last
line is one JSON object:
{"rollout_turns_per_s": {"sequential": A, "batched": B}, "learner_tokens_per_s": {"sequential": C,
"packed": D}, "n_envs": N, ...}.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_table import print_table
from trainer.rollout.actors import Actor

MODEL = Path(__file__).resolve().parents[2] / "assets" / "default_model"
FAMILIES = ["click_button", "radio", "list_pick", "check_boxes", "dropdown", "tabs"]


class _OneAtATime(Actor):
    """The one-at-a-time path: every chat through the actor's own batch-of-one `generate`."""

    def __init__(self, actor):
        self.actor = actor

    def generate(self, messages, *, greedy=False):
        return self.actor.generate(messages, greedy=greedy)

    def model_extent(self, width, height):
        return self.actor.model_extent(width, height)


class _NoKeptTurns(_OneAtATime):
    """Batched generation with no slot keeping its last turn (every prompt computed in full)."""

    def generate_batch(self, chats, *, greedy=False, slots=None):
        return self.actor.generate_batch(chats, greedy=greedy, slots=None)


def rollouts(model_dir, tickets, n_envs: int, batched: bool, max_new_tokens: int, keep_turns: bool = True) -> tuple[dict, list]:
    from agent.vlm.model import load_vlm
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import EpisodeRunner
    from trainer.sandbox.env_process import make_envs

    model, processor = load_vlm(model_dir, device="cpu")
    actor = VLMActor(model, processor, temperature=1.0, max_new_tokens=max_new_tokens)
    # the baseline answers each chat with its own generate; without kept turns no slot keeps its last turn
    player = _OneAtATime(actor) if not batched else actor if keep_turns else _NoKeptTurns(actor)
    envs = make_envs(n_envs if batched else 1)  # started before the clock: a run starts them once
    try:
        runner = EpisodeRunner(player, envs)
        t0 = time.perf_counter()
        trajs = runner.run_all(tickets)
        wall = time.perf_counter() - t0
    finally:
        for e in envs:
            e.close()
    turns = sum(len(t.turns) for t in trajs)
    path = "sequential (baseline)" if not batched else f"batched, {n_envs} envs" + ("" if keep_turns else ", no kept turns")
    c = actor.cache
    row = {"path": path, "reused": c.reused_tokens / c.prompt_tokens if c.prompt_tokens else 0.0, "episodes": len(trajs),
           "turns": turns, "tokens": sum(t.n_generated for t in trajs), "seconds": wall, "turns_per_s": turns / wall,
           "rounds": runner.rounds, "success": sum(t.success for t in trajs) / len(trajs)}
    return row, trajs


def learner(model_dir, trajs, micro_batch_tokens: int, repeats: int, chain: bool = False) -> dict:
    """micro_batch_tokens 0: today's sequential learner (one turn per forward, nothing shared);
    else packed micro-batches with the shared prompt prefix forwarded once; chain: an episode's
    turns that extend one another share a row."""
    from trainer.learn.ppo import Learner, PPOConfig
    from trainer.learn.sft import load_for_training

    tokens = seconds = 0.0
    for _ in range(repeats):
        model, processor = load_for_training(model_dir, "cpu")
        lrn = Learner(model, processor, PPOConfig(epochs=1, lr=1e-5, micro_batch_tokens=micro_batch_tokens,
                                                  share_prefix=micro_batch_tokens > 0, chain_turns=chain))
        m = lrn.update(trajs)
        lrn.close()
        tokens += m["policy_tokens"]
        seconds += m["learner_seconds"]
    label = "sequential (baseline)" if micro_batch_tokens == 0 else f"packed, {micro_batch_tokens} tokens, shared prefix"
    label += ", chained turns" if chain else ""
    return {"path": label, "turns": sum(len(t.turns) for t in trajs) * repeats, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--envs", type=int, default=32, help="environments of the batched path")
    ap.add_argument("--episodes", type=int, default=48, help="episodes each rollout path plays (the same seeds)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--learner-batch", type=int, default=16, help="trajectories in the learner's batch")
    ap.add_argument("--repeats", type=int, default=2, help="learner updates per path (fresh weights each)")
    ap.add_argument("--micro-batch-tokens", type=int, default=2048, help="the packed path's token budget per forward")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", action="store_true", help="end with one JSON line")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    tickets = [(k, FAMILIES[k % len(FAMILIES)]) for k in range(args.episodes)]
    seq, _ = rollouts(args.model, tickets, 1, False, args.max_new_tokens)
    unkept, _ = rollouts(args.model, tickets, args.envs, True, args.max_new_tokens, keep_turns=False)
    bat, trajs = rollouts(args.model, tickets, args.envs, True, args.max_new_tokens)
    print("rollouts (sampled, the same seeds)")
    print_table([seq, unkept, bat], [("path", "path", "<"), ("episodes", "episodes", "d"), ("turns", "turns", "d"),
                                     ("tokens", "tokens", "d"), ("prompt tokens reused", "reused", ".0%"),
                                     ("seconds", "seconds", ".1f"), ("turns/s", "turns_per_s", ".1f"),
                                     ("rounds", "rounds", "d"), ("success", "success", ".0%")])
    print(f"batched / sequential: {bat['turns_per_s'] / seq['turns_per_s']:.2f}x turns per second "
          f"({unkept['turns_per_s'] / seq['turns_per_s']:.2f}x without kept turns)\n")

    budget = args.micro_batch_tokens
    batch = trajs[: args.learner_batch]
    l_seq = learner(args.model, batch, 0, args.repeats)
    l_unchained = learner(args.model, batch, budget, args.repeats)
    l_pack = learner(args.model, batch, budget, args.repeats, chain=True)
    print("learner (one PPO update: scoring, a policy pass, a critic pass)")
    print_table([l_seq, l_unchained, l_pack], [("path", "path", "<"), ("turns", "turns", "d"), ("tokens", "tokens", ".0f"),
                                               ("seconds", "seconds", ".1f"), ("tokens/s", "tokens_per_s", ".0f")])
    print(f"packed / sequential: {l_pack['tokens_per_s'] / l_seq['tokens_per_s']:.2f}x generated tokens per second "
          f"({l_unchained['tokens_per_s'] / l_seq['tokens_per_s']:.2f}x without chained turns)")
    if args.json:
        print(json.dumps({"rollout_turns_per_s": {"sequential": seq["turns_per_s"], "batched": bat["turns_per_s"],
                                                  "batched_no_kept_turns": unkept["turns_per_s"]},
                          "learner_tokens_per_s": {"sequential": l_seq["tokens_per_s"], "packed": l_pack["tokens_per_s"],
                                                   "packed_no_chains": l_unchained["tokens_per_s"]},
                          "n_envs": args.envs, "episodes": args.episodes, "learner_turns": l_seq["turns"] // args.repeats,
                          "micro_batch_tokens": budget, "threads": args.threads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
