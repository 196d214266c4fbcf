"""Can the tiny VLM say where something is, and what it says? Rotary layouts and model classes
compared on the simplest grounding tasks.

    python tests/bench/bench_position.py [--task square|words|words_text|words_read] [--steps 300]
        [--layouts blocks:1e6,interleaved:1e4,blocks:20,qwen3_vl]

--task square: each screenshot (320x240, the sandbox's size) is plain but for one dark 40x30
square at a random place; the sample asks "Click the dark square." and the target is the click on
its centre, in the model's smart_resize pixels. --task words: two 72x24 buttons with action words
("Paste", "Print", ...), the sample asks "Click 'X'." for one of them; a model that finds buttons
but cannot read hits the named one half the time ("other" counts clicks on the wrong one). For each
LAYOUT:THETA (a Qwen2.5-VL, trainer.learn.tiny_model.mrope_section) or qwen3_vl[:THETA] (a Qwen3-VL) a
model of the default shape (128 x 2 x 2, Qwen2's digit-per-token tokenizer) is built from random
weights and trained by trainer.learn.sft for --steps steps of 8 samples (lr 2e-3; at most 2,400 distinct
screens, cycled), then answers 60 fresh screens greedily. The table gives the hit rate, the median
x and y errors in pixels, how many distinct clicks it gave (a model blind to position gives one or
two), and the x-error ratio to the first row, all from the same run.

Measured on 2 CPU cores, square:
  stop 16, 300 steps:  blocks:1e6 (Qwen2.5-VL's stock split) hit 0%, err x 72 / y 61 px, 2 distinct;
                       interleaved:1e4 (the tiny model's) hit 10%, 37 / 30 px, 25 distinct;
                       blocks:20 hit 15%, 39 / 21 px, 29 distinct
  stop 18, 300 steps:  interleaved:1e4 hit 10%, 36.5 / 30.2 px (95 s); qwen3_vl hit 22%, 31.3 / 12.7 px (82 s)
  stop 18, 1200 steps, this bench: interleaved:1e4 hit 47%, err x 26.9 / y 3.8 px (335 s);
                       qwen3_vl hit 27%, 29.2 / 16.8 px (328 s)
  stop 18, 1200 steps, separate scripts (not this bench): Qwen2.5-VL with full attention in both
                       vision layers 45%; with a learned absolute row+column embedding added to its
                       patches 73%, 5.4 px; a tiny Qwen3-VL built by the script itself (own
                       processor resizing to 308x252, the shipped model's tokenizer, a plain CE loop)
                       93%, 3.5 px. That script used this bench's schedule; the gap is seed variance
                       and the schedule (stop 19, this bench's build and data, 1,200 steps, 2,400 screens):
                       qwen3_vl seed 0: linear decay + clip 1.0 27%, constant 73%, constant without
                       clipping 93%; seed 1, linear + clip 92%. interleaved:1e4 constant without
                       clipping 63% (vs 47%). A tiny model either takes off on this task or does not.
Words, stop 18, 600 steps: interleaved:1e4 hit 5% (other 3%, 4 distinct clicks), qwen3_vl 2% (other 3%,
  1 distinct): neither has yet learned to find the buttons, let alone read them, at this budget.
Words, stop 19, 1,500 steps, constant rate without clipping: interleaved:1e4 5% (1 distinct click),
  qwen3_vl 2% (2 distinct): still one fixed click, whatever the screen.
Words with the screen text in the prompt (--task words_text: each label and its centre listed, as an
  accessibility tree or OCR would give them; stop 35, interleaved:1e4, the default schedule):
  600 steps hit 17%, other 30%, 60 distinct clicks (141 s); 1,500 steps hit 32%, other 23%, 60
  distinct (330 s). Listed positions are copied at once (every click lands near a listed centre),
  but choosing the listed word that matches the instruction's is barely above chance (32 of 55):
  at this size the match, not the pixels, is what is left to learn.
Words with a perception sample per screen (--task words_read: beside each click sample, "Read the
  buttons." -> each label with its centre in reading order, as UI-TARS's perception data; stop 36,
  interleaved:1e4, the default schedule, 1,500 steps, so half as many click samples): hit 0%, other
  0%, 1 distinct click (440 s); plain words in the same session: hit 2%, other 5%, 9 distinct
  (377 s). Dense reading targets did not teach this model to find the buttons either.
"""
from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table import print_table

WIDTH, HEIGHT, SQUARE = 320, 240, (40, 30)


