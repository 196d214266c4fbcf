"""One turn of the flywheel, top to bottom:

  0. a current model: the registry's, or (first run) the shipped default model when it was
     trained for this screen size, else a tiny Qwen2.5-VL with random weights;
  1. new on-policy data: the current model plays training-seed sandbox tasks, stored as episodes;
  2. score and route every unscored episode (recorded, reversible); export corrections;
  3. train from the current model: CT on the CT pool -> SFT on the SFT pool and the corrected
     steps -> DPO on supervisors' edits and rejections (over the model's own reply) -> PPO on
     the sandbox (and on the games pool, `games`, where one is given), each stage with a small,
     configurable budget;
  4. evaluate the candidate and the current model on the same fresh block of held-out seeds
     (`eval_episodes`, 200 by default), register the candidate with metrics and lineage, promote
     it only when the paired 95% interval of the difference lies above `min_gain` (a failed,
     worse or not clearly better one is kept as "rejected");
  5. announce a promoted model through the backend, when one is configured.

Progress goes to `progress(done, total, stage, detail)` (0..100 over the whole iteration; the
stage's name from STAGES and its live numbers: its count and the latest values of the metrics row
that moved it, like "step 3/100 · loss 2.314" or "update 1/3 · reward 0.42 · entropy 1.31 ·
success 33%"); metrics of every stage go to <data>/flywheel/metrics.jsonl with the iteration
number on each row.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

from agent import coords
from agent.grammar import format_normalized
from agent.storage.model_files import DEFAULT_MODEL_DIR
from agent.threads import choose_threads
from trainer.flywheel import FlywheelError
from trainer.flywheel.announce import announce, backend_target
from trainer.flywheel.config import CONFIG_KEY, FlywheelConfig, default_families  # noqa: F401  (re-exported)
from trainer.flywheel.evaluation import (
    MINIWOB_TASKS,
    evaluate_games,
    evaluate_model,
    miniwob_missing,
    reserve_eval_seeds,
)
from trainer.flywheel.registry import Registry
from trainer.flywheel.routing import (
    Router,
    RoutingConfig,
    correction_samples,
    export_corrections,
    load_or_skip,
    pool_samples,
)
from trainer.learn.dpo import DPOConfig, preference_pairs, train_dpo
from trainer.learn.metrics import MetricsLog, read_metrics
from trainer.learn.sft import load_for_training, save_checkpoint, train_sft
from trainer.recipe.default_model import RecipeConfig, build_default_model
from trainer.rollout.actors import VLMActor
from trainer.rollout.runner import play, trajectory_to_episode
from trainer.rollout.specs import EnvSpec, GameEnvSpec
from trainer.sandbox.env import env_kw_for
from trainer.sandbox.env_process import make_envs
from trainer.sandbox.games import registry as game_registry

ROLLOUT_SEED_BASE = 500_000  # on-policy data uses training seeds far from `sandbox generate`'s
# share of the iteration's progress bar per stage
STAGES = {"start": 4, "collect": 8, "route": 4, "ct": 8, "sft": 20, "dpo": 4, "ppo": 22, "eval": 30}
STAGE_TEXT = {  # what each stage is doing, for people (the CLI's bar, the Train page)
    "start": "preparing the model to start from", "collect": "playing on-policy episodes",
    "route": "scoring and routing new episodes", "ct": "continual training on the CT pool",
    "sft": "fine-tuning on the SFT pool", "dpo": "preference training on supervisors' edits and rejections",
    "ppo": "PPO on sandbox tasks", "eval": "evaluating both models on fresh held-out tasks",
}
SHIPPED_MODEL = DEFAULT_MODEL_DIR


# the live numbers a stage's detail shows, from its metrics rows: (key, label, format)
LIVE_NUMBERS = {
    "ct": (("loss", "loss", "{:.3f}"),), "sft": (("loss", "loss", "{:.3f}"),),
    "dpo": (("loss", "loss", "{:.3f}"), ("accuracy", "accuracy", "{:.0%}")),
    "ppo": (("reward", "reward", "{:.2f}"), ("entropy", "entropy", "{:.2f}"), ("success_rate", "success", "{:.0%}")),
}


def live_detail(unit: str, done: float, total: float, phase: str = "", values: dict | None = None) -> str:
    """'step 3/100 · loss 2.314': a stage's count and the numbers of its latest metrics row."""
    parts = [f"{unit} {int(done)}/{int(total)}"] if total and unit else []
    for key, label, fmt in LIVE_NUMBERS.get(phase, ()):
        v = (values or {}).get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label} {fmt.format(v)}")
    return " · ".join(parts)


