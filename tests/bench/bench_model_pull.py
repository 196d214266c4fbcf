"""Model delivery benchmark (on demand): `python tests/bench/bench_model_pull.py [--mib 300]`

A model folder of --mib MiB (config.json and random weights) is announced on a real backend on
loopback and pulled with `agent.sync.model_pull.pull_model` (SHA-256 chunks over the sync protocol,
each verified, files assembled and checked). Prints a table: the first pull (the backend hashes
the folder once), a second pull (manifest cached), a resumed pull with half the chunks already
kept, against a plain local copy of the same bytes (shutil.copytree) in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from agent.storage.model_files import ModelDownload, model_manifest
from agent.sync.model_pull import pull_model
from trainer.backend.server_thread import start_in_thread


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=300, help="size of the model's weights file (MiB)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = tmp / "served" / "v0001"
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
        with open(model / "model.safetensors", "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(2**20))
        size = sum(p.stat().st_size for p in model.iterdir()) / 2**20
        rows = []
        t0 = time.perf_counter()
        shutil.copytree(model, tmp / "copy")
        rows.append(("local copy (baseline)", time.perf_counter() - t0))
        bt = start_in_thread(tmp / "backend")
        try:
            token = bt.store.add_user("sup", "supervisor")
            bt.announce_model("v0001", {"path": str(model)})
            for label in ("first pull (backend hashes)", "second pull (manifest cached)"):
                shutil.rmtree(tmp / "C", ignore_errors=True)
                t0 = time.perf_counter()
                pull_model(bt.url, token, tmp / "C")
                rows.append((label, time.perf_counter() - t0))
            # half the chunks already kept by an interrupted pull
            shutil.rmtree(tmp / "C")
            dl = ModelDownload(model_manifest(model), tmp / "C" / "v0001")
            missing = dl.missing()
            m = dl.manifest
            where = {h: (p["path"], k * m["chunk_bytes"]) for p in m["files"] for k, h in enumerate(p["chunks"])}
            for h in missing[: len(missing) // 2]:
                path, off = where[h]
                with open(model / path, "rb") as f:
                    f.seek(off)
                    dl.add(h, f.read(m["chunk_bytes"]))
            t0 = time.perf_counter()
            res = pull_model(bt.url, token, tmp / "C")
            rows.append((f"resumed pull ({res['resumed_chunks']} of {dl.total} chunks kept)", time.perf_counter() - t0))
        finally:
            bt.stop()
    base = rows[0][1]
    print(f"model of {size:.0f} MiB, pulled over ws:// on loopback")
    print(f"{'what':<40}{'seconds':>10}{'MiB/s':>10}{'x copy':>10}")
    for label, dt in rows:
        print(f"{label:<40}{dt:>10.2f}{size / dt:>10.0f}{dt / base:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