def square_screen(rng: random.Random):
    """(messages, box in model pixels, target reply) for one screen with one dark square."""
    import numpy as np

    from agent import coords
    from agent.executors.base import Frame
    from agent.schema import ScreenGeometry

    h, w = coords.smart_resize(HEIGHT, WIDTH)
    px = np.full((HEIGHT, WIDTH, 3), 240, np.uint8)
    x0, y0 = rng.randrange(0, WIDTH - SQUARE[0]), rng.randrange(0, HEIGHT - SQUARE[1])
    px[y0:y0 + SQUARE[1], x0:x0 + SQUARE[0]] = (30, 30, 120)
    frame = Frame(geometry=ScreenGeometry(WIDTH, HEIGHT, WIDTH, HEIGHT, 1.0, 0, 0), pixels=px, time=0.0)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Click the dark square."},
                                             {"type": "image", "frame": frame}]}]
    sx, sy = w / WIDTH, h / HEIGHT
    box = (x0 * sx, y0 * sy, (x0 + SQUARE[0]) * sx, (y0 + SQUARE[1]) * sy)
    cx, cy = round((box[0] + box[2]) / 2), round((box[1] + box[3]) / 2)
    return messages, box, f"Thought: I click the square.\nAction: click(start_box='({cx},{cy})')"


WORD_BOX = (72, 24)


