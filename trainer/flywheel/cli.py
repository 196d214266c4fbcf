"""`python main.py flywheel run | status | merge | undo | plot`: the data flywheel headless.

    python main.py sandbox generate --episodes 120 --data D       # seed the store with expert demos
    python main.py flywheel run --iterations 3 --data D           # score, route, CT -> SFT -> PPO, eval, promote
    python main.py flywheel status --data D                       # pools, versions, current
    python main.py flywheel merge --models v0002 v0003 --alphas 0.5 0.5 --data D
    python main.py flywheel undo --iteration 2 --data D           # put iteration 2's routing back
"""
from __future__ import annotations

import json
import sys

from agent.cli_common import fail, open_store
from agent.storage.model_files import DEFAULT_MODEL_DIR, model_screen
from trainer.config_flags import ConfigError, add_flags, describe, overrides
from trainer.flywheel import FlywheelError
from trainer.flywheel.announce import backend_target
from trainer.flywheel.config import FlywheelConfig
from trainer.flywheel.evaluation import evaluate_model, games_summary, miniwob_summary, reserve_eval_seeds
from trainer.flywheel.iteration import flywheel_dir
from trainer.flywheel.merge import check_alphas, merge_models
from trainer.flywheel.plots import plot_flywheel, summary
from trainer.flywheel.registry import Registry, eval_summary, paired_comparison
from trainer.flywheel.routing import Router
from trainer.flywheel.scoring import OutcomeRewardModel
from trainer.flywheel.simulated import SIMULATED_SEEDS, simulate


def register(sub, common) -> None:
    p = sub.add_parser("flywheel", help="the data flywheel: score, route, retrain, evaluate, promote",
                       description="UI-TARS-2's data flywheel on this machine (see trainer/flywheel).")
    fs = p.add_subparsers(dest="flywheel_command", metavar="SUBCOMMAND", required=True)

    r = fs.add_parser("run", parents=[common], help="run flywheel iterations")
    r.add_argument("--iterations", type=int, default=1)
    # the settings' flags come from FlywheelConfig's fields (trainer.config_flags); one left out keeps the
    # store's saved value

    add_flags(r, FlywheelConfig, keep=True)
    r.add_argument("--batch", type=int, help="samples per CT and SFT step (both --ct-batch and --sft-batch)")
    r.add_argument("--save-config", action="store_true", help="save these settings as the store's flywheel config")
    r.add_argument("--orm-model", metavar="DIR", help="outcome reward model: a local checkpoint directory")
    r.add_argument("--orm-url", help="outcome reward model: an OpenAI-compatible base URL (with --orm-name)")
    r.add_argument("--orm-name", help="the model name at --orm-url")
    r.add_argument("--backend-url", help="announce promoted models to this backend (ws://...)")
    r.add_argument("--backend-token", help="an admin token of that backend")
    r.add_argument("--backend-data", help="or record the announcement in this backend data directory")
    r.add_argument("--progress-json", action="store_true", help="progress as JSON lines on stdout (for the app)")
    r.set_defaults(func=cmd_run)

    s = fs.add_parser("status", parents=[common], help="pools, model versions and the current model")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_status)

    m = fs.add_parser("merge", parents=[common], help="merge models by parameter interpolation and evaluate")
    m.add_argument("--models", nargs="+", required=True, help="registry versions or checkpoint directories")
    m.add_argument("--alphas", nargs="+", required=True, help="one weight per model, >= 0, summing to 1")
    m.add_argument("--out", help="output directory (default: <data>/flywheel/models/<new version>)")
    m.add_argument("--no-eval", action="store_true", help="skip evaluating the merge and its parents")
    m.add_argument("--eval-episodes", type=int, help="held-out episodes per model (default: the flywheel config's)")
    m.set_defaults(func=cmd_merge)

    u = fs.add_parser("undo", parents=[common], help="undo one iteration's routing decisions")
    u.add_argument("--iteration", type=int, required=True)
    u.set_defaults(func=cmd_undo)

    h = fs.add_parser("simulate-humans", parents=[common],
                      help="add simulated human recordings and supervised runs (sandbox expert, relabelled)")
    h.add_argument("--recordings", type=int, default=6)
    h.add_argument("--supervised", type=int, default=2)
    h.add_argument("--families", help="comma-separated sandbox families")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--start", type=int, default=0, help="offset of the first task seed (default 0): another "
                                                         "offset gives other tasks, fresh data for the next iteration")
    h.add_argument("--width", type=int, help="screen width (default: the default model's training size)")
    h.add_argument("--height", type=int, help="screen height (default: the default model's)")
    h.set_defaults(func=cmd_simulate)

    pl = fs.add_parser("plot", parents=[common], help="PNG of held-out success by iteration and pool growth")
    pl.add_argument("--out", help="PNG path (default: <data>/flywheel/flywheel.png)")
    pl.set_defaults(func=cmd_plot)


def _orm(args):
    if args.orm_model:
        return OutcomeRewardModel.local(args.orm_model)
    if args.orm_url:
        if not args.orm_name:
            raise ValueError("--orm-url needs --orm-name")
        return OutcomeRewardModel.endpoint(args.orm_url, args.orm_name)
    return None


