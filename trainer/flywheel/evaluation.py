"""Held-out evaluation of a checkpoint: greedy episodes on a block of the sandbox's held-out seeds,
per family: success, the verifier's progress, the share of outputs that parse, and every episode's
outcome, so two models evaluated on the same block compare pair by pair. The flywheel draws a
fresh block for every iteration (`reserve_eval_seeds`): a block that chose a model is never used
to choose again, so the numbers it reports are not inflated by repeated selection.

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
import math

from trainer.rollout import games_eval
from trainer.rollout.actors import VLMActor
from trainer.rollout.miniwob_eval import DEFAULT_TASKS as MINIWOB_TASKS
from trainer.rollout.miniwob_eval import evaluate_miniwob
from trainer.rollout.runner import evaluate
from trainer.sandbox.env import env_kw_for, observation_for
from trainer.sandbox.miniwob_env import available
from trainer.sandbox.task import HELDOUT_START

# MiniWoB's own clock is 10 s an episode in most tasks; a model on a CPU thinks for seconds a step
MINIWOB_EPISODE_SECONDS = 120.0
MINIWOB_EPISODES_PER_TASK = 5  # a transfer check, not a decision: a browser episode costs seconds
# the flywheel's evaluation blocks start here, away from `sandbox eval` and the recipe (HELDOUT_START + 0..)
FLYWHEEL_EVAL_OFFSET = 100_000
NEXT_SEEDS_KEY = "flywheel.eval_seed_next"


def eval_signature(families, seeds_per_family: int, env_kw: dict, max_new_tokens: int, seed_start: int | None = None,
                   inference_dtype: str = "fp32") -> str:
    """Two evaluations compare only when this matches (same tasks, seeds, screen, budget, and
    inference dtype: fp32 leaves the signatures of evaluations before the option as they were)."""
    key = json.dumps({"families": list(families), "seeds": seeds_per_family, "env": env_kw, "tokens": max_new_tokens,
                      **({"seed_start": seed_start} if seed_start is not None else {}),
                      **({"dtype": inference_dtype} if inference_dtype != "fp32" else {})}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def seeds_per_family(episodes: int, families) -> int:
    """Held-out seeds per family so that all families together play at least `episodes`."""
    return max(1, math.ceil(int(episodes) / max(1, len(families))))


def reserve_eval_seeds(store, per_family: int) -> int:
    """The first seed of a block of `per_family` held-out seeds no earlier evaluation of this
    store used; the block is taken before anything is played, so a crash never reuses it."""
    with store.transaction():
        offset = int(store.get_setting(NEXT_SEEDS_KEY) or FLYWHEEL_EVAL_OFFSET)
        store.set_setting(NEXT_SEEDS_KEY, offset + int(per_family))
    return HELDOUT_START + offset


def evaluate_model(model_dir, families: list[str], seeds_per_family: int, *, env_kw: dict, max_new_tokens: int = 48,
                   progress=None, miniwob: bool = False, seed_start: int | None = None,
                   miniwob_episodes: int = MINIWOB_EPISODES_PER_TASK, inference_dtype: str = "fp32") -> dict:
    """Metrics of the checkpoint in model_dir, its weights in `inference_dtype` (fp32 or bf16), on
    held-out seeds (from seed_start, default the split's first). progress(done, total)."""
    actor = VLMActor.load(model_dir, inference_dtype=inference_dtype, max_new_tokens=max_new_tokens)
    return evaluate_actor(actor, families, seeds_per_family,
                          env_kw=env_kw_for(env_kw, model_dir), max_new_tokens=max_new_tokens, progress=progress, miniwob=miniwob,
                          seed_start=seed_start, miniwob_episodes=miniwob_episodes)


def evaluate_actor(actor, families: list[str], seeds_per_family: int, *, env_kw: dict, max_new_tokens: int = 48,
                   progress=None, miniwob: bool = False, n_envs: int = 16, seed_start: int | None = None,
                   miniwob_episodes: int = MINIWOB_EPISODES_PER_TASK) -> dict:
    """trainer.rollout.runner.evaluate (batched, the one runner), plus the signature that says which
    evaluations compare. progress(done, total)."""
    missing = miniwob_missing() if miniwob else "not asked for"
    total, done = len(families) * seeds_per_family, [0]
    total += 0 if missing else len(MINIWOB_TASKS) * miniwob_episodes

    def tick(*_):
        done[0] += 1
        progress(done[0], total)

    out = evaluate(actor, families, seeds_per_family, env_kw=env_kw, n_envs=n_envs, seed_start=seed_start,
                   progress=tick if progress else None)
    out["eval_signature"] = eval_signature(families, seeds_per_family, env_kw, max_new_tokens, seed_start,
                                           getattr(actor, "inference_dtype", "fp32"))
    if seed_start is not None:
        out.update(seed_start=seed_start, seeds_per_family=seeds_per_family)
    if miniwob:
        out["miniwob"] = {"skipped": f"MiniWoB++ cannot run here: {missing}"} if missing else evaluate_on_miniwob(
            actor, miniwob_episodes, max_steps=env_kw.get("max_steps"), progress=tick if progress else None)
    return out


def evaluate_games(model_dir, games: list[str], episodes: int, *, max_new_tokens: int = 48, max_steps: int | None = None,
                   inference_dtype: str = "fp32", n_envs: int = 4, progress=None) -> dict:
    """The checkpoint's greedy episodes on the browser games (the first `episodes` held-out seeds of
    each, the same every time, so iterations compare): per game the raw and normalized score (the
    reference player's mean = 100) with t 95% intervals, and their mean over games
    (trainer.rollout.games_eval.summarize). Reported apart from the families' success: never part
    of a promotion decision. A run that fails says so ({"error": ...})."""
    env_kw = {"observation": observation_for(model_dir), **({"max_steps": max_steps} if max_steps else {})}
    try:
        actor = VLMActor.load(model_dir, inference_dtype=inference_dtype, max_new_tokens=max_new_tokens)
        trajs = games_eval.play(actor, games, episodes, split="heldout", envs=n_envs, env_kw=env_kw,
                                progress=(lambda _t: progress()) if progress else None)
        out = games_eval.summarize(trajs, games)
    except Exception as e:  # a browser failing must not fail the iteration
        return {"error": f"{type(e).__name__}: {e}"}
    out["note"] = "normalized score (reference player = 100): reported apart, not part of promotion"
    return out


def miniwob_missing() -> str | None:
    """None when MiniWoB++ can run here, else what is missing (without importing it when absent)."""
    return available()


def evaluate_on_miniwob(actor, episodes_per_task: int, *, max_steps: int | None = None, progress=None) -> dict:
    """The actor's greedy episodes on MINIWOB_TASKS (seeds 0.. of each), with MiniWoB's clock at
    MINIWOB_EPISODE_SECONDS: per task ("families") and overall success with Wilson intervals."""
    env_kw = {"episode_seconds": MINIWOB_EPISODE_SECONDS, **({"max_steps": max_steps} if max_steps else {})}
    try:
        out = evaluate_miniwob(actor, MINIWOB_TASKS, episodes_per_task, env_kw=env_kw, progress=progress)
    except Exception as e:  # an external benchmark failing must not fail the iteration
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


def games_summary(metrics: dict):
    """The games part of an evaluation in one value: {"overall": mean normalized score, "ci95",
    "games": {name: normalized}}, or its error (a string), or None when there was none."""
    part = metrics.get("games")
    if not part:
        return None
    if "error" in part:
        return part["error"]
    return {"overall": part.get("overall"), "ci95": part.get("ci95"),
            "games": {g: r.get("normalized") for g, r in part.get("games", {}).items()}}
