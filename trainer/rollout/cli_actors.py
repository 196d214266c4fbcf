"""What the sandbox's commands share to play a model: a progress bar, and the policy or batched
actor that --policy default/local/endpoint names."""
from __future__ import annotations

import sys
from dataclasses import replace

from agent.policies.choice import CLI
from agent.policies.choice import make_policy as choose
from agent.threads import choose_threads
from agent.vlm.model import load_vlm
from trainer.rollout.actors import PolicyActor, VLMActor


def progress_bar(total: int, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="ep", file=sys.stderr, disable=None)


def make_policy(args):
    """The agent Policy for --policy default/local/endpoint (agent.policies.choice), or PolicyError."""
    return choose(args.policy, base_url=args.url, model=args.model, model_dir=args.model_dir, platform="sandbox",
                  spelling=replace(CLI, base_url="--url"))


def make_actor(args):
    """The actor for a model policy: a local model answers many chats per batched generation; an
    endpoint answers one at a time."""
    if args.max_new_tokens < 1:
        raise RuntimeError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.envs < 1:
        raise RuntimeError(f"--envs must be at least 1, got {args.envs}")
    policy = make_policy(args)
    if args.policy == "endpoint":
        return PolicyActor(policy)

    # decided before the sandbox processes start, so their start-up does not count as other work
    print(choose_threads(args.threads).apply().line(), file=sys.stderr)
    model, processor = load_vlm(policy.model_dir, dtype=args.inference_dtype)
    return VLMActor(model, processor, max_new_tokens=args.max_new_tokens, inference_dtype=args.inference_dtype)
