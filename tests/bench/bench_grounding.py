"""Grounding against model size: SFT on sandbox grounding samples only, then the grounding score.

    python tests/bench/bench_grounding.py [--screens 150 --eval-screens 10 --sizes 128x2x2:260,128x2x2:950,256x4x4:260]

Each size is HIDDEN x LANGUAGE_LAYERS x VISION_LAYERS : SFT_STEPS (batch 8, lr 2e-3), trained from
random weights on the same "Click on 'X'." samples (trainer.rollout.grounding.grounding_samples, 6
families). Prints one row per size: parameters, SFT seconds, last loss, and the share of greedy
clicks inside the named element on held-out screens and on the training screens, with the ratio
to the first row. Measured on 2 CPU cores (stop 14, before the tiny model had interleaved MRoPE and
digit tokens): 1.55M params, 260 steps: 2.9% held-out; 950 steps (800 s): 5.8%; 7.5M params, 260
steps (999 s): 14.0%. The default recipe's model since (SFT on demonstrations plus these samples,
1,596 steps): 14.5%.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import print_table

FAMILIES = ["click_button", "radio", "list_pick", "check_boxes", "dropdown", "tabs"]


def parse_sizes(text: str) -> list[tuple[int, int, int, int]]:
    sizes = []
    for part in text.split(","):
        shape, _, steps = part.partition(":")
        hidden, layers, vision = (int(x) for x in shape.split("x"))
        sizes.append((hidden, layers, vision, int(steps)))
    return sizes


def run(hidden: int, layers: int, vision: int, steps: int, samples, eval_screens: int, workdir: Path) -> dict:
    import torch

    from agent.vlm.model import load_vlm
    from trainer.learn.sft import SFTConfig, train_sft
    from trainer.recipe.default_model import RecipeConfig, build_default_model
    from trainer.rollout.actors import VLMActor
    from trainer.rollout.grounding import grounding_eval

    torch.manual_seed(0)
    base = build_default_model(workdir / f"{hidden}x{layers}x{vision}-{steps}", RecipeConfig(
        hidden=hidden, layers=layers, vision_depth=vision), [s.target for s in samples])
    model, proc = load_vlm(base, device="cpu")
    t0 = time.perf_counter()
    rep = train_sft(model, proc, samples, SFTConfig(lr=2e-3, epochs=100, max_steps=steps, batch_size=8, warmup_steps=5),
                    None, progress=True)
    seconds = time.perf_counter() - t0
    actor = VLMActor(model, proc, max_new_tokens=32)
    held = grounding_eval(actor, FAMILIES, eval_screens, width=320, height=240)
    train = grounding_eval(actor, FAMILIES, eval_screens, width=320, height=240, seed_start=500_000)
    return {"size": f"{hidden}x{layers}x{vision}", "params": sum(p.numel() for p in model.parameters()),
            "steps": steps, "seconds": seconds, "loss": rep.get("last_loss", float("nan")),
            "heldout": held["mean_accuracy"], "train": train["mean_accuracy"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--screens", type=int, default=150, help="training screens per family (up to 4 samples each)")
    ap.add_argument("--eval-screens", type=int, default=10, help="screens per family scored (2 elements each)")
    ap.add_argument("--sizes", default="128x2x2:260,128x2x2:950,256x4x4:260")
    a = ap.parse_args(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import torch

    from trainer.rollout.grounding import grounding_samples

    torch.set_num_threads(1)
    samples = grounding_samples(FAMILIES, a.screens, width=320, height=240)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hidden, layers, vision, steps in parse_sizes(a.sizes):
            rows.append(run(hidden, layers, vision, steps, samples, a.eval_screens, Path(tmp)))
    base = rows[0]["heldout"] or float("nan")
    print(f"\n{len(samples)} grounding samples; held-out = {a.eval_screens} screens x 2 elements x {len(FAMILIES)} families")
    print_table(rows, [("size", "size", ""), ("params", "params", ","), ("steps", "steps", ""), ("seconds", "seconds", ".0f"),
                       ("loss", "loss", ".3f"), ("held-out", "heldout", ".1%"), ("train", "train", ".1%"),
                       ("ratio", lambda r: r["heldout"] / base, ".2f")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
