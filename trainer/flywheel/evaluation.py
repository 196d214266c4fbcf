"""Held-out evaluation of a checkpoint: greedy episodes on the sandbox's held-out seeds (the same
seeds for every model, so versions compare), per family: success, the verifier's progress, and
the share of outputs that parse. MiniWoB++ joins when the `miniwob` package is installed and
asked for; it is skipped, with the reason recorded, when it is not.
"""
from __future__ import annotations

import hashlib
import json


def eval_signature(families, seeds_per_family: int, env_kw: dict, max_new_tokens: int) -> str:
    """Two evaluations compare only when this matches (same tasks, seeds, screen, budget)."""
    key = json.dumps({"families": list(families), "seeds": seeds_per_family, "env": env_kw, "tokens": max_new_tokens},
                     sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def evaluate_model(model_dir, families: list[str], seeds_per_family: int, *, env_kw: dict, max_new_tokens: int = 48,
                   progress=None, miniwob: bool = False) -> dict:
    """Metrics of the checkpoint in model_dir on held-out seeds. progress(done, total)."""
    from agent.vlm import load_vlm
    from trainer.actor import VLMActor

    model, processor = load_vlm(model_dir, device="cpu")
    return evaluate_actor(VLMActor(model, processor, max_new_tokens=max_new_tokens), families, seeds_per_family,
                          env_kw=env_kw, max_new_tokens=max_new_tokens, progress=progress, miniwob=miniwob)


def evaluate_actor(actor, families: list[str], seeds_per_family: int, *, env_kw: dict, max_new_tokens: int = 48,
                   progress=None, miniwob: bool = False) -> dict:
    from trainer.rollout import run_episode
    from trainer.sandbox.env import SandboxEnv
    from trainer.sandbox.task import HELDOUT_START

    if seeds_per_family < 1:
        raise ValueError(f"seeds_per_family must be at least 1, got {seeds_per_family}")
    total = len(families) * seeds_per_family
    env = SandboxEnv(**env_kw)
    out: dict = {"families": {}}
    done = turns = parsed = 0
    try:
        for fam in families:
            wins, prog, steps = 0, 0.0, 0
            for k in range(seeds_per_family):
                tr = run_episode(actor, env, HELDOUT_START + k, family=fam, greedy=True)
                wins += tr.success
                prog += tr.progress
                steps += len(tr.turns)
                turns += len(tr.turns)
                parsed += sum(t.parse_error is None for t in tr.turns)
                done += 1
                if progress:
                    progress(done, total)
            out["families"][fam] = {"success": wins / seeds_per_family, "progress": prog / seeds_per_family,
                                    "mean_steps": steps / seeds_per_family, "episodes": seeds_per_family}
    finally:
        env.close()
    fams = out["families"].values()
    out["mean_success"] = sum(f["success"] for f in fams) / len(out["families"])
    out["mean_progress"] = sum(f["progress"] for f in fams) / len(out["families"])
    out["format_rate"] = parsed / max(1, turns)
    out["eval_signature"] = eval_signature(families, seeds_per_family, env_kw, max_new_tokens)
    if miniwob:
        out["miniwob"] = miniwob_status()
    return out


def miniwob_status() -> dict:
    """MiniWoB++ is evaluated only where installed; this says whether it is and why not."""
    try:
        import miniwob  # noqa: F401
    except ImportError:
        return {"skipped": "the miniwob package is not installed (pip install miniwob; see ENVIRONMENT.md)"}
    return {"skipped": "MiniWoB++ is installed but Tandem has no MiniWoB executor yet; sandbox seeds only"}
