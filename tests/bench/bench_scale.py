"""Scaling out, measured: `train plan` against a real step of a small model, what each memory flag
costs in step time, and 1 vs 2 learner processes (DDP, FSDP2 on gloo) with the same global batch.

    python tests/bench/bench_scale.py [--model assets/default_model --steps 4 --batch 4] [--part plan|sft|ppo]

Table 1: per setting, the plan's bytes next to the measured ones of one real step, for --model
and for a 101.6M-parameter model of the same class built here (hidden 768, 12 language layers, 4
vision blocks; trainer.learn.tiny_model, random weights)
(trainer.learn.memory_plan.measure_step: tensors of weights, gradients, AdamW states; what autograd
saved for backward; the growth of the process's peak RSS, which also holds transients and is
noisy at this size). Table 2: `train sft --max-steps S --batch B --seed 0` through the CLI with
each flag, its training-loop seconds per step and wall seconds (process start and model load
included), and the largest weight difference from the 1-process float32 run. Table 3: `train ppo`
(2 updates of 4 episodes, click_button, 224x168, sync mode) with rollouts in the learner's
process on 1 and 2 learner processes and under each memory flag, with 2 rollout workers as local
processes and as Ray actors (a local Ray, its start included; own policy copies, LoRA, a shared
inference actor), and FSDP2 learners with one local worker: wall seconds, rollout and learner
seconds per update, the weight difference from the first row where it is meant to be equal. Table 4: the plan of
Qwen2.5-VL-7B under each setting (4096 tokens, 1024 of them image tokens).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import print_table

SETTINGS = {"float32": {}, "bf16": {"bf16": True}, "checkpointing": {"grad_checkpointing": True},
            "bf16+checkpointing": {"bf16": True, "grad_checkpointing": True}, "lora 8": {"lora_r": 8},
            "lora 8 + bf16": {"lora_r": 8, "bf16": True}}
FLAGS = {"float32": [], "bf16": ["--bf16"], "checkpointing": ["--grad-checkpointing"], "lora 8": ["--lora", "8"],
         "lora 8 + bf16": ["--lora", "8", "--bf16", "--lora-save", "merged"], "2 proc ddp": ["--nproc", "2"],
         "2 proc fsdp": ["--nproc", "2", "--shard", "fsdp"]}
MB = 1e6


def make_jsonl(root: Path) -> str:
    from agent.storage.export import export_jsonl
    from agent.storage.store import Store
    from tests.factories import make_episode

    with Store(root / "store") as store:
        for _ in range(4):
            make_episode(store, 2, width=224, height=168)
        return export_jsonl(store, root / "export" / "train.jsonl")["path"]


def plan_vs_measured(model_dir: str, jsonl: str) -> list[dict]:
    import torch

    from trainer.learn.memory_plan import measure_step, plan_memory
    from trainer.learn.sft import SFTConfig, jsonl_samples, load_for_training

    torch.set_num_threads(1)
    sample = jsonl_samples(jsonl)[-1]
    rows = []
    for name, kw in SETTINGS.items():
        model, proc = load_for_training(model_dir, "cpu")
        m = measure_step(model, proc, sample, SFTConfig(**kw))
        p = plan_memory(model_dir, bf16=kw.get("bf16", False), lora=kw.get("lora_r"),
                        grad_checkpointing=kw.get("grad_checkpointing", False), seq_len=m["seq_len"],
                        image_tokens=m["image_tokens"], target_tokens=m["target_tokens"])
        measured = sum(m[k] for k in ("weights", "bf16 weight copies", "gradients", "optimizer (AdamW)", "activations"))
        rows.append({"setting": name, "tokens": m["seq_len"], "w_plan": p.parts["weights"] / MB,
                     "w_meas": m["weights"] / MB, "opt": (p.parts["gradients"] + p.parts["optimizer (AdamW)"]) / MB,
                     "opt_meas": (m["gradients"] + m["optimizer (AdamW)"]) / MB,
                     "act_plan": p.parts["activations"] / MB, "act_meas": m["activations"] / MB,
                     "recompute": p.parts["recompute (one layer)"] / MB, "total_plan": p.total / MB,
                     "total_meas": measured / MB, "rss": (m["peak RSS growth"] or 0) / MB})
    return rows


def cli_runs(model_dir: str, jsonl: str, steps: int, batch: int, work: Path) -> list[dict]:
    from safetensors.torch import load_file

    from main import main

    rows, ref = [], None
    for name, flags in FLAGS.items():
        out = work / name.replace(" ", "_").replace("+", "")
        t0 = time.perf_counter()
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = main(["train", "sft", "--model", model_dir, "--jsonl", jsonl, "--out", str(out), "--max-steps",
                       str(steps), "--batch", str(batch), "--seed", "0", *flags])
        wall = time.perf_counter() - t0
        if rc != 0:
            rows.append({"run": name, "step_s": float("nan"), "wall_s": wall, "loss": float("nan"), "diff": float("nan")})
            continue
        res = json.loads(buf.getvalue())
        weights = load_file(str(out / "model.safetensors")) if (out / "model.safetensors").is_file() else None
        ref = ref if ref is not None else weights
        diff = max(float((weights[k] - ref[k]).abs().max()) for k in ref) if weights is not None else float("nan")
        rows.append({"run": name, "step_s": res["seconds"] / steps, "wall_s": wall, "loss": res["last_loss"], "diff": diff})
    return rows


def ppo_runs(model_dir: str, work: Path) -> list[dict]:
    from safetensors.torch import load_file

    from main import main
    from trainer.learn.metrics import read_metrics

    common = ["--updates", "2", "--batch", "4", "--envs", "4", "--mode", "sync", "--value-pretrain", "1", "--epochs", "2",
              "--max-new-tokens", "16", "--max-steps", "2", "--families", "click_button", "--width", "224",
              "--height", "168", "--device", "cpu"]
    runs = {"in learner, 1 proc": ["--workers", "0"], "in learner, 2 procs": ["--workers", "0", "--nproc", "2"],
            "in learner, --bf16": ["--workers", "0", "--bf16"],
            "in learner, --grad-checkpointing": ["--workers", "0", "--grad-checkpointing"],
            "in learner, --lora 8": ["--workers", "0", "--lora", "8", "--lora-save", "merged"],
            "in learner, --lora 8 --bf16": ["--workers", "0", "--lora", "8", "--bf16", "--lora-save", "merged"],
            "2 local workers": ["--workers", "2"], "2 Ray actors": ["--workers", "2", "--engine", "ray"],
            "2 Ray actors, --lora 8 --bf16": ["--workers", "2", "--engine", "ray", "--lora", "8", "--bf16",
                                              "--lora-save", "merged"],
            "2 Ray actors, --inference shared": ["--workers", "2", "--engine", "ray", "--inference", "shared"],
            "1 local worker, --nproc 2 --shard fsdp": ["--workers", "1", "--nproc", "2", "--shard", "fsdp"]}
    rows, ref = [], None
    for name, flags in runs.items():
        out = work / "".join(c if c.isalnum() else "_" for c in name)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["--data", str(work / "data"), "train", "ppo", "--model", model_dir, "--out", str(out), *common, *flags])
        wall = time.perf_counter() - t0
        ppo = [r for r in read_metrics(out.parent / (out.name + "-logs") / "metrics.jsonl") if r["phase"] == "ppo"] if rc == 0 else []
        weights = load_file(str(out / "model.safetensors")) if rc == 0 else None
        ref = weights if ref is None else ref
        diff = max(float((weights[k] - ref[k]).abs().max()) for k in ref) if weights and "in learner" in name else float("nan")
        n = max(1, len(ppo))
        rows.append({"run": name, "wall_s": wall, "rollout_s": sum(r["rollout_seconds"] for r in ppo) / n,
                     "learner_s": sum(r["learner_seconds"] for r in ppo) / n, "diff": diff})
    return rows


def plan_7b() -> list[dict]:
    from trainer.learn.memory_plan import GIB, plan_memory

    rows = []
    for name, kw in {"float32": {}, "bf16": {"bf16": True}, "bf16 + checkpointing": {"bf16": True, "grad_checkpointing": True},
                     "8 x fsdp, bf16 + ckpt": {"nproc": 8, "shard": "fsdp", "bf16": True, "grad_checkpointing": True},
                     "lora 16 + bf16": {"lora": 16, "bf16": True},
                     "lora 16 + bf16 + ckpt": {"lora": 16, "bf16": True, "grad_checkpointing": True},
                     "8 x fsdp, lora 16 + bf16 + ckpt": {"nproc": 8, "shard": "fsdp", "lora": 16, "bf16": True,
                                                         "grad_checkpointing": True}}.items():
        p = plan_memory("qwen2.5-vl-7b", **kw)
        rows.append({"setting": name, **{k: v / GIB for k, v in p.parts.items()}, "total": p.total / GIB,
                     "fits": "yes" if p.fits else "no"})
    return rows


def main_(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(ROOT / "assets" / "default_model"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--part", choices=("all", "plan", "sft", "ppo"), default="all", help="run one table group only")
    args = ap.parse_args(argv)
    import os

    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # the sandboxes of the PPO runs
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = make_jsonl(Path(tmp))
        from trainer.learn.tiny_model import build_tiny_model

        mid = (str(build_tiny_model(Path(tmp) / "mid", hidden=768, layers=12, vision_depth=4))
               if args.part in ("all", "plan") else None)
        columns = [("setting", "setting", ""), ("tokens", "tokens", "d"), ("weights plan", "w_plan", ".2f"),
                   ("measured", "w_meas", ".2f"), ("grads+adam plan", "opt", ".2f"), ("measured", "opt_meas", ".2f"),
                   ("activations plan", "act_plan", ".2f"), ("measured", "act_meas", ".2f"),
                   ("recompute plan", "recompute", ".2f"), ("total plan", "total_plan", ".2f"),
                   ("measured", "total_meas", ".2f"), ("peak RSS growth", "rss", ".1f")]
        for model_dir in (args.model, mid) if args.part in ("all", "plan") else ():
            print(f"== plan vs one measured step ({model_dir}; MB)")
            print_table(plan_vs_measured(model_dir, jsonl), columns)
        if args.part in ("all", "sft"):
            print(f"\n== train sft --max-steps {args.steps} --batch {args.batch} --seed 0")
            print_table(cli_runs(args.model, jsonl, args.steps, args.batch, Path(tmp) / "runs"), [
                ("run", "run", ""), ("s/step", "step_s", ".3f"), ("wall s", "wall_s", ".1f"),
                ("last loss", "loss", ".4f"), ("max |w - w(float32, 1 proc)|", "diff", ".2e")])
        if args.part in ("all", "ppo"):
            print("\n== train ppo, 2 updates x 4 episodes")
            print_table(ppo_runs(args.model, Path(tmp) / "ppo"), [
                ("rollouts", "run", ""), ("wall s", "wall_s", ".1f"), ("rollout s/update", "rollout_s", ".2f"),
                ("learner s/update", "learner_s", ".2f"), ("max |w - w(1 proc)|", "diff", ".2e")])
    if args.part not in ("all", "plan"):
        return
    print("\n== plan: qwen2.5-vl-7b, 1 process unless said, 4096 tokens (GiB)")
    rows = plan_7b()
    print_table(rows, [("setting", "setting", "")] + [(k, k, ".1f") for k in rows[0] if k not in ("setting", "fits")]
                + [("fits h100", "fits", "")])


if __name__ == "__main__":
    main_()
