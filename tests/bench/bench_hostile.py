"""Memory under attack: a real backend process on loopback (and the importer), attacked the ways
an outsider or a rogue client would, bounded in count and time; prints each attack's peak
resident memory (VmHWM of the process) against the idle baseline measured in the same run.

    python tests/bench/bench_hostile.py [--connections 24 --frame-mb 60 --proposals 400 --rounds 5000]

Attacks (all on 127.0.0.1, against a backend started for the run in a temporary folder):
- anonymous: `--connections` connections that never say hello, each sending one `--frame-mb` frame
  (the server reads at most 64 KiB of a frame before hello);
- proposals: an annotator publishes `--proposals` proposals of 1 MiB screenshots nobody decides;
- subscribe: a supervisor subscribes to and leaves `--rounds` run ids;
- bomb: importing a 1 MB zip whose one member inflates to 1 GB (in a child process).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_table import print_table  # noqa: E402


def peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_backend(data: Path) -> tuple[subprocess.Popen, str, dict]:
    tokens = {}
    for name, role in (("ann", "annotator"), ("sup", "supervisor")):
        out = subprocess.run([sys.executable, str(ROOT / "main.py"), "backend", "user", "add", name, "--role", role,
                              "--data", str(data)], capture_output=True, text=True, check=True)
        tokens[name] = out.stdout.strip()
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "backend", "--data", str(data), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"ws://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, url, tokens
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the backend did not start")


async def anonymous(url: str, n: int, frame_mb: int) -> str:
    from websockets.asyncio.client import connect

    frame = b"\0" * (frame_mb << 20)

    async def one():
        try:
            async with connect(url, compression=None, max_size=None, open_timeout=10) as ws:
                await asyncio.wait_for(ws.send(frame), 30)
                await asyncio.wait_for(ws.recv(), 10)
        except Exception as e:  # noqa: BLE001 - being cut off is the expected end
            return type(e).__name__
        return "answered"

    results = await asyncio.gather(*(one() for _ in range(n)))
    return f"{results.count('answered')} of {n} answered"


async def proposals(url: str, token: str, n: int) -> str:
    from agent.sync.session import Session

    s = await Session.open(url, token)
    shot = os.urandom(1 << 20)
    for i in range(n):
        await s.propose("flood", f"p{i}", {"i": i}, shot[:-4] + i.to_bytes(4, "big"))
    await s.request("list_episodes", timeout=60)
    await s.close()
    return f"{n} proposals sent"


async def subscribe(url: str, token: str, rounds: int) -> str:
    from agent.sync.session import Session

    s = await Session.open(url, token)
    for k in range(rounds):
        await s.request("subscribe", run_id=f"r{k}")
        await s.request("unsubscribe", run_id=f"r{k}")
    await s.close()
    return f"{rounds} rounds"


BOMB_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from agent.bundle import ImportError_, import_file
from agent.store import Store
t0 = time.perf_counter()
try:
    import_file(Store(sys.argv[2]), sys.argv[1]); outcome = "imported"
except ImportError_ as e:
    outcome = "refused: " + str(e)[-90:]
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))  # this process's own peak
print(json.dumps({"outcome": outcome, "peak_mb": hwm / 1024,
                  "seconds": time.perf_counter() - t0}))
"""


def bomb(tmp: Path) -> dict:
    from agent.store import Store
    from tests.factories import make_episode

    src = Store(tmp / "bomb-src")
    ep = make_episode(src, n_steps=1)
    want = next(iter(ep.blob_hashes()))
    src.close()
    path = tmp / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"episodes/{ep.id}.json", json.dumps(ep.to_dict()))
        with z.open(f"blobs/{want}", "w", force_zip64=True) as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(1024):
                f.write(chunk)
    out = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(path), str(tmp / "bomb-store"), str(ROOT)],
                         capture_output=True, text=True, timeout=600)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    written = sum(f.stat().st_size for f in (tmp / "bomb-store").rglob("*") if f.is_file() and "blobs" in f.parts)
    return {**res, "zip_mb": path.stat().st_size / 2**20, "written_mb": written / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=24)
    ap.add_argument("--frame-mb", type=int, default=60)
    ap.add_argument("--proposals", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5000)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        proc, url, tokens = start_backend(tmp / "backend")
        try:
            time.sleep(1.0)
            base = rss_mb(proc.pid)
            rows.append({"attack": "idle (baseline)", "outcome": "-", "seconds": 0.0, "rss_mb": base, "peak_mb": peak_mb(proc.pid)})
            for name, coro in (("anonymous big frames", lambda: anonymous(url, args.connections, args.frame_mb)),
                               ("undecided proposals", lambda: proposals(url, tokens["ann"], args.proposals)),
                               ("subscribe/leave", lambda: subscribe(url, tokens["sup"], args.rounds))):
                t0 = time.perf_counter()
                outcome = asyncio.run(coro())
                time.sleep(0.5)
                rows.append({"attack": name, "outcome": outcome, "seconds": time.perf_counter() - t0,
                             "rss_mb": rss_mb(proc.pid), "peak_mb": peak_mb(proc.pid)})
        finally:
            proc.terminate()
            proc.wait(30)
        b = bomb(tmp)
        rows.append({"attack": f"import a {b['zip_mb']:.1f} MB zip bomb (1 GB inflated)", "outcome": b["outcome"],
                     "seconds": b["seconds"], "rss_mb": float("nan"), "peak_mb": b["peak_mb"]})
        print_table(rows, [("attack", "attack", "<"), ("outcome", "outcome", "<"), ("s", "seconds", ".1f"),
                           ("RSS MB after", "rss_mb", ".0f"), ("peak RSS MB", "peak_mb", ".0f")])
        print(f"bomb: {b['written_mb']:.1f} MB of blobs written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