def cmd_run(args) -> int:
    from tqdm import tqdm

    from trainer.flywheel.iteration import (  # lazy: the name FlywheelConfig is imported differently elsewhere in the module
        CONFIG_KEY,
        STAGE_TEXT,
        FlywheelConfig,
        flywheel_dir,
        run_iteration,
        too_little_data,
    )

    if args.iterations < 1:
        return fail(f"--iterations must be at least 1, got {args.iterations}")
    over = overrides(FlywheelConfig, args)
    if args.batch is not None:
        over.setdefault("ct.batch_size", args.batch)
        over.setdefault("sft.batch_size", args.batch)
    store = open_store(args)
    try:
        cfg = FlywheelConfig.load(store, **over)
        orm = _orm(args)
    except ConfigError as e:
        store.close()
        return fail(describe(e, FlywheelConfig))
    except (FlywheelError, ValueError) as e:
        store.close()
        return fail(str(e))
    if args.save_config:
        from dataclasses import asdict

        store.set_setting(CONFIG_KEY, asdict(cfg))
    target = backend_target(store, args.backend_url, args.backend_token, args.backend_data)
    rc = 0
    try:
        warning = too_little_data(store, cfg)
        if warning:  # advice, not a stop (the Train page says it before its button)
            print(f"warning: {warning}", file=sys.stderr)
        for k in range(args.iterations):
            if args.progress_json:
                def progress(done, total, stage, detail="", k=k):
                    print(json.dumps({"iteration": k + 1, "of": args.iterations, "done": done, "total": total,
                                      "stage": stage, "text": STAGE_TEXT.get(stage, stage), "detail": detail,
                                      "stage_index": list(STAGE_TEXT).index(stage) + 1 if stage in STAGE_TEXT else None,
                                      "stages": len(STAGE_TEXT)}), flush=True)
                rep = run_iteration(store, cfg, progress=progress, orm=orm, announce_target=target)
            else:
                bar = tqdm(total=100, desc=f"iteration {k + 1}/{args.iterations}", unit="%", file=sys.stderr)

                def progress(done, total, stage, detail="", bar=bar):
                    bar.set_postfix_str(f"{STAGE_TEXT.get(stage, stage)} {detail}".strip())
                    bar.update(done - bar.n)
                try:
                    rep = run_iteration(store, cfg, progress=progress, orm=orm, announce_target=target)
                finally:
                    bar.close()
            m = rep.get("metrics") or {}
            line = {"iteration": rep["iteration"], "candidate": rep["candidate"], "promoted": rep["promoted"],
                    "current": rep["current"], "candidate_success": m.get("mean_success"),
                    "parent_success": rep["parent_metrics"].get("mean_success"),
                    "comparison": m.get("comparison"),
                    "routed": rep["routed"], "skipped": rep.get("skipped") or {},
                    "pools": rep["pools"], "seconds": rep["seconds"], "decision": rep["decision"],
                    "announce": rep.get("announce"), "candidate_miniwob": miniwob_summary(m),
                    **({"candidate_games": games_summary(m)} if "games" in m else {})}
            print(json.dumps({"result": line} if args.progress_json else line, default=str), flush=True)
            if rep.get("error"):
                print(rep["error"], file=sys.stderr)
                rc = 1
        png = plot_flywheel(store, flywheel_dir(store) / "flywheel.png")
        if not args.progress_json:
            print(f"plot: {png}")
    finally:
        store.close()
    return rc


def cmd_status(args) -> int:
    from trainer.flywheel.iteration import (  # lazy: the name FlywheelConfig is imported differently elsewhere in the module
        FlywheelConfig,
        first_model,
        skipped_last,
        too_little_data,
    )

    store = open_store(args)
    try:
        s = summary(store)
        try:
            cfg = FlywheelConfig.load(store)
            first, warning = first_model(cfg), too_little_data(store, cfg)
        except (FlywheelError, ValueError) as e:  # a config_flags.ConfigError names the setting
            first, warning = f"unknown: {e}", None
        # the last routing's decisions, each with the rule that decided it
        last = s["growth"][-1]["iteration"] if s["growth"] else None
        routing = [{"episode_id": r["episode_id"], "instruction": store.instruction_of(r["episode_id"]),
                    "route": r["route"], "why": r["reasons"]}
                   for r in (Router(store).decisions(last) if last is not None else [])]
        skipped_in, skipped = skipped_last(store)  # episodes the last iteration could not read
    finally:
        store.close()
    if args.json:
        print(json.dumps({"pools": s["pools"], "current": s["current"], "growth": s["growth"],
                          "versions": [version_record(v) for v in s["versions"]], "first_model": first,
                          "store": str(store.root), "routing": {"iteration": last, "decisions": routing},
                          "skipped": {"iteration": skipped_in, "episodes": skipped}, "warning": warning}, default=str))
        return 0
    print("pools: " + ", ".join(f"{k} {v}" for k, v in s["pools"].items()))
    for g in s["growth"]:
        print(f"  iteration {g['iteration']}: +{g['sft']} sft, +{g['ct']} ct, +{g['rejected']} rejected")
    if routing:
        print(f"routing of iteration {last}:")
        for r in routing:
            print(f"  {r['route']:<8} {(r['instruction'] or '?')[:40]:<40}  {r['why'][0] if r['why'] else ''}")
    for eid, why in skipped.items():
        print(f"  skipped by iteration {skipped_in}: episode {eid}: {why}")
    print(f"current model: {s['current'] or 'none yet; the first iteration starts from ' + first}")
    if warning:
        print(f"warning: {warning}")
    print(f"{'version':<8} {'it':>3} {'status':<9} {'parent':<7} {'held-out success':<26} decision")
    for v in s["versions"]:
        ev = eval_summary(v.metrics)
        rate = f"{ev['success']:.2f} [{ev['ci95'][0]:.2f}, {ev['ci95'][1]:.2f}] n={ev['episodes']}" if ev else "-"
        print(f"{v.version:<8} {v.iteration:>3} {v.status:<9} {v.parent or '-':<7} {rate:<26} {v.decision or v.note}")
    return 0