class _Progress:
    def __init__(self, fn):
        self.fn, self.base = fn, 0

    def stage(self, name: str, done: float, total: float, unit: str = "", detail: str | None = None,
              share: float | None = None) -> None:
        """`share`: how far through the stage, when it is not done/total (PPO's critic warm-up)."""
        if self.fn:
            frac = share if share is not None else min(1.0, done / total) if total else 1.0
            detail = live_detail(unit, done, total) if detail is None else detail
            self.fn(int(self.base + STAGES[name] * frac), 100, name, detail)

    def finish(self, name: str) -> None:
        self.base += STAGES[name]
        if self.fn:
            self.fn(int(self.base), 100, name, "done")


class _StageLog:
    """A MetricsLog front: steps continue across iterations per phase, rows carry the iteration,
    and each row can report progress."""

    def __init__(self, log, iteration: int, on_row=None):
        self.log_, self.iteration, self.on_row = log, iteration, on_row
        self.offsets: dict[str, int] = {}
        if log.path.exists():
            for r in read_metrics(log.path):
                self.offsets[r["phase"]] = max(self.offsets.get(r["phase"], 0), int(r["step"]) + 1)
        self.start = dict(self.offsets)

    def log(self, step: int, phase: str, **values) -> dict:
        row = self.log_.log(self.start.get(phase, 0) + int(step), phase, iteration=self.iteration, **values)
        if self.on_row:
            self.on_row(int(step), phase, values)
        return row


def flywheel_dir(store) -> Path:
    d = Path(store.root) / "flywheel"
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---------------------------------------------------------------- steps


