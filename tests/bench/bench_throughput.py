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
    python tests/bench/bench_throughput.py --quick --threads 1 --json     # a few minutes

Rollouts are sampled (temperature 1, what PPO plays) from the shipped default model on the six
families it was trained on, training seeds 0..episodes-1 for both paths. The learner rows run a
full PPO update (scoring, one policy pass, one critic pass) on the same batch of trajectories,
each from a fresh copy of the weights. torch runs the threads agent.threads picks (the cores other
work leaves free; --threads overrides) in every path, and the first line says how many.

With --json the run also measures the roofline (tests/bench/roofline.py): the machine's fp32 and
bf16 matmul peak in FLOPs per CPU-second (torch.mm at 1 thread: per core; times the cores: the
machine's; and at the run's thread count), the FLOPs of a batched rollout turn and of a packed
learner update (torch's FlopCounterMode, on an extra untimed run), and each path's FLOPs per
CPU-second of its timed run (time.process_time: a loaded machine stretches wall time, not CPU
time), printed as a table; the last line is one JSON object:
{"rollout_turns_per_s": {"sequential": A, "batched": B}, "learner_tokens_per_s": {"sequential": C,
"packed": D}, "n_envs": N, ..., "roofline": {"peak_fp32_gflops": P32, "peak_bf16_gflops": P16,
"rollout_gflops": R, "learner_gflops": L, "rollout_fraction": R/P32, "learner_fraction": L/P32,
"flops_per_turn": F, ...}} (peaks per core; R and L per CPU-second).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.threads import choose_threads
from tests.bench.bench_table import print_table
from tests.bench.roofline import peaks
from trainer.rollout.actors import Actor

MODEL = Path(__file__).resolve().parents[2] / "assets" / "default_model"
FAMILIES = ["click_button", "radio", "list_pick", "check_boxes", "dropdown", "tabs"]
QUICK = {"envs": 4, "episodes": 8, "learner_batch": 4, "repeats": 1}  # --quick: minutes on 2 shared cores


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


def rollouts(model_dir, tickets, n_envs: int, batched: bool, max_new_tokens: int, keep_turns: bool = True,
             count_flops: bool = False) -> tuple[dict, list]:
    """One rollout path over `tickets`; with count_flops, after the timed run the first `n_envs`
    tickets are played again under torch's FLOP counter (untimed: counting slows every op) for the
    path's FLOPs per turn (row["flops_per_turn"])."""
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
        t0, c0 = time.perf_counter(), time.process_time()
        trajs = runner.run_all(tickets)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if count_flops:
            from tests.bench.roofline import counting

            actor.cache.clear_features()  # no screenshot of the timed run's seeds encoded for free
            with counting() as flops:
                counted = EpisodeRunner(player, envs).run_all(tickets[:n_envs])
            flops_per_turn = flops.get_total_flops() / max(1, sum(len(t.turns) for t in counted))
    finally:
        for e in envs:
            e.close()
    turns = sum(len(t.turns) for t in trajs)
    path = "sequential (baseline)" if not batched else f"batched, {n_envs} envs" + ("" if keep_turns else ", no kept turns")
    c = actor.cache
    row = {"path": path, "reused": c.reused_tokens / c.prompt_tokens if c.prompt_tokens else 0.0, "episodes": len(trajs),
           "turns": turns, "tokens": sum(t.n_generated for t in trajs), "seconds": wall, "turns_per_s": turns / wall,
           "cpu_seconds": cpu, "rounds": runner.rounds, "success": sum(t.success for t in trajs) / len(trajs)}
    if count_flops:
        row["flops_per_turn"] = flops_per_turn
    return row, trajs


def learner(model_dir, trajs, micro_batch_tokens: int, repeats: int, chain: bool = False,
            count_flops: bool = False) -> dict:
    """micro_batch_tokens 0: today's sequential learner (one turn per forward, nothing shared);
    else packed micro-batches with the shared prompt prefix forwarded once; chain: an episode's
    turns that extend one another share a row. count_flops: one more update (untimed, fresh
    weights) under torch's FLOP counter gives row["flops_per_update"]."""
    from trainer.learn.ppo import Learner, PPOConfig
    from trainer.learn.sft import load_for_training

    tokens = seconds = cpu = 0.0
    flops = None
    for k in range(repeats + count_flops):
        model, processor = load_for_training(model_dir, "cpu")
        lrn = Learner(model, processor, PPOConfig(epochs=1, lr=1e-5, micro_batch_tokens=micro_batch_tokens,
                                                  share_prefix=micro_batch_tokens > 0, chain_turns=chain))
        if k == repeats:  # the counted update
            from tests.bench.roofline import counting

            with counting() as counter:
                lrn.update(trajs)
            lrn.close()
            flops = counter.get_total_flops()
            break
        c0 = time.process_time()
        m = lrn.update(trajs)
        cpu += time.process_time() - c0
        lrn.close()
        tokens += m["policy_tokens"]
        seconds += m["learner_seconds"]
    label = "sequential (baseline)" if micro_batch_tokens == 0 else f"packed, {micro_batch_tokens} tokens, shared prefix"
    label += ", chained turns" if chain else ""
    row = {"path": label, "turns": sum(len(t.turns) for t in trajs) * repeats, "tokens": tokens, "seconds": seconds,
           "cpu_seconds": cpu, "tokens_per_s": tokens / seconds}
    if flops is not None:
        row["flops_per_update"] = flops
    return row


def roofline(peak_rows: list[dict], bat: dict, l_pack: dict, repeats: int) -> dict:
    """The JSON "roofline": peaks per core (1 thread) and the two paths' GFLOP per CPU-second, each
    path's FLOPs those torch counted for the same work (the batched rollouts' per turn times their
    turns; the packed learner's per update times its updates)."""
    p = {r["dtype"]: r for r in peak_rows}
    r = bat["flops_per_turn"] * bat["turns"] / bat["cpu_seconds"] / 1e9
    learn = l_pack["flops_per_update"] * repeats / l_pack["cpu_seconds"] / 1e9
    return {"peak_fp32_gflops": p["fp32"]["per_core"], "peak_bf16_gflops": p["bf16"]["per_core"],
            "rollout_gflops": r, "learner_gflops": learn, "rollout_fraction": r / p["fp32"]["per_core"],
            "learner_fraction": learn / p["fp32"]["per_core"], "flops_per_turn": bat["flops_per_turn"],
            "learner_flops_per_update": l_pack["flops_per_update"],
            "peak_fp32_gflops_machine": p["fp32"]["machine"], "peak_bf16_gflops_machine": p["bf16"]["machine"],
            "peak_fp32_gflops_at_threads": p["fp32"]["at_threads"],
            "peak_bf16_gflops_at_threads": p["bf16"]["at_threads"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(MODEL))
    ap.add_argument("--envs", type=int, default=32, help="environments of the batched path")
    ap.add_argument("--episodes", type=int, default=48, help="episodes each rollout path plays (the same seeds)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--learner-batch", type=int, default=16, help="trajectories in the learner's batch")
    ap.add_argument("--repeats", type=int, default=2, help="learner updates per path (fresh weights each)")
    ap.add_argument("--micro-batch-tokens", type=int, default=2048, help="the packed path's token budget per forward")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: the cores other work leaves free, agent.threads; TANDEM_THREADS too)")
    ap.add_argument("--quick", action="store_true",
                    help="a run of a few minutes: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                         + " unless given")
    ap.add_argument("--json", action="store_true", help="also measure the roofline; end with one JSON line")
    args = ap.parse_args(argv)
    if args.quick:
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)

    threads = choose_threads(args.threads)  # before the sandbox processes start: they are this run's work
    threads.apply()
    args.threads = threads.threads
    print(threads.line())
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    peak_rows = peaks(args.threads, threads.cores) if args.json else []
    tickets = [(k, FAMILIES[k % len(FAMILIES)]) for k in range(args.episodes)]
    seq, _ = rollouts(args.model, tickets, 1, False, args.max_new_tokens)
    unkept, _ = rollouts(args.model, tickets, args.envs, True, args.max_new_tokens, keep_turns=False)
    bat, trajs = rollouts(args.model, tickets, args.envs, True, args.max_new_tokens, count_flops=args.json)
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
    l_pack = learner(args.model, batch, budget, args.repeats, chain=True, count_flops=args.json)
    print("learner (one PPO update: scoring, a policy pass, a critic pass)")
    print_table([l_seq, l_unchained, l_pack], [("path", "path", "<"), ("turns", "turns", "d"), ("tokens", "tokens", ".0f"),
                                               ("seconds", "seconds", ".1f"), ("tokens/s", "tokens_per_s", ".0f")])
    print(f"packed / sequential: {l_pack['tokens_per_s'] / l_seq['tokens_per_s']:.2f}x generated tokens per second "
          f"({l_unchained['tokens_per_s'] / l_seq['tokens_per_s']:.2f}x without chained turns)")
    if args.json:
        roof = roofline(peak_rows, bat, l_pack, args.repeats)
        print(f"\nroofline (GFLOP per CPU-second; peaks: {args.threads} torch.mm threads, machine: per core x {threads.cores})")
        print_table(peak_rows, [("peak", "dtype", "<"), ("per core", "per_core", ".1f"),
                                (f"at {args.threads} threads", "at_threads", ".1f"), ("machine", "machine", ".1f")])
        print_table([{"path": "rollouts (batched)", "gflop": bat["flops_per_turn"] * bat["turns"] / 1e9,
                      "cpu": bat["cpu_seconds"], "rate": roof["rollout_gflops"], "frac": roof["rollout_fraction"]},
                     {"path": "learner (packed)", "gflop": l_pack["flops_per_update"] * args.repeats / 1e9,
                      "cpu": l_pack["cpu_seconds"], "rate": roof["learner_gflops"], "frac": roof["learner_fraction"]}],
                    [("path", "path", "<"), ("GFLOP", "gflop", ".1f"), ("CPU-s", "cpu", ".1f"),
                     ("GFLOP/CPU-s", "rate", ".1f"), ("of fp32 peak", "frac", ".0%"),
                     ("of bf16 peak", lambda r: r["rate"] / roof["peak_bf16_gflops"], ".0%")])
        print(f"FLOPs per rollout turn: {roof['flops_per_turn'] / 1e9:.2f} GFLOP")
        print(json.dumps({"rollout_turns_per_s": {"sequential": seq["turns_per_s"], "batched": bat["turns_per_s"],
                                                  "batched_no_kept_turns": unkept["turns_per_s"]},
                          "learner_tokens_per_s": {"sequential": l_seq["tokens_per_s"], "packed": l_pack["tokens_per_s"],
                                                   "packed_no_chains": l_unchained["tokens_per_s"]},
                          "n_envs": args.envs, "episodes": args.episodes, "learner_turns": l_seq["turns"] // args.repeats,
                          "micro_batch_tokens": budget, "threads": args.threads, "roofline": roof}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
