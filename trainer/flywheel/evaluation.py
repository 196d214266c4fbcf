"""Held-out evaluation of a checkpoint: greedy episodes on the sandbox's held-out seeds (the same
seeds for every model, so versions compare), per family: success, the verifier's progress, and
the share of outputs that parse.

MiniWoB++ joins when asked for (the flywheel asks for its candidates) and it can run here (the
`miniwob` package, Chromium and chromedriver): the same greedy episodes on MINIWOB_TASKS, reported
on their own under "miniwob". It is an external test of transfer: not in mean_success, so never
part of a promotion decision, and its episodes are never stored, so never training data. Where it
cannot run, "miniwob" says why ({"skipped": reason}); a run that fails says so ({"error": ...})
and leaves the sandbox's numbers standing.
"""
from __future__ import annotations

import hashlib
import json

from trainer.sandbox.miniwob_eval import DEFAULT_TASKS as MINIWOB_TASKS
# MiniWoB's own clock is 10 s an episode in most tasks; a model on a CPU thinks for seconds a step
MINIWOB_EPISODE_SECONDS = 120.0


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

    missing = miniwob_missing() if miniwob else "not asked for"
    total, done = len(families) * seeds_per_family, [0]
    total += 0 if missing else len(MINIWOB_TASKS) * seeds_per_family

    def tick(*_):
        done[0] += 1
        progress(done[0], total)

    out = evaluate(actor, families, seeds_per_family, env_kw=env_kw, n_envs=n_envs, progress=tick if progress else None)
    out["eval_signature"] = eval_signature(families, seeds_per_family, env_kw, max_new_tokens)
    if miniwob:
        out["miniwob"] = {"skipped": f"MiniWoB++ cannot run here: {missing}"} if missing else evaluate_on_miniwob(
            actor, seeds_per_family, max_steps=env_kw.get("max_steps"), progress=tick if progress else None)
    return out


def miniwob_missing() -> str | None:
    """None when MiniWoB++ can run here, else what is missing (without importing it when absent)."""
    from trainer.sandbox.miniwob_env import available

    return available()


def evaluate_on_miniwob(actor, episodes_per_task: int, *, max_steps: int | None = None, progress=None) -> dict:
    """The actor's greedy episodes on MINIWOB_TASKS (seeds 0.. of each), with MiniWoB's clock at
    MINIWOB_EPISODE_SECONDS: per task ("families") and overall success with Wilson intervals."""
    from trainer.sandbox.miniwob_eval import evaluate_miniwob

    env_kw = {"episode_seconds": MINIWOB_EPISODE_SECONDS, **({"max_steps": max_steps} if max_steps else {})}
    try:
        out = evaluate_miniwob(actor, MINIWOB_TASKS, episodes_per_task, env_kw=env_kw, progress=progress)
    except Exception as e:  # noqa: BLE001 - an external benchmark failing must not fail the iteration
        return {"error": f"{type(e).__name__}: {e}"}
    out["note"] = "external test of transfer: not part of promotion, never trained on"
    return out


def miniwob_summary(metrics: dict):
    """The MiniWoB++ part of an evaluation in one value: its overall rate ({"episodes", "success",
    "ci95"}), or why there is none (a string), or None when it was not asked for."""
    part = metrics.get("miniwob")
    if not part:
        return None
    return part.get("overall") or part.get("skipped") or part.get("error")
