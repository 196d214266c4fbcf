"""Benchmark of the tiny local Qwen2.5-VL: build, load, generate, forward+backward.

    python tests/bench/bench_vlm.py [--hidden 128 --layers 2 --image-size 224 --threads 1,2]

Prints one table row per torch thread count. Numbers depend on the machine's load: torch's
intra-op threads spin-wait, so on a busy 2-core machine one thread is often the faster.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vision-depth", type=int, default=2)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--screen", default="320x200", help="screenshot WIDTHxHEIGHT")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)

    import torch
    from PIL import Image

    from agent.grammar import system_prompt
    from agent.vlm import model as vlm
    from trainer.learn.tiny_model import build_tiny_model

    w, h = (int(v) for v in a.screen.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        d = build_tiny_model(Path(tmp) / "m", hidden=a.hidden, layers=a.layers, vision_depth=a.vision_depth,
                             image_size=a.image_size)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        model, processor = vlm.load_vlm(d)
        load_s = time.perf_counter() - t0
        params = sum(p.numel() for p in model.parameters())
        img = Image.new("RGB", (w, h), (230, 235, 240))
        msgs = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": system_prompt("Press OK", "desktop")},
                {"role": "user", "content": [{"type": "image", "image": img}]}]
        answer = "Thought: I click OK.\nAction: click(start_box='(70,40)')"
        train = vlm.build_inputs(processor, msgs + [{"role": "assistant", "content": answer}], assistant_mask=True)
        mask = train.pop("assistant_mask")
        print(f"tiny VLM hidden {a.hidden}, {a.layers} layers, vision depth {a.vision_depth}, {params:,} params; "
              f"screen {w}x{h} -> {vlm.image_token_count(processor, w, h)} image tokens, "
              f"{train['input_ids'].shape[1]} tokens in all; build {build_s:.2f} s, load {load_s:.2f} s")
        print(f"{'threads':>7} | {'generate tok/s':>14} | {'fwd+bwd ms/sample':>17} | {'+AdamW ms':>9}")
        old = torch.get_num_threads()
        for n in (int(t) for t in a.threads.split(",")):
            torch.set_num_threads(n)
            vlm.generate(model, processor, msgs, max_new_tokens=8, temperature=1.0, seed=0)
            g = vlm.generate(model, processor, msgs, max_new_tokens=64, temperature=1.0, seed=1, details=True)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            fb, full = [], []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                loss = vlm.sft_loss(model, train, mask)
                opt.zero_grad()
                loss.backward()
                t1 = time.perf_counter()
                opt.step()
                fb.append(t1 - t0)
                full.append(time.perf_counter() - t0)
            model.eval()
            print(f"{n:>7} | {g.tokens_per_second:>14.0f} | {statistics.median(fb) * 1000:>17.1f} | "
                  f"{statistics.median(full) * 1000:>9.1f}")
        torch.set_num_threads(old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
