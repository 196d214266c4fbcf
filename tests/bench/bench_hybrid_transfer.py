"""Does training on GUI + tools transfer? (issue 43, item 3; the UI-TARS-2 report's "half the data each").

From one SFT checkpoint (the shipped default model's SFT stage, copied, never changed) two continued-SFT
runs of the SAME steps, batch and learning rate:
  A: GUI-only expert demonstrations of the 16 GUI families (the recipe's mix: demos with slips, plus
     single-step grounding samples);
  B: the same number of samples, half of them A's first half, half hybrid-family demonstrations played
     with the terminal and file tools on (trainer.sandbox.families_hybrid).
Then, greedy, on the same held-out seeds: (a) A vs B on the 16 GUI families (Wilson 95% intervals and
the paired B - A, trainer.stats.paired_difference); (b) B on the 6 hybrid families with the tools on
vs off (success and mean steps; the paired on - off over the families playable both ways).

    OMP_NUM_THREADS=1 nice -n 5 python tests/bench/bench_hybrid_transfer.py train --arm A --work runs/hybrid
    OMP_NUM_THREADS=1 nice -n 5 python tests/bench/bench_hybrid_transfer.py train --arm B --work runs/hybrid
    OMP_NUM_THREADS=1 nice -n 5 python tests/bench/bench_hybrid_transfer.py eval --work runs/hybrid --with-base --with-a-hybrid
    python tests/bench/bench_hybrid_transfer.py report --work runs/hybrid

Each stage writes into --work (A/, B/, eval_*.json) and skips what is already there; `report` prints the
tables. A benchmark, not a test: it never runs in the test suite.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

BASE = "/work/runs/m3/model-work/sft"  # the shipped default model's SFT stage (element-list pointer)
WIDTH, HEIGHT, OBSERVATION = 336, 252, "elements"  # the screen it was trained on
SLIP = 0.3  # the recipe's demo_slip
GUI_DEMO_SEEDS, GROUNDING_SEEDS, HYBRID_DEMO_SEEDS = 200_000, 520_000, 300_000  # training seeds the base never saw


def _samples(n: int, hybrid_share: float, seed: int) -> tuple[list, dict]:
    """n SFT samples: round(n * hybrid_share) from hybrid demos (tools on), the rest the first of a fixed
    shuffle of GUI demos + grounding samples (so B's GUI half is A's first half)."""
    from trainer.recipe.default_model import demonstrations
    from trainer.rollout.grounding import grounding_samples
    from trainer.sandbox.families import FAMILIES, HYBRID_FAMILIES

    n_hybrid = round(n * hybrid_share)
    n_gui = n - n_hybrid
    gui_fams = list(FAMILIES)
    # the recipe's mix: 60 demo episodes and 15 grounding screens (x4 samples) per family gave 2182 + 640
    trajs, gui = demonstrations(gui_fams, 70, width=WIDTH, height=HEIGHT, seed_start=GUI_DEMO_SEEDS, slip=SLIP,
                                observation=OBSERVATION)
    gui += grounding_samples(gui_fams, 15, width=WIDTH, height=HEIGHT, seed_start=GROUNDING_SEEDS,
                             observation=OBSERVATION)
    random.Random(seed).shuffle(gui)
    if len(gui) < n:
        raise SystemExit(f"only {len(gui)} GUI samples for {n}")
    info = {"gui_episodes": len(trajs), "gui_successful": sum(t.success for t in trajs), "gui_pool": len(gui)}
    chosen = gui[:n_gui]
    if n_hybrid:
        htrajs, hyb = _hybrid_demos(list(HYBRID_FAMILIES), n_hybrid)
        random.Random(seed + 1).shuffle(hyb)
        chosen += hyb[:n_hybrid]
        info.update(hybrid_episodes=len(htrajs), hybrid_successful=sum(t.success for t in htrajs),
                    hybrid_pool=len(hyb), hybrid_tool_turns=sum(t.text.count("run_command(") + t.text.count(
                        "read_file(") + t.text.count("write_file(") > 0 for tr in htrajs for t in tr.turns))
    info.update(gui_samples=n_gui, hybrid_samples=n_hybrid)
    return chosen, info


def _hybrid_demos(families: list[str], need: int):
    """Hybrid-family expert demonstrations with the tools on, as the recipe's (slips included), enough
    for `need` samples: every expert turn of the successful episodes."""
    from trainer.learn.sft import Sample
    from trainer.rollout.runner import demonstrate

    trajs, samples, per_family = [], [], 40
    while len(samples) < need:
        start = HYBRID_DEMO_SEEDS + len(trajs)
        tickets = [(start + k, families[k % len(families)]) for k in range(per_family * len(families))]
        got = demonstrate(tickets, env_kw={"width": WIDTH, "height": HEIGHT, "observation": OBSERVATION, "tools": True},
                          slip=SLIP, seed=start)
        trajs += got
        for tr in got:
            if tr.success:
                samples += [Sample(t.messages, t.text, f"{tr.family}:{tr.seed}#{i}") for i, t in enumerate(tr.turns)
                            if i not in tr.slipped]
    return trajs, samples


def cmd_train(args) -> int:
    import torch

    from trainer.learn.metrics import MetricsLog
    from trainer.learn.sft import SFTConfig, load_for_training, train_sft

    torch.set_num_threads(1)
    work = Path(args.work)
    out = work / args.arm
    if (out / "model.safetensors").is_file():
        print(f"{out} is trained already")
        return 0
    base = work / f"base-{args.arm}"  # a copy: the shipped stage is never written to
    shutil.copytree(args.base, base, dirs_exist_ok=True)
    t0 = time.perf_counter()
    samples, info = _samples(args.steps * args.batch, 0.5 if args.arm == "B" else 0.0, seed=0)
    info["demo_seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(info), file=sys.stderr)
    model, processor = load_for_training(base, "cpu")
    cfg = SFTConfig(lr=args.lr, batch_size=args.batch, max_steps=args.steps, warmup_steps=5, seed=0)
    log = MetricsLog(work / f"{args.arm}-logs")
    res = train_sft(model, processor, samples, cfg, out, log=log)
    log.close()
    (work / f"train_{args.arm}.json").write_text(json.dumps({"data": info, "sft": res}, indent=2, default=str) + "\n")
    print(json.dumps({"data": info, "steps": res["steps"], "last_loss": res["last_loss"], "seconds": res["seconds"]}))
    return 0


def _evaluate(model_dir, families, per_family: int, tools: bool, n_envs: int) -> dict:
    from agent.vlm.model import load_vlm
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.runner import evaluate

    model, processor = load_vlm(model_dir)
    actor = VLMActor(model, processor, max_new_tokens=128)
    env_kw = {"width": WIDTH, "height": HEIGHT, "observation": OBSERVATION, **({"tools": True} if tools else {})}
    t0 = time.perf_counter()
    res = evaluate(actor, families, per_family, env_kw=env_kw, n_envs=n_envs)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    res["settings"] = {"model": str(model_dir), "per_family": per_family, "tools": tools, "greedy": True,
                       "max_new_tokens": 128, **env_kw}
    return res


def cmd_eval(args) -> int:
    import torch

    from trainer.sandbox.families import FAMILIES, HYBRID_FAMILIES, family_class

    torch.set_num_threads(1)
    work = Path(args.work)
    hybrid = list(HYBRID_FAMILIES)
    gui_both = [f for f in hybrid if family_class(f).gui_route]  # playable with the tools off too
    jobs = [("gui_A", "A", list(FAMILIES), args.gui_per_family, False),
            ("gui_B", "B", list(FAMILIES), args.gui_per_family, False),
            ("hybrid_B_on", "B", hybrid, args.hybrid_per_family, True),
            ("hybrid_B_off", "B", gui_both, args.hybrid_per_family, False)]
    if args.with_a_hybrid:
        jobs.append(("hybrid_A_on", "A", hybrid, args.hybrid_per_family, True))
    if args.with_base:
        jobs.append(("gui_base", None, list(FAMILIES), args.gui_per_family, False))
    for name, arm, fams, per, tools in jobs:
        if args.only and name not in args.only.split(","):
            continue
        path = work / f"eval_{name}.json"
        if path.is_file():
            continue
        res = _evaluate(work / arm if arm else args.base, fams, per, tools, args.envs)
        path.write_text(json.dumps(res, indent=1) + "\n")
        print(f"{name}: {res['overall']['success']:.3f} {res['overall']['ci95']} in {res['seconds']}s", file=sys.stderr)
    return 0


def _paired(a: dict, b: dict, families=None) -> dict:
    from trainer.stats import paired_difference

    x = {(f, s): ok for f, s, ok in a["outcomes"] if families is None or f in families}
    y = {(f, s): ok for f, s, ok in b["outcomes"] if families is None or f in families}
    keys = sorted(x.keys() & y.keys())
    return paired_difference([x[k] for k in keys], [y[k] for k in keys])


def _ci(r: dict) -> str:
    lo, hi = r["ci95"]
    return f"{r['success']:.3f} [{lo:.2f}, {hi:.2f}]"


def cmd_report(args) -> int:
    work = Path(args.work)
    ev = {p.stem[5:]: json.loads(p.read_text()) for p in work.glob("eval_*.json")}
    tr = {arm: json.loads((work / f"train_{arm}.json").read_text()) for arm in "AB" if (work / f"train_{arm}.json").is_file()}
    for arm, t in tr.items():
        s = t["sft"]
        print(f"train {arm}: {s['steps']} steps x batch {s['config']['batch_size']}, lr {s['config']['lr']}, "
              f"{t['data']['gui_samples']} GUI + {t['data']['hybrid_samples']} hybrid samples, loss {s['first_loss']:.3f} "
              f"-> {s['last_loss']:.3f}, {s['seconds'] / 60:.1f} min (+ demos {t['data']['demo_seconds'] / 60:.1f} min)")
    if "gui_A" in ev and "gui_B" in ev:
        a, b = ev["gui_A"], ev["gui_B"]
        d = _paired(a, b)
        print("\n(a) the 16 GUI-only families, greedy, held-out seeds\n")
        base = ev.get("gui_base")
        print("| family | episodes | " + ("start (no more SFT) | " if base else "")
              + "A: GUI-only SFT | B: GUI + hybrid SFT | B - A |")
        print("|---|---:|---:|---:|---:|" + ("---:|" if base else ""))
        for f in a["families"]:
            print(f"| {f} | {a['families'][f]['episodes']} | "
                  + (f"{base['families'][f]['success']:.2f} | " if base else "")
                  + f"{a['families'][f]['success']:.2f} | "
                  f"{b['families'][f]['success']:.2f} | {b['families'][f]['success'] - a['families'][f]['success']:+.2f} |")
        lo, hi = d["ci95"]
        print(f"| **overall** | {d['episodes']} | " + (f"{_ci(base['overall'])} | " if base else "")
              + f"{_ci(a['overall'])} | {_ci(b['overall'])} | **{d['diff']:+.3f} [{lo:+.2f}, {hi:+.2f}]** |")
        print(f"\ndiscordant pairs (A only, B only): {d['discordant']}; eval minutes A {a['seconds'] / 60:.1f}, "
              f"B {b['seconds'] / 60:.1f}")
        if base:
            for arm, r in (("A", a), ("B", b)):
                d = _paired(base, r)
                lo, hi = d["ci95"]
                print(f"the starting checkpoint: {_ci(base['overall'])}; {arm} - start {d['diff']:+.3f} [{lo:+.2f}, {hi:+.2f}]")
    if "hybrid_B_on" in ev:
        on, off = ev["hybrid_B_on"], ev.get("hybrid_B_off")
        print("\n(b) model B on the 6 hybrid families, greedy, held-out seeds: tools on vs off\n")
        print("| family | episodes | on: success | on: steps | off: success | off: steps |")
        print("|---|---:|---:|---:|---:|---:|")
        for f, r in on["families"].items():
            o = off["families"].get(f) if off else None
            print(f"| {f} | {r['episodes']} | {r['success']:.2f} | {r['mean_steps']:.1f} | "
                  + (f"{o['success']:.2f} | {o['mean_steps']:.1f} |" if o else "not playable (needs the tools) | - |"))
        print(f"| **overall** | {on['overall']['episodes']} | {_ci(on['overall'])} | "
              f"{sum(r['mean_steps'] * r['episodes'] for r in on['families'].values()) / on['overall']['episodes']:.1f} | "
              + (f"{_ci(off['overall'])} | {sum(r['mean_steps'] * r['episodes'] for r in off['families'].values()) / off['overall']['episodes']:.1f} |"
                 if off else "- | - |"))
        print(f"\nreplies that parsed: tools on {on['format_rate']:.2f}" + (f", off {off['format_rate']:.2f}" if off else "")
              + (f"; model A, tools on {ev['hybrid_A_on']['format_rate']:.2f}" if "hybrid_A_on" in ev else "")
              + f"; eval minutes on {on['seconds'] / 60:.1f}" + (f", off {off['seconds'] / 60:.1f}" if off else ""))
        if off:
            fams = list(off["families"])
            steps = sum(on["families"][f]["mean_steps"] for f in fams) / len(fams)
            print(f"mean steps over those {len(fams)} families: on {steps:.1f}, off "
                  f"{sum(off['families'][f]['mean_steps'] for f in fams) / len(fams):.1f}")
            d = _paired(off, on, fams)
            lo, hi = d["ci95"]
            print(f"\npaired on - off over the {len(fams)} families playable both ways ({d['episodes']} episodes): "
                  f"{d['diff']:+.3f} [{lo:+.2f}, {hi:+.2f}], discordant (off only, on only) {d['discordant']}")
        if "hybrid_A_on" in ev:
            d = _paired(ev["hybrid_A_on"], on)
            lo, hi = d["ci95"]
            print(f"model A on the hybrid families, tools on: {_ci(ev['hybrid_A_on']['overall'])}; B - A "
                  f"{d['diff']:+.3f} [{lo:+.2f}, {hi:+.2f}]")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--arm", choices=("A", "B"), required=True)
    t.add_argument("--base", default=BASE)
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--lr", type=float, default=5e-4)
    e = sub.add_parser("eval")
    e.add_argument("--gui-per-family", type=int, default=20, help="held-out seeds per GUI family (default 20: 320)")
    e.add_argument("--hybrid-per-family", type=int, default=20)
    e.add_argument("--envs", type=int, default=8)
    e.add_argument("--only", help="comma-separated evaluations (gui_A, gui_B, hybrid_B_on, hybrid_B_off, hybrid_A_on)")
    e.add_argument("--with-a-hybrid", action="store_true", help="also model A on the hybrid families, tools on")
    e.add_argument("--with-base", action="store_true", help="also the starting checkpoint on the GUI families")
    e.add_argument("--base", default=BASE)
    r = sub.add_parser("report")
    for s in (t, e, r):
        s.add_argument("--work", default="runs/hybrid-transfer")
    args = p.parse_args(argv)
    return {"train": cmd_train, "eval": cmd_eval, "report": cmd_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
