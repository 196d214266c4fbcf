"""Redaction benchmark (run on demand, not collected by the test run):

    python tests/bench/bench_redaction.py [--windows 16] [--frames-per-minute 20] [--threads 0]

Renders labeled 1920x1080 screenshots of real Qt windows (tests/pii_windows.py: forms with
synthetic names, e-mails, phones, card numbers, IBANs, IP addresses and API keys among dates,
prices and order numbers) in 4 font families x 4 pixel sizes (11, 13, 16, 20 px), finds personal
data as the app does (OCR + recognizers), and prints:
  - seconds per 1080p frame (OCR + recognizers; blurring separately) and per active minute at
    --frames-per-minute distinct frames (the recorder keeps one per action; 20 is a brisk pace);
  - recall per kind: true regions covered to >= 90% of their area by the blur boxes;
  - precision per kind: boxes whose centre lies on a true region (of any kind);
  - recall at each text size for e-mail, phone and card (the issue's target: >= 0.95 at >= 11 px).
Names have no recognizer: they are listed to show that reviewers must box them by hand.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from bench_table import print_table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--frames-per-minute", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime threads (0: its default)")
    args = ap.parse_args()

    from pii_windows import FAMILIES, SIZES, render_window, score
    from PySide6.QtWidgets import QApplication

    from agent.redaction.frames import blur_rects, decode, find_regions
    from agent.redaction.ocr import OcrEngine

    qt = QApplication.instance() or QApplication([])  # the windows need one
    engine = OcrEngine(threads=args.threads)
    t = time.perf_counter()
    engine.read(decode(render_window(0, px=13).png))  # load the models once, outside the timing
    load_s = time.perf_counter() - t
    combos = [(f, s) for s in SIZES for f in FAMILIES][: args.windows]
    totals, by_size, ocr_s, blur_s = {}, {}, [], []
    for seed, (family, px) in enumerate(combos, 1):
        shot = render_window(seed, px=px, family=family)
        img = decode(shot.png)
        t = time.perf_counter()
        found = find_regions(img, engine)
        ocr_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        blur_rects(shot.png, [r.rect for r in found])
        blur_s.append(time.perf_counter() - t)
        for kind, rec in score(shot.truth, [(r.kind, r.rect) for r in found]).items():
            for table in (totals.setdefault(kind, {}), by_size.setdefault((kind, px), {})):
                for k, v in rec.items():
                    table[k] = table.get(k, 0) + int(v)
        print(f"  {family} {px}px: {ocr_s[-1]:.2f} s, {len(found)} boxes", file=sys.stderr)

    per_frame = sum(ocr_s) / len(ocr_s)
    per_blur = sum(blur_s) / len(blur_s)
    print(f"\nOCR engine: {engine.version()}; models loaded in {load_s:.1f} s; {os.cpu_count()} cores; "
          f"windows drawn by Qt ({qt.platformName()})")
    print_table([{"what": "find (OCR + recognizers)", "frame": per_frame, "minute": per_frame * args.frames_per_minute},
                 {"what": "blur and re-encode", "frame": per_blur, "minute": per_blur * args.frames_per_minute}],
                [("1920x1080 frame", "what", ""), ("s/frame", "frame", ".2f"),
                 (f"s/active min ({args.frames_per_minute:g} frames)", "minute", ".1f")])
    print()
    rows = [{"kind": k, **v, "recall": v["covered"] / v["truth"] if v["truth"] else float("nan"),
             "precision": v["right"] / v["found"] if v["found"] else float("nan")} for k, v in sorted(totals.items())]
    print_table(rows, [("kind", "kind", ""), ("regions", "truth", "d"), ("covered", "covered", "d"),
                       ("recall", "recall", ".3f"), ("boxes", "found", "d"), ("on target", "right", "d"),
                       ("precision", "precision", ".3f")])
    print()
    size_rows = []
    for px in SIZES:
        row = {"px": px}
        for kind in ("email", "phone", "card"):
            v = by_size.get((kind, px), {"covered": 0, "truth": 0})
            row[kind] = v["covered"] / v["truth"] if v["truth"] else float("nan")
        size_rows.append(row)
    print_table(size_rows, [("text px", "px", "d"), ("email recall", "email", ".3f"),
                            ("phone recall", "phone", ".3f"), ("card recall", "card", ".3f")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