def words_screen(rng: random.Random, screen_text: bool = False, read: bool = False):
    """(messages, box of the named button, target reply, box of the other one) for one screen
    with two labelled buttons, asked to click one by name: a model that finds buttons but cannot
    read their labels hits the named one half the time. screen_text: the prompt also lists each
    label with its centre in model pixels, in random order, as an accessibility tree or OCR would
    give them; what is left to learn is matching the instruction's word to a listed one and
    copying its numbers, not reading pixels. read: also return a perception sample of the same
    screen ("Read the buttons." -> each label with its centre), as UI-TARS's perception data."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    from agent import coords
    from agent.executors.base import Frame
    from agent.schema import ScreenGeometry
    from trainer.sandbox.task import WORDS

    h, w = coords.smart_resize(HEIGHT, WIDTH)
    img = Image.new("RGB", (WIDTH, HEIGHT), (240, 240, 240))
    d = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=12)
    words = rng.sample(WORDS["actions"], 2)
    boxes = []
    while len(boxes) < 2:  # two buttons that do not touch
        x0, y0 = rng.randrange(0, WIDTH - WORD_BOX[0]), rng.randrange(0, HEIGHT - WORD_BOX[1])
        b = (x0, y0, x0 + WORD_BOX[0], y0 + WORD_BOX[1])
        if all(b[2] + 4 < o[0] or o[2] + 4 < b[0] or b[3] + 4 < o[1] or o[3] + 4 < b[1] for o in boxes):
            boxes.append(b)
    for word, b in zip(words, boxes, strict=True):
        d.rectangle(b, fill=(225, 228, 235), outline=(120, 120, 130))
        d.text(((b[0] + b[2]) / 2, (b[1] + b[3]) / 2), word, fill=(20, 20, 20), font=font, anchor="mm")
    frame = Frame(geometry=ScreenGeometry(WIDTH, HEIGHT, WIDTH, HEIGHT, 1.0, 0, 0), pixels=np.asarray(img), time=0.0)
    sx, sy = w / WIDTH, h / HEIGHT
    scaled = [(b[0] * sx, b[1] * sy, b[2] * sx, b[3] * sy) for b in boxes]
    centres = [(round((b[0] + b[2]) / 2), round((b[1] + b[3]) / 2)) for b in scaled]
    text = f"Click '{words[0]}'."
    if screen_text:
        listed = [f"'{word}' at ({cx},{cy})" for word, (cx, cy) in zip(words, centres, strict=True)]
        rng.shuffle(listed)
        text += " Screen text: " + "; ".join(listed) + "."
    messages = [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "image", "frame": frame}]}]
    cx, cy = centres[0]
    click = (messages, scaled[0], f"Thought: I click '{words[0]}'.\nAction: click(start_box='({cx},{cy})')", scaled[1])
    if not read:
        return click
    # the perception sample of the same screen: every label with its centre, in reading order
    listed = sorted(zip(words, centres, strict=True), key=lambda wc: (wc[1][1], wc[1][0]))
    answer = "; ".join(f"'{word}' at ({x},{y})" for word, (x, y) in listed)
    reading = [{"role": "user", "content": [{"type": "text", "text": "Read the buttons."}, {"type": "image", "frame": frame}]}]
    return click, (reading, None, f"Thought: {answer}.", None)


def words_text_screen(rng: random.Random):
    return words_screen(rng, screen_text=True)


def square_task(rng: random.Random):
    messages, box, target = square_screen(rng)
    return messages, box, target, None


TASKS = {"square": square_task, "words": words_screen, "words_text": words_text_screen, "words_read": words_screen}


def training_samples(task: str, rng: random.Random, screens: int) -> list[tuple[list, str]]:
    """(messages, target) pairs of `screens` screens; words_read adds each screen's perception
    sample after its click sample (twice the samples, so half the click samples per step)."""
    if task != "words_read":
        return [(m, t) for m, _, t, _ in (TASKS[task](rng) for _ in range(screens))]
    out = []
    for _ in range(screens):
        click, reading = words_screen(rng, read=True)
        out += [(click[0], click[2]), (reading[0], reading[2])]
    return out


def run(layout: str, theta: float, steps: int, workdir: Path, eval_screens: int = 60, arch: str = "qwen2_5_vl",
        task: str = "square") -> dict:
    import statistics

    import torch

    from agent import coords
    from agent.vlm.model import load_vlm
    from trainer.learn.sft import Sample, SFTConfig, train_sft
    from trainer.recipe.default_model import RecipeConfig, build_default_model
    from trainer.rollout.actors import VLMActor

    rng = random.Random(0)
    # at most 2,400 distinct screens, cycled (each sample's pixel_values take ~2 MB once encoded)
    make = TASKS[task]
    samples = [Sample(m, t, f"{task}:{i}") for i, (m, t) in enumerate(training_samples(task, rng, min(steps, 300) * 8))]
    h, w = coords.smart_resize(HEIGHT, WIDTH)
    # the recipe's model, screenshots seen at exactly smart_resize's size, with only the rotary layout changed
    out = build_default_model(workdir / f"{arch}-{layout}-{theta:g}",
                              RecipeConfig(rope_theta=theta, mrope=layout, arch=arch), [s.target for s in samples[:200]])
    model, proc = load_vlm(out, device="cpu")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    rep = train_sft(model, proc, samples, SFTConfig(lr=2e-3, epochs=1, max_steps=steps, batch_size=8, warmup_steps=5),
                    None, progress=True)
    seconds = time.perf_counter() - t0
    actor = VLMActor(model, proc, max_new_tokens=32)
    erng = random.Random(99)
    hits, other_hits, ex, ey, clicks = 0, 0, [], [], set()
    for _ in range(eval_screens):
        messages, (x0, y0, x1, y1), _, other = make(erng)
        m = re.search(r"\((\d+),(\d+)\)", actor.generate(messages, greedy=True).text)
        if not m:  # no click at all: the worst error there is
            ex.append(w)
            ey.append(h)
            continue
        x, y = int(m[1]), int(m[2])
        clicks.add((x, y))
        hits += x0 <= x < x1 and y0 <= y < y1
        other_hits += other is not None and other[0] <= x < other[2] and other[1] <= y < other[3]
        ex.append(abs(x - (x0 + x1) / 2))
        ey.append(abs(y - (y0 + y1) / 2))
    name = f"{layout}:{theta:g}" if arch == "qwen2_5_vl" else f"{arch} (theta {theta:g})"
    return {"layout": name, "seconds": seconds, "loss": rep.get("last_loss", float("nan")),
            "hit": hits / eval_screens, "other": other_hits / eval_screens, "err_x": statistics.median(ex), "err_y": statistics.median(ey),
            "distinct": len(clicks)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300, help="SFT steps of 8 samples per layout")
    ap.add_argument("--task", choices=sorted(TASKS), default="square",
                    help="square: click a lone dark square (where); words: click one of two labelled buttons by name "
                         "(what); words_text: the same with the screen's text and its positions in the prompt; "
                         "words_read: words plus a perception sample per screen (each label with its centre)")
    ap.add_argument("--layouts", default="blocks:1e6,interleaved:1e4,blocks:20,qwen3_vl",
                    help="LAYOUT:THETA of a Qwen2.5-VL model, or qwen3_vl[:THETA] for a Qwen3-VL one, comma-separated")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for part in a.layouts.split(","):
            layout, _, theta = part.partition(":")
            if layout == "qwen3_vl":
                rows.append(run("interleaved", float(theta or 1e4), a.steps, Path(tmp), arch="qwen3_vl", task=a.task))
            else:
                rows.append(run(layout, float(theta or 1e4), a.steps, Path(tmp), task=a.task))
    base = rows[0]["err_x"] or float("nan")
    what = (f"one dark {SQUARE[0]}x{SQUARE[1]} square" if a.task == "square"
            else f"two {WORD_BOX[0]}x{WORD_BOX[1]} labelled buttons, one named")
    print(f"\n{what} on a {WIDTH}x{HEIGHT} screen; {a.steps} SFT steps; 60 fresh screens")
    other = [("other", "other", ".0%")] if a.task.startswith("words") else []
    print_table(rows, [("layout", "layout", ""), ("seconds", "seconds", ".0f"), ("loss", "loss", ".3f"), ("hit", "hit", ".0%"), *other,
                       ("err x", "err_x", ".1f"), ("err y", "err_y", ".1f"), ("distinct", "distinct", ""),
                       ("x err ratio", lambda r: r["err_x"] / base, ".2f")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