def version_record(v) -> dict:
    """One registry version for `flywheel status --json`: its id, evaluation in brief, whether it
    was promoted and why, and the full row (metrics with every outcome, lineage)."""
    return {"id": v.version, "eval": eval_summary(v.metrics), "promoted": v.status in ("current", "retired"),
            "decision": v.decision or v.note, "comparison": v.metrics.get("comparison"), **v.__dict__}


def cmd_merge(args) -> int:
    from pathlib import Path

    from trainer.flywheel.iteration import (  # lazy: the name FlywheelConfig is imported differently elsewhere in the module
        FlywheelConfig,
        flywheel_dir,
    )

    store = open_store(args)
    try:
        reg = Registry(store)
        check_alphas(args.alphas, len(args.models))
        parents, dirs = [], []
        for m in args.models:
            if Path(m).is_dir():
                parents.append(None)
                dirs.append(m)
            else:
                mv = reg.get(m)
                parents.append(mv.version)
                dirs.append(mv.path)
        version = reg.next_version()
        out = Path(args.out) if args.out else flywheel_dir(store) / "models" / version
        merge_models(dirs, args.alphas, out)
        result = {"out": str(out), "alphas": [float(a) for a in args.alphas], "models": args.models}
        metrics = {}
        if not args.no_eval:
            cfg = FlywheelConfig.load(store, eval_episodes=args.eval_episodes)
            start = reserve_eval_seeds(store, cfg.eval_seeds)  # the merge and its parents on one fresh block
            kw = dict(env_kw=cfg.env_kw, max_new_tokens=cfg.max_new_tokens, seed_start=start,
                      inference_dtype=cfg.inference_dtype)
            metrics = evaluate_model(out, cfg.families, cfg.eval_seeds, **kw)
            result["merged"] = {**eval_summary(metrics), "families": {k: v["success"] for k, v in metrics["families"].items()}}
            result["parents"] = {}
            for name, d in zip(args.models, dirs, strict=True):
                pm = evaluate_model(d, cfg.families, cfg.eval_seeds, **kw)
                result["parents"][name] = {**eval_summary(pm), "families": {k: v["success"] for k, v in pm["families"].items()},
                                           "merged_minus_parent": paired_comparison(pm, metrics)}
        known = [p for p in parents if p]
        mv = reg.register(out, parent=known[0] if known else None, version=version if not args.out else None,
                          iteration=max([reg.get(p).iteration for p in known] + [0]), metrics=metrics,
                          lineage={"parents": args.models, "merge": {"alphas": [float(a) for a in args.alphas]}},
                          note="merge (not promoted automatically)")
        result["version"] = mv.version
    except (FlywheelError, ValueError) as e:  # ValueError: a config_flags.ConfigError names the setting
        return fail(str(e))
    finally:
        store.close()
    print(json.dumps(result, indent=2))
    return 0


def cmd_undo(args) -> int:
    store = open_store(args)
    try:
        n = Router(store).undo(args.iteration)
    finally:
        store.close()
    print(f"undid {n} routing decision(s) of iteration {args.iteration}")
    return 0 if n else 1


def cmd_simulate(args) -> int:
    fams = [f.strip() for f in args.families.split(",") if f.strip()] if args.families else None
    store = open_store(args)
    try:
        screen = model_screen(DEFAULT_MODEL_DIR)  # the shipped model's, pixel-exact for it
        ids = simulate(store, recordings=args.recordings, supervised=args.supervised, families=fams, seed=args.seed,
                       width=args.width or screen.get("width", 320), height=args.height or screen.get("height", 240),
                       seed_start=SIMULATED_SEEDS + args.start)
    finally:
        store.close()
    print(f"stored {len(ids['recording'])} simulated recordings and {len(ids['supervised'])} simulated supervised runs")
    return 0


def cmd_plot(args) -> int:
    store = open_store(args)
    try:
        png = plot_flywheel(store, args.out or flywheel_dir(store) / "flywheel.png")
    finally:
        store.close()
    print(png)
    return 0