def shipped_model_fits(cfg: FlywheelConfig) -> tuple[bool, str]:
    """(usable, why): the shipped default model starts the flywheel when it exists and was
    trained for the flywheel's screen size (its grounding is in those pixels)."""
    meta_path = SHIPPED_MODEL / "tandem_training.json"
    if not (SHIPPED_MODEL / "config.json").exists() or not meta_path.exists():
        return False, f"the shipped default model is missing ({SHIPPED_MODEL})"
    try:
        rc = json.loads(meta_path.read_text(encoding="utf-8"))["report"]["config"]
        size = (int(rc["width"]), int(rc["height"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        return False, f"the shipped default model's training record is unreadable ({e})"
    if size != (cfg.width, cfg.height):
        return False, f"the shipped default model is for {size[0]}x{size[1]} screens, not {cfg.width}x{cfg.height}"
    return True, "the shipped default model"


def first_model(cfg: FlywheelConfig) -> str:
    """What the first iteration starts from, in words (the Train page says it before any run)."""
    if cfg.base == "default":
        fits, why = shipped_model_fits(cfg)
        return why if fits else f"a new model with random weights ({why})"
    return "a new model with random weights (base: scratch)"


def too_little_data(store, cfg: FlywheelConfig) -> str | None:
    """A sentence for people when the SFT data is too small to learn from, else None; an
    iteration still runs (the warning is advice). Counted before routing: the SFT pool, and at
    most every unscored episode on top (routing may send any of them there).

    The floor is one batch of episodes (cfg.sft.batch_size, 8 by default): the SFT stage draws
    sft_steps x batch samples (800 by default), so from fewer episodes than one batch every
    step's batch repeats the same few tasks and each of their steps is seen hundreds of times.
    The recipe behind the shipped model saw each of its demonstrations about sft_epochs (4)
    times, from hundreds of episodes per family: there the model learned rather than memorized."""
    if not cfg.sft.max_steps:
        return None
    pool = store.list_episodes(route="sft")
    unscored = store.list_episodes(route="unscored")
    n = len(pool) + len(unscored)
    if n >= cfg.sft.batch_size:
        return None
    steps = sum(int(e.meta.get("n_steps") or 0) for e in pool + unscored)
    head = (f"Only {n} SFT episode{'s' if n != 1 else ''}" if not unscored else
            f"At most {n} SFT episode{'s' if n != 1 else ''} ({len(pool)} in the SFT pool, {len(unscored)} not yet scored)")
    if n == 0:
        return ("No SFT episodes: the SFT stage has nothing to learn from; record or import more, or mark "
                "recordings' outcome in the Library.")
    seen = cfg.sft.max_steps * cfg.sft.batch_size / max(1, steps)
    return (f"{head}: the model will memorize {'it' if n == 1 else 'them'} rather than learn; record or import more "
            f"(the SFT stage would show each of {'its' if n == 1 else 'their'} {steps} step{'s' if steps != 1 else ''} "
            f"about {seen:.0f} times; at least {cfg.sft.batch_size} episodes, one batch, are needed).")


def bootstrap_model(store, cfg: FlywheelConfig, registry: Registry):
    """The first current model (v0000), measured later beside the first candidate; only when the
    registry has no model at all. The shipped default model when it fits (cfg.base "default"), else a tiny
    Qwen2.5-VL with random weights whose tokenizer learned the store's texts."""
    version = registry.next_version()
    out = flywheel_dir(store) / "models" / version
    fits, why = shipped_model_fits(cfg) if cfg.base == "default" else (False, "base: scratch")
    if fits:
        shutil.copytree(SHIPPED_MODEL, out, dirs_exist_ok=True)  # a copy: training never touches the shipped one
        lineage, note = {"parents": [], "copied_from": str(SHIPPED_MODEL)}, "the shipped default model"
    else:
        texts = []
        for e in store.list_episodes():
            ep = load_or_skip(store, e.id, {})  # one that does not load is named by the routing stage
            if ep is None:
                continue
            texts.append(ep.instruction)
            for s in ep.steps:
                try:
                    texts.append(format_normalized(s.thought, [s.action], coords.SMART_RESIZE, s.observation.width,
                                                   s.observation.height))
                except Exception:  # a step that cannot be written only misses the tokenizer corpus
                    pass
        build_default_model(out, RecipeConfig(width=cfg.width, height=cfg.height, seed=cfg.seed), texts)
        lineage = {"parents": [], "built_from": "trainer.recipe.default_model.build_default_model", "tokenizer_texts": len(texts)}
        note = f"base model (random weights): {why}"
    mv = registry.register(out, iteration=0, version=version, lineage=lineage, note=note)
    registry.make_first(mv.version, "first model: nothing to compare with")
    return registry.get(mv.version)


def collect_rollouts(store, model_dir, version: str, cfg: FlywheelConfig, iteration: int, *, progress=None,
                     n_envs: int = 8) -> list[str]:
    """The current model plays `cfg.rollouts` training-seed tasks (sampled, the one episode runner,
    batched over `n_envs` envs); they are stored unscored."""
    if cfg.rollouts <= 0:
        return []
    import torch

    actor = VLMActor.load(model_dir, inference_dtype=cfg.inference_dtype, temperature=cfg.rollout_temperature,
                          max_new_tokens=cfg.max_new_tokens)
    tickets = [(ROLLOUT_SEED_BASE + iteration * 1000 + k, cfg.families[k % len(cfg.families)]) for k in range(cfg.rollouts)]

    envs = make_envs(min(n_envs, len(tickets)), **env_kw_for(cfg.env_kw, model_dir))
    done = [0]

    def tick(_traj):
        done[0] += 1
        if progress:
            progress(done[0], cfg.rollouts, "episode")

    try:
        with torch.random.fork_rng():  # reproducible samples, the caller's RNG untouched
            torch.manual_seed(cfg.seed * 7919 + iteration)
            trajs = play(actor, tickets, envs=envs, greedy=False, progress=tick)
    finally:
        for env in envs:
            env.close()
    return [trajectory_to_episode(t, store, producer=version, policy_version=version).id for t in trajs]


def train_candidate(store, cfg: FlywheelConfig, parent_dir, out_dir, slog: _StageLog, prog: _Progress,
                    skipped: dict | None = None) -> list[dict]:
    """CT -> SFT -> DPO -> PPO from the parent checkpoint; saves the candidate; returns stage
    summaries. An episode that cannot be read is left out and named in `skipped`."""
    from trainer.learn.ppo import train_ppo  # lazy: torch: this module stays light

    model, processor = load_for_training(parent_dir)  # the GPU when there is one
    stages = []
    sft_ids = [e.id for e in store.list_episodes(route="sft")]
    ct_ids = [e.id for e in store.list_episodes(route="ct")]
    updates = cfg.ppo.updates
    ppo_rounds = cfg.ppo.value_pretrain_iters + updates  # value pretraining, then the updates

    def on_row(step, phase, values):  # each metrics row moves the bar and carries its numbers
        if phase in ("ct", "sft", "dpo"):
            total = {"ct": cfg.ct.max_steps, "sft": cfg.sft.max_steps, "dpo": cfg.dpo_steps}[phase]
            prog.stage(phase, step + 1, total, detail=live_detail("step", step + 1, total, phase, values))
        elif phase == "value_pretrain":
            nums = live_detail("", 0, 0, "ppo", values)  # the frozen policy's batch: reward, success
            prog.stage("ppo", 0, updates, share=(step + 1) / ppo_rounds,
                       detail="critic warm-up done" + (f" · {nums}" if nums else ""))
        elif phase == "ppo":
            prog.stage("ppo", step + 1, updates, share=(cfg.ppo.value_pretrain_iters + step + 1) / ppo_rounds,
                       detail=live_detail("update", step + 1, updates, "ppo", values))

    slog.on_row = on_row

    # -- CT: the lower-quality pool, lower learning rate
    ct = pool_samples(store, "ct", skipped) if (cfg.ct.max_steps and ct_ids) else []
    if ct:
        r = train_sft(model, processor, ct, cfg.ct, log=slog, phase="ct", progress=False)
        stages.append({k: r[k] for k in ("phase", "steps", "samples", "first_loss", "last_loss", "seconds")})
    else:
        stages.append({"phase": "ct", "skipped": "no CT data" if cfg.ct.max_steps else "ct_steps is 0"})
    prog.finish("ct")

    # -- SFT: the high-quality pool plus every corrected step
    sft = (pool_samples(store, "sft", skipped) if sft_ids else []) + correction_samples(store, ct_ids, skipped)
    if sft and cfg.sft.max_steps:
        r = train_sft(model, processor, sft, cfg.sft, log=slog, phase="sft", progress=False)
        stages.append({k: r[k] for k in ("phase", "steps", "samples", "first_loss", "last_loss", "seconds")})
    else:
        stages.append({"phase": "sft", "skipped": "no SFT data" if cfg.sft.max_steps else "sft_steps is 0"})
    prog.finish("sft")

    # -- DPO: where a supervisor edited a step or rejected a proposal, what was done is preferred
    # over the model's own reply
    pairs = preference_pairs(store, sft_ids + ct_ids, skipped) if cfg.dpo_steps else []
    if pairs:
        r = train_dpo(model, processor, pairs, DPOConfig(beta=cfg.dpo_beta, lr=cfg.dpo_lr, batch_size=min(cfg.sft.batch_size, 4),
                                                         max_steps=cfg.dpo_steps, seed=cfg.seed, nll=cfg.dpo_nll),
                      log=slog, progress=False)
        stages.append({k: r[k] for k in ("phase", "steps", "pairs", "first_loss", "last_loss", "last_accuracy", "seconds")})
    else:
        stages.append({"phase": "dpo", "skipped": "no corrections or rejections" if cfg.dpo_steps else "dpo_steps is 0"})
    prog.finish("dpo")

    # -- PPO on the sandbox's verifiable tasks
    if updates:
        pc = replace(cfg.ppo, seed=cfg.seed + slog.iteration)
        work = Path(out_dir).parent / (Path(out_dir).name + "-ppo")
        t0 = time.perf_counter()

        res = train_ppo(model, processor, pc, model_dir=parent_dir, work_dir=work, env=EnvSpec(**env_kw_for(cfg.env_kw, parent_dir)),
                        families=cfg.families, log=slog, progress=False)
        last = res["history"][-1] if res["history"] else {}
        stages.append({"phase": "ppo", "updates": res["updates"], "seconds": round(time.perf_counter() - t0, 1),
                       "engine": pc.engine if pc.n_workers else "in-process",
                       **{k: last.get(k) for k in ("reward", "success_rate", "entropy", "approx_kl")}})
    else:
        stages.append({"phase": "ppo", "skipped": "ppo_updates is 0"})
    if cfg.games and updates:  # then the games pool, continuing from where the sandbox's PPO left the model
        stages.append(ppo_on_games(model, processor, cfg, parent_dir, out_dir, slog))
    prog.finish("ppo")
    save_checkpoint(model, processor, out_dir, {"flywheel": stages})
    return stages


class _Phased:
    """A _StageLog front whose rows go under `prefix` + phase: the games' PPO logs "games_ppo" rows,
    apart from the sandbox's "ppo" ones of the same iteration."""

    def __init__(self, slog: _StageLog, prefix: str):
        self.slog, self.prefix = slog, prefix

    def log(self, step: int, phase: str, **values) -> dict:
        return self.slog.log(step, self.prefix + phase, **values)


def ppo_on_games(model, processor, cfg: FlywheelConfig, parent_dir, out_dir, slog: _StageLog) -> dict:
    """PPO on the games pool (cfg.games): GameEnvs in the rollouts, each step rewarded by the score it
    gained over the game's reference mean (trainer.rollout.specs.GameEnvSpec), cfg.ppo's settings;
    its metrics rows are "games_value_pretrain" / "games_ppo". Returns the stage's summary."""
    from trainer.learn.ppo import train_ppo  # lazy: torch

    # the sandbox's shaping terms have nothing to read in a game (its reward is already the score gained)
    pc = replace(cfg.ppo, seed=cfg.seed + slog.iteration, progress_reward=0.0, click_reward=0.0, no_effect_penalty=0.0)
    env = GameEnvSpec(games=tuple(cfg.games), max_steps=cfg.max_steps,
                      observation=env_kw_for({}, parent_dir)["observation"])
    t0 = time.perf_counter()
    res = train_ppo(model, processor, pc, model_dir=parent_dir, work_dir=Path(out_dir).parent / (Path(out_dir).name + "-ppo-games"),
                    env=env, families=[game_registry.PREFIX + g for g in env.games], log=_Phased(slog, "games_"),
                    progress=False)
    last = res["history"][-1] if res["history"] else {}
    return {"phase": "ppo_games", "games": list(env.games), "updates": res["updates"],
            "seconds": round(time.perf_counter() - t0, 1), "engine": pc.engine if pc.n_workers else "in-process",
            **{k: last.get(k) for k in ("reward", "entropy", "think_tokens", "approx_kl")}}


def run_iteration(store, cfg: FlywheelConfig | None = None, *, progress=None, orm=None, announce_target=None) -> dict:
    """One iteration; returns a report (also written to <data>/flywheel/iteration-N.json)."""
    import torch

    cfg = cfg or FlywheelConfig.load(store)
    threads = choose_threads(cfg.threads).apply()
    print(threads.line(), file=sys.stderr)
    torch.manual_seed(cfg.seed)
    registry, router = Registry(store), Router(store, RoutingConfig.from_dict(cfg.routing), orm=orm)
    prog = _Progress(progress)
    fw = flywheel_dir(store)
    log = MetricsLog(fw, tensorboard=False)
    iteration = max([v.iteration for v in registry.versions()] + [0]) + 1
    slog = _StageLog(log, iteration)
    t0 = time.perf_counter()
    report: dict = {"iteration": iteration, "started_at": time.time(), "config": asdict(cfg), "torch_threads": threads.threads}

    # -- 0. the model to start from
    current = registry.current()
    prog.stage("start", 0, 1)
    if current is None:
        current = bootstrap_model(store, cfg, registry)
        report["bootstrapped"] = current.version
        # shipped_default: the apps already run this model as "Default small model" (nothing to switch to)
        report["announce_first"] = _announce(current.version, {"path": current.path, "iteration": 0, "note": current.note,
                                                                "shipped_default": "copied_from" in current.lineage},
                                             store, announce_target)
    report["parent"] = current.version
    prog.finish("start")

    # -- 1. new on-policy data from the current model
    report["rollouts"] = collect_rollouts(store, current.path, current.version, cfg, iteration,
                                          progress=lambda d, n, unit="": prog.stage("collect", d, n, unit))
    prog.finish("collect")

    # -- 2. score and route what is new; corrections out as JSONL
    # an episode that cannot be read is left out and named here, never stops the iteration
    report["skipped"] = skipped = {}
    report["routed"] = router.route(iteration, progress=lambda d, n: prog.stage("route", d, n, "episode"),
                                    skipped=skipped)
    report["pools"] = router.pools()
    report["corrections"] = export_corrections(store, fw / f"iteration-{iteration}", skipped=skipped)
    prog.finish("route")

    # -- 3. train a candidate, 4. evaluate, register, decide
    version = registry.next_version()
    out_dir = fw / "models" / version
    lineage = {"parents": [current.version], "iteration": iteration,
               "pools": {"sft": [e.id for e in store.list_episodes(route="sft")],
                         "ct": [e.id for e in store.list_episodes(route="ct")]},
               "new_rollouts": report["rollouts"], "routed": report["routed"]}
    metrics, current_metrics, note = {}, None, ""
    try:
        lineage["stages"] = train_candidate(store, cfg, current.path, out_dir, slog, prog, skipped)
        # both models on one fresh block of held-out seeds: paired, and never used to choose before
        per_family = cfg.eval_seeds
        seed_start = reserve_eval_seeds(store, per_family)
        n = len(cfg.families) * per_family
        # the candidate also plays MiniWoB++ where it can run: counted in the stage's episodes
        browser = cfg.miniwob_episodes > 0 and not miniwob_missing()
        total = 2 * n + (len(MINIWOB_TASKS) * cfg.miniwob_episodes if browser else 0)
        kw = dict(env_kw=cfg.env_kw, max_new_tokens=cfg.max_new_tokens, seed_start=seed_start,
                  inference_dtype=cfg.inference_dtype)
        current_metrics = {**evaluate_model(current.path, cfg.families, per_family,
                                            progress=lambda d, _n: prog.stage("eval", d, total, "episode"), **kw),
                           "measured_at_iteration": iteration}
        registry.update(current.version, metrics=current_metrics)  # its latest, unselected measurement
        metrics = evaluate_model(out_dir, cfg.families, per_family, miniwob=cfg.miniwob_episodes > 0,
                                 miniwob_episodes=cfg.miniwob_episodes,
                                 progress=lambda d, _n: prog.stage("eval", n + min(d, total - n), total, "episode"),
                                 **kw)
        metrics["measured_at_iteration"] = iteration
        if cfg.games:  # the games pool, scored apart: normalized score, not success
            metrics["games"] = evaluate_games(out_dir, cfg.games, cfg.game_episodes, max_new_tokens=cfg.max_new_tokens,
                                              max_steps=cfg.max_steps, inference_dtype=cfg.inference_dtype)
    except Exception as e:  # a failed iteration is recorded and leaves the current model in place
        note = f"failed: {type(e).__name__}: {e}"
        report["error"] = traceback.format_exc()
    prog.finish("eval")
    registry.register(out_dir, parent=current.version, iteration=iteration, metrics=metrics, lineage=lineage,
                      version=version, note=note)
    promoted, why = registry.decide(version, min_gain=cfg.min_gain, current_metrics=current_metrics)
    now = registry.current()
    report.update(candidate=version, promoted=promoted, decision=why, current=now.version if now else None,
                  metrics=registry.get(version).metrics, parent_metrics=registry.get(current.version).metrics)
    games_score = (metrics.get("games") or {}).get("overall")
    slog.log(0, "flywheel", promoted=float(promoted), candidate_success=metrics.get("mean_success", float("nan")),
             current_success=now.mean_success if now else float("nan"),
             **({"candidate_games_score": games_score} if games_score is not None else {}),
             **{f"pool_{k}": v for k, v in report["pools"].items()})

    # -- 5. tell the apps
    if promoted:
        info = {"path": str(out_dir), "iteration": iteration, "parent": current.version,
                "mean_success": metrics.get("mean_success"),
                "families": {k: v["success"] for k, v in metrics.get("families", {}).items()}}
        report["announce"] = _announce(version, info, store, announce_target)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    log.close()
    (fw / f"iteration-{iteration}.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    return report


def skipped_last(store) -> tuple[int | None, dict]:
    """(iteration, {episode id: why}) of the episodes the latest iteration's report names as
    skipped (they could not be read); (None, {}) before the first report."""
    reports = {int(p.stem.split("-", 1)[1]): p for p in flywheel_dir(store).glob("iteration-*.json")
               if p.stem.split("-", 1)[1].isdigit()}
    if not reports:
        return None, {}
    n = max(reports)
    try:
        return n, json.loads(reports[n].read_text(encoding="utf-8")).get("skipped") or {}
    except (OSError, ValueError):
        return n, {}


def _announce(version: str, info: dict, store, target) -> str:
    """Tell the apps through the backend; a failure is reported, never fatal (announce again later)."""
    info = {**info, "path": str(Path(info["path"]).resolve())}  # the backend may run from another folder
    try:
        return announce(version, info, target=target or backend_target(store))
    except FlywheelError as e:
        return f"announcement failed: {e}"
