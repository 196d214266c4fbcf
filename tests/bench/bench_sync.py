"""Sync benchmark (on demand): `python tests/bench/bench_sync.py [--episodes 40 --steps 10 --blob-kb 300]`

Prints a table:
- Tandem upload throughput (MB/s, steps/s) of N episodes through the real backend (a
  subprocess: `python main.py backend`), against raw websockets throughput of the very same
  bytes (a bare websockets echo-less server, also a subprocess, compression off) on loopback in
  the same run, and their ratio;
- ack latency p50/p99 (manifest sent -> ack received, blobs included) with 50 concurrent clients;
- the backend's resident memory (VmRSS now, VmHWM peak) under that load.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from websockets.asyncio.client import connect

from agent import protocol as P
from agent.schema import Action, Episode, Observation, ScreenGeometry, Step
from agent.storage.store import Store
from agent.sync.client import SyncClient
from agent.sync.outbox import Outbox
from agent.sync.session import Session
from trainer.backend.store import BackendStore

RAW_SERVER = """
import asyncio, sys
from websockets.asyncio.server import serve
async def handler(ws):
    n = 0
    async for m in ws:
        n += len(m)
        if m == "done":
            await ws.send(str(n))
async def main():
    async with serve(handler, "127.0.0.1", int(sys.argv[1]), compression=None, max_size=2**27) as s:
        print("ready", flush=True)
        await asyncio.Future()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_episodes(store: Store, n: int, steps: int, blob_bytes: int) -> list[Episode]:
    geometry = ScreenGeometry.simple(1280, 800)
    out = []
    for k in range(n):
        ss = [Step(index=i, observation=Observation(store.put_blob(os.urandom(blob_bytes)), 1280, 800, geometry, float(i)),
                   thought=f"step {i} of task {k}: click the button", action=Action("click", {"start_box": (0.4, 0.6)}))
              for i in range(steps)]
        ep = Episode(instruction=f"bench task {k}", steps=ss)
        store.save_episode(ep)
        out.append(ep)
    return out


def rss_kb(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


async def raw_throughput(port: int, store: Store, episodes: list[Episode]) -> float:
    """The same manifests (as text) and blobs (as binary) over a bare websocket; seconds."""
    frames = []
    for ep in episodes:
        frames.append(P.encode_message("manifest", episode=ep.to_dict(), blobs=sorted(ep.blob_hashes()),
                                       content_hash=P.content_hash(ep.to_dict())))
        frames += [P.encode_blob(h, store.get_blob(h)) for h in sorted(ep.blob_hashes())]
    async with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=2**27) as ws:
        t0 = time.perf_counter()
        for f in frames:
            await ws.send(f)
        await ws.send("done")
        await ws.recv()
        return time.perf_counter() - t0


async def ack_latency(url: str, tokens: list[str], store: Store, per_client: int) -> list[float]:
    eps = {t: make_episodes(store, per_client, 1, 50_000) for t in tokens}
    lat: list[float] = []

    async def one(token: str):
        s = await Session.open(url, token, timeout=30)
        for ep in eps[token]:
            t0 = time.perf_counter()
            s.conn.upload(ep.to_dict())
            await s.flush()
            while True:
                ev = await s.next_event(60)
                if isinstance(ev, P.BlobsNeeded):
                    for h in ev.hashes:
                        s.conn.send_blob(h, store.get_blob(h))
                    await s.flush()
                elif isinstance(ev, P.Acked):
                    lat.append(time.perf_counter() - t0)
                    break
        await s.close()

    await asyncio.gather(*(one(t) for t in tokens))
    return lat


def disk_ceiling(root: Path, store: Store, episodes: list[Episode]) -> float:
    """Seconds to write the same blobs the way the backend does (Store.put_blob: pin, temp file,
    fsync, rename): the most a durable upload can do on this disk."""
    bs = BackendStore(root)
    blobs = [[store.get_blob(h) for h in sorted(ep.blob_hashes())] for ep in episodes]
    t0 = time.perf_counter()
    for group in blobs:
        for data in group:
            bs.put_blob(data)
    el = time.perf_counter() - t0
    bs.close()
    return el


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--blob-kb", type=int, default=300, help="screenshot size (a JPEG of a UI is about 300 KB)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--per-client", type=int, default=10)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    local = Store(tmp / "local")
    episodes = make_episodes(local, args.episodes, args.steps, args.blob_kb * 1024)
    total_bytes = sum(local.blob_path(h).stat().st_size for ep in episodes for h in ep.blob_hashes())
    n_steps = sum(len(ep.steps) for ep in episodes)

    bs = BackendStore(tmp / "backend")
    token = bs.add_user("bench", "annotator")
    tokens = [bs.add_user(f"c{i}", "annotator") for i in range(args.clients)]
    bs.close()
    port, raw_port = free_port(), free_port()
    backend = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "backend", "--port", str(port), "--data",
                                str(tmp / "backend")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    raw = subprocess.Popen([sys.executable, "-c", RAW_SERVER, str(raw_port)], stdout=subprocess.PIPE, text=True)
    try:
        assert backend.stdout.readline().startswith("listening"), "backend did not start"
        assert raw.stdout.readline().strip() == "ready"
        url = f"ws://127.0.0.1:{port}"
        raw_s = asyncio.run(raw_throughput(raw_port, local, episodes))
        Outbox(local).submit_all()
        t0 = time.perf_counter()
        report = asyncio.run(SyncClient(local, url, token).sync(deadline=time.monotonic() + 600))
        up_s = time.perf_counter() - t0
        assert report.ok and len(report.sent) == args.episodes, report
        raw_s2 = asyncio.run(raw_throughput(raw_port, local, episodes))  # again: the better of two
        raw_s = min(raw_s, raw_s2)
        disk_s = disk_ceiling(tmp / "disk", local, episodes)
        idle_rss, _ = rss_kb(backend.pid)
        lat = asyncio.run(ack_latency(url, tokens, Store(tmp / "lat"), args.per_client))
        rss, hwm = rss_kb(backend.pid)
    finally:
        backend.terminate()
        raw.terminate()
        backend.wait(30)
        raw.wait(30)
    mb = total_bytes / 1e6
    lat.sort()
    p50, p99 = statistics.median(lat), lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    rows = [
        ("payload", f"{args.episodes} episodes x {args.steps} steps, {args.blob_kb} KB screenshots, {mb:.1f} MB"),
        ("raw websockets (same bytes)", f"{mb / raw_s:.1f} MB/s  ({raw_s:.2f} s)"),
        ("Tandem upload (store, fsync, acks)", f"{mb / up_s:.1f} MB/s, {n_steps / up_s:.0f} steps/s  ({up_s:.2f} s)"),
        ("ratio upload / raw", f"{raw_s / up_s:.2f}  (target >= 0.6)"),
        ("disk ceiling: same blobs, written as the backend does", f"{mb / disk_s:.1f} MB/s  (ratio to raw {raw_s / disk_s:.2f})"),
        (f"ack latency, {args.clients} clients x {args.per_client} episodes (1 step, 50 KB)",
         f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms  ({len(lat)} acks)"),
        ("backend RSS", f"after upload {idle_rss / 1024:.0f} MiB, under 50 clients {rss / 1024:.0f} MiB, peak {hwm / 1024:.0f} MiB"),
    ]
    w = max(len(r[0]) for r in rows)
    print(f"{'what':<{w}}  measured")
    print(f"{'-' * w}  {'-' * 40}")
    for k, v in rows:
        print(f"{k:<{w}}  {v}")


if __name__ == "__main__":
    main()
