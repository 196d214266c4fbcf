"""What per-server sync state costs and how soon an edit after upload reaches the server:
`python tests/bench/bench_sync_requeue.py [--episodes 1000 --edits 5]`

Prints a table:
- edit -> ack: an episode synced through the app's sync loop (SyncClient.run_forever, a real
  backend on loopback in a thread) is marked a success in the local store; the time until the
  backend acknowledged the new revision, with no submit (the re-queue waits for the edits to be
  quiet for agent.sync.outbox.QUIET_S, then the loop's next look, every QUIET_S / 2);
- the scan the sync loop runs every QUIET_S / 2 (Outbox.requeue_changed) with N synced episodes;
- Outbox.entries() with N episodes (the Library's Sync column and the Sync page read it).

Measured on the reference machine (2 CPU cores shared with other jobs, load 5), 1000 episodes,
median (p95 or max): edit -> ack 4.50 s (4.53); requeue_changed 1.6 ms (8.2); entries() 17.8 ms (39.6).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from factories import make_episode

from agent.schema import Outcome
from agent.storage.store import Store
from agent.sync.client import SyncClient
from agent.sync.outbox import QUIET_S, Outbox
from tests.bench.bench_table import print_table
from trainer.backend.server_thread import start_in_thread


def _ms(fn, reps: int) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=1000)
    ap.add_argument("--edits", type=int, default=5)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        backend = start_in_thread(Path(tmp) / "backend")
        token = backend.store.add_user("ann", "annotator")
        store = Store(Path(tmp) / "local")
        eps = [make_episode(store, 1) for _ in range(args.episodes)]
        client = SyncClient(store, backend.url, token)
        outbox = client.outbox
        for e in eps:
            outbox.submit(e.id)
        loop = asyncio.new_event_loop()
        stop, wake = asyncio.Event(), asyncio.Event()
        worker = threading.Thread(target=lambda: loop.run_until_complete(client.run_forever(stop, wake)), daemon=True)
        worker.start()
        while outbox.pending():
            time.sleep(0.1)
        latencies = []
        target = eps[0].id
        for i in range(args.edits):
            store.update_episode_fields(target, outcome=Outcome(success=bool(i % 2 == 0), source="annotator"))
            revision, t = store.load_episode(target).revision, time.perf_counter()
            while outbox.get(target).state != "synced" or outbox.get(target).revision != revision:
                time.sleep(0.02)
            latencies.append(time.perf_counter() - t)
        loop.call_soon_threadsafe(stop.set)
        worker.join(10)
        rows.append({"what": f"edit -> ack of the new revision (s), {args.edits} edits",
                     "median": statistics.median(latencies), "p95": max(latencies)})
        med, p95 = _ms(lambda: outbox.requeue_changed(), 50)
        rows.append({"what": f"requeue_changed scan, {args.episodes} synced episodes (ms)", "median": med, "p95": p95})
        med, p95 = _ms(lambda: Outbox(store).entries(), 20)
        rows.append({"what": f"Outbox.entries(), {args.episodes} episodes (ms)", "median": med, "p95": p95})
        store.close()
        backend.stop()
    print(f"quiet period {QUIET_S} s, the sync loop looks every {QUIET_S / 2} s")
    print_table(rows, [("what", "what", ""), ("median", "median", ".2f"), ("p95/max", "p95", ".2f")])


if __name__ == "__main__":
    main()
