"""How long the live agent waits for the local model each step (Supervise, Drive, `agent run`
with a local or the default policy): the shipped default model drives sandbox tasks through the
real loop (agent.run.loop.AgentLoop, the sandbox in its own process), with the last step's keys and
values kept (LocalVLMPolicy(keep_turns=True), the default) and with every prompt computed anew,
in alternating rounds so machine noise hits both alike. Greedy: both play the same steps.

    python tests/bench/bench_live_steps.py [--rounds 2 --steps 6 --threads 2]

Measured on the reference machine (2 CPU cores, stop 36): 36 steps each, every prompt computed
59.7 ms a step (median 63.8), the last step kept 36.4 ms (median 38.8): 1.64x, the same replies.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_table import print_table

TASKS = (("check_boxes", 11), ("tabs", 5), ("list_pick", 7))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6, help="step limit per task")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import torch

    from agent import coords
    from agent.policies import LocalVLMPolicy
    from agent.run.loop import AgentLoop, LoopConfig
    from agent.storage.model_files import DEFAULT_MODEL_DIR
    from agent.storage.store import Store
    from app.sandbox_executor import SandboxProcessExecutor

    torch.set_num_threads(a.threads)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    replies: dict[bool, list[str]] = {True: [], False: []}
    for _ in range(a.rounds):
        for keep in (False, True):
            policy = LocalVLMPolicy(str(DEFAULT_MODEL_DIR), space=coords.SMART_RESIZE, max_new_tokens=64,
                                    keep_turns=keep).load()
            generate = policy.generate

            def timed(messages, generate=generate, keep=keep):
                t0 = time.perf_counter()
                text = generate(messages)
                seconds[keep].append(time.perf_counter() - t0)
                replies[keep].append(text)
                return text

            policy.generate = timed
            for family, seed in TASKS:
                ex = SandboxProcessExecutor(family, seed)
                with tempfile.TemporaryDirectory() as tmp:
                    store = Store(Path(tmp) / "data")
                    try:
                        AgentLoop(policy, ex, store=store, config=LoopConfig(max_steps=a.steps, max_reasks=1)).run(
                            "Do the task on the screen")
                    finally:
                        ex.close()
                        store.close()
    rows = [{"path": "kept last step" if keep else "every prompt computed", "steps": len(seconds[keep]),
             "mean": 1000 * statistics.mean(seconds[keep]), "median": 1000 * statistics.median(seconds[keep])}
            for keep in (False, True)]
    print_table(rows, [("path", "path", "<"), ("steps", "steps", "d"), ("mean ms", "mean", ".1f"),
                       ("median ms", "median", ".1f")])
    print(f"kept / computed: {rows[0]['mean'] / rows[1]['mean']:.2f}x faster a step; "
          f"the same replies: {replies[True] == replies[False]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
