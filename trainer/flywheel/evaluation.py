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
                   progress=None, miniwob: bool = False, n_envs: int = 16) -> dict:
    """trainer.episodes.evaluate (batched, the one runner), plus the signature that says which
    evaluations compare. progress(done, total)."""
    from trainer.episodes import evaluate

    total, done = len(families) * seeds_per_family, [0]

    def tick():
        done[0] += 1
        progress(done[0], total)

    out = evaluate(actor, families, seeds_per_family, env_kw=env_kw, n_envs=n_envs, progress=tick if progress else None)
    out["eval_signature"] = eval_signature(families, seeds_per_family, env_kw, max_new_tokens)
    if miniwob:
        out["miniwob"] = miniwob_status()
    return out


def miniwob_status() -> dict:
    """MiniWoB++ is evaluated only where installed; this says whether it is and why not."""
    try:
        import miniwob  # noqa: F401
    except ImportError:
        return {"skipped": "the miniwob package is not installed (pip install miniwob; see the README)"}
    return {"skipped": "MiniWoB++ is installed but Tandem has no MiniWoB executor yet; sandbox seeds only"}
