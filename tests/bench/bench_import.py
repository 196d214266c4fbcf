"""Import memory benchmark (on demand): `python tests/bench/bench_import.py [--blob-mib 1024] [--code DIR]`

Each hostile or large file is imported by `agent.storage.bundle.import_file` into a fresh store in a
process of its own; the table prints the file's size, what the import answered, and that
process's peak RSS (VmHWM: ru_maxrss would count the parent's, kept across exec). The files: a zip holding ~40 MB of JSON `[{}, {}, ...]` (a
bundle member that parses into millions of dicts), the same as a plain .json, and a bundle within
the limits whose blobs inflate to --blob-mib MiB (one episode of 8 MiB screenshots, compressed
~60x). `--code DIR` imports with the Tandem checkout in DIR instead (e.g. an older commit, from
`git archive`), to compare in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from bench_table import print_table

IMPORT_ONE = """
import sys
sys.path.insert(0, sys.argv[1])
from agent.storage.bundle import ImportError_, import_file
from agent.storage.store import Store
with Store(sys.argv[3]) as store:
    try:
        res = import_file(store, sys.argv[2])
        answer = f"imported {res['episodes']} episode(s), {res['blobs']} blob(s)"
    except ImportError_ as e:
        answer = "refused: " + str(e).split(": ", 1)[-1][:70]
    except Exception as e:
        answer = f"crashed: {type(e).__name__}: {str(e)[:60]}"
    problems = store.check(verify_hashes=False)
print(answer + ("" if not problems else f" (check: {len(problems)} problems)"))
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))  # kB
"""


def empty_objects_json(mib: int) -> bytes:
    rnd = random.Random(0)  # varied whitespace: deflate cannot squeeze it past the ratio limit
    block = b"".join(b"{}," + b" " * rnd.randrange(3) for _ in range(350_000))
    return b"[" + block * max(1, mib * 2**20 // len(block)) + b"{}]"


def big_bundle(path: Path, blob_mib: int) -> None:
    """One episode whose steps' screenshots are 8 MiB blobs that compress ~60x."""
    from agent.schema import Action, Episode, Observation, ScreenGeometry, Step
    from agent.storage.store import sha256

    rnd = random.Random(1)
    steps = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for k in range(max(1, blob_mib // 8)):
            noise = bytes(rnd.getrandbits(8) for _ in range(2048))
            data = b"".join(noise[: 1 + rnd.randrange(64)] + bytes(4096) for _ in range(8 * 2**20 // 4096))[: 8 * 2**20]
            h = sha256(data)
            z.writestr(f"blobs/{h}", data)
            geo = ScreenGeometry.simple(320, 200)
            steps.append(Step(k, Observation(h, 320, 200, geo), "Look.", Action("wait", {})))
        ep = Episode("Look at every screenshot", steps=steps)
        z.writestr(f"episodes/{ep.id}.json", json.dumps(ep.to_dict()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blob-mib", type=int, default=1024, help="what the within-limits bundle's blobs inflate to")
    ap.add_argument("--json-mib", type=int, default=40, help="size of the `[{}, {}, ...]` JSON")
    ap.add_argument("--code", default=str(ROOT), help="the Tandem checkout that imports")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        doc = empty_objects_json(args.json_mib)
        files = {"zip of [{}, {}, ...]": tmp / "objects.zip", "[{}, {}, ...] as .json": tmp / "objects.json",
                 f"bundle of {args.blob_mib} MiB of blobs": tmp / "big.zip"}
        with zipfile.ZipFile(files["zip of [{}, {}, ...]"], "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("episodes/e.json", doc)
        files["[{}, {}, ...] as .json"].write_bytes(doc)
        big_bundle(files[f"bundle of {args.blob_mib} MiB of blobs"], args.blob_mib)
        for k, (what, path) in enumerate(files.items()):
            out = subprocess.run([sys.executable, "-c", IMPORT_ONE, args.code, str(path), str(tmp / f"store{k}")],
                                 capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            lines = out.stdout.strip().splitlines()
            answer, rss = (lines[0], int(lines[1]) / 1024) if len(lines) == 2 else (out.stderr.strip()[-70:], float("nan"))
            rows.append({"file": what, "mb": path.stat().st_size / 1e6, "answer": answer, "rss": rss})
    print(f"import with the code in {args.code}")
    print_table(rows, [("file", "file", ""), ("file MB", "mb", ".1f"), ("peak RSS MB", "rss", ".0f"),
                       ("answer", "answer", "")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
