"""Memory under attack: a real backend process on loopback (and the importer), attacked the ways
an outsider or a rogue client would, bounded in count and time; prints each attack's peak
resident memory (VmHWM of the process), its resident memory after, and whether the peak stayed
under the goal (README, Security: the backend's memory budget).

    python tests/bench/bench_hostile.py [--only NAME ...] [--scale 1.0]

Each backend attack runs against a fresh backend started for it in a temporary folder (so its
peak is its own), all on 127.0.0.1, and ends by checking that the backend still answers a new
session. `--scale` shrinks the sizes (counts stay) for a quick run. Attacks (issue 38 and before):
- anonymous: 24 connections that never say hello, each sending one 60 MB frame;
- proposals: an annotator publishes 400 proposals of 1 MiB screenshots nobody decides;
- subscribe: a supervisor subscribes to and leaves 5000 run ids;
- unread-blobs: an annotator asks 70 times for its own 16 MB blob and never reads the replies;
- text-frames: 8 connections each send one 60 MB text frame after hello;
- proposal-runs: one connection keeps 4 runs x 8 open proposals of 32 MB screenshots;
- manifests: 4 connections each send a 14 MB manifest of 3.9M empty objects;
- unrequested-blobs: 8 connections each send 5 blob frames of 60 MB nobody asked for;
- uploads (not an attack): 8 connections each upload a 32 MB screenshot at once;
- import-bomb: importing a 1 MB zip whose one member inflates to 1 GB (in a child process);
- import-json: importing a 532 KB zip holding 40 MB of JSON `[{}, {}, ...]` (child process);
- import-bundle: importing a bundle within the limits, 15.7 MB inflating to 1 GiB (child process).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
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

from tests.bench.bench_table import print_table

GOAL_MB = 300  # every attack's peak resident memory must stay under this
MB = 2**20


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


async def anonymous(url: str, tokens: dict, scale: float) -> str:
    from websockets.asyncio.client import connect

    frame = b"\0" * int(60 * MB * scale)

    async def one():
        try:
            async with connect(url, compression=None, max_size=None, open_timeout=10) as ws:
                await asyncio.wait_for(ws.send(frame), 30)
                await asyncio.wait_for(ws.recv(), 10)
        except Exception as e:  # being cut off is the expected end
            return type(e).__name__
        return "answered"

    results = await asyncio.gather(*(one() for _ in range(24)))
    return f"{results.count('answered')} of 24 answered"


async def proposals(url: str, tokens: dict, scale: float) -> str:
    from agent.sync.session import Session

    s = await Session.open(url, tokens["ann"])
    shot = os.urandom(int(MB * scale))
    for i in range(400):
        await s.propose("flood", f"p{i}", {"i": i}, shot[:-4] + i.to_bytes(4, "big"))
    await s.request("list_episodes", timeout=60)
    await s.close()
    return "400 proposals sent"


async def subscribe(url: str, tokens: dict, scale: float) -> str:
    from agent.sync.session import Session

    s = await Session.open(url, tokens["sup"])
    for k in range(5000):
        await s.request("subscribe", run_id=f"r{k}")
        await s.request("unsubscribe", run_id=f"r{k}")
    await s.close()
    return "5000 rounds"


async def raw_session(url: str, token: str, **kw):
    """A websocket that said hello and got its welcome, for frames no well-behaved client sends."""
    from websockets.asyncio.client import connect

    ws = await connect(url, compression=None, max_size=None, open_timeout=10, **kw)
    await ws.send(json.dumps({"v": 1, "type": "hello", "token": token}))
    welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert welcome["type"] == "welcome", welcome
    return ws


async def closed_how(ws, timeout: float) -> str:
    """How the server ended the connection (its close code), reading what it still sends."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)
    except TimeoutError:
        return "still open"
    except Exception:  # ConnectionClosed: the close frame says why
        return str(ws.close_code)


def tally(results: list[str]) -> str:
    return ", ".join(f"{results.count(r)}x {r}" for r in sorted(set(results)))


async def upload_big(url: str, token: str, size: int) -> str:
    """Store an episode of the user's whose screenshot is a blob of `size` random bytes; its hash."""
    from agent import protocol as P
    from agent.storage.store import Store
    from agent.sync.session import Session
    from tests.factories import make_episode

    with tempfile.TemporaryDirectory() as d:
        store = Store(Path(d))
        ep = make_episode(store, 1).to_dict()
        store.close()
    blob = os.urandom(size)
    digest = hashlib.sha256(blob).hexdigest()
    ep["steps"][0]["observation"]["screenshot"] = digest
    s = await Session.open(url, token)
    s.conn.upload(ep)
    await s.flush()
    need = await s.next_event(60)
    assert isinstance(need, P.BlobsNeeded), need
    s.conn.send_blob(digest, blob)
    del blob
    await s.flush()
    acked = await s.next_event(300)
    assert isinstance(acked, P.Acked), acked
    await s.close()
    return digest


async def unread_blobs(url: str, tokens: dict, scale: float) -> str:
    """Upload an episode whose screenshot is a 16 MB blob, then ask for it 70 times on a
    connection that never reads (its own buffer takes one frame, then TCP backs up). The server
    cuts it after send_stall_s; the client, reading nothing, notices at its keepalive."""
    digest = await upload_big(url, tokens["ann"], int(16 * MB * scale))
    ws = await raw_session(url, tokens["ann"], max_queue=1)
    for k in range(70):
        await ws.send(json.dumps({"v": 1, "type": "get_blob", "hash": digest, "ref": f"g{k}"}))
    t0 = time.perf_counter()
    deadline = time.perf_counter() + 90
    while ws.state.name == "OPEN" and time.perf_counter() < deadline:  # never reads: only watches
        await asyncio.sleep(0.5)
    if ws.state.name == "OPEN":
        ws.transport.abort()
        return "still open after 90 s"
    how = f"with {ws.close_code}" if ws.close_code else "(aborted: no close frame can reach a non-reader)"
    return f"closed {how} after {time.perf_counter() - t0:.0f} s"


async def uploads(url: str, tokens: dict, scale: float) -> str:
    """Not an attack: 8 annotators upload a 32 MB screenshot each at once (requested blobs)."""
    done = await asyncio.gather(*(upload_big(url, tokens["ann"], int(32 * MB * scale)) for _ in range(8)))
    return f"{len(done)} of 8 stored"


async def text_frames(url: str, tokens: dict, scale: float) -> str:
    frame = json.dumps({"v": 1, "type": "list_episodes", "junk": "x" * int(60 * MB * scale)})

    async def one():
        ws = await raw_session(url, tokens["ann"])
        try:
            await asyncio.wait_for(ws.send(frame), 60)
        except Exception:  # closed while sending
            pass
        return await closed_how(ws, 30)

    return "closed: " + tally(await asyncio.gather(*(one() for _ in range(8))))


async def proposal_runs(url: str, tokens: dict, scale: float) -> str:
    from agent.sync.session import Session

    s = await Session.open(url, tokens["ann"])
    shot = os.urandom(int(32 * MB * scale))
    for run in range(4):
        for i in range(8):
            await s.propose(f"run{run}", f"p{i}", {"i": i}, shot[:-8] + (run * 100 + i).to_bytes(8, "big"))
    await s.request("list_episodes", timeout=120)
    await s.close()
    return "32 proposals of 32 MB sent"


async def manifests(url: str, tokens: dict, scale: float) -> str:
    n = int(3_900_000 * scale)
    text = ('{"v":1,"type":"manifest","blobs":[],"content_hash":"' + "0" * 64 + '","episode":{"id":"e","steps":['
            + "{}, " * (n - 1) + "{}]}}")

    async def one():
        ws = await raw_session(url, tokens["ann"])
        await ws.send(text)
        reply = json.loads(await asyncio.wait_for(ws.recv(), 120))
        await ws.close()
        return reply.get("code", reply["type"])

    return f"{len(text) / MB:.0f} MB each: " + tally(await asyncio.gather(*(one() for _ in range(4))))


async def unrequested_blobs(url: str, tokens: dict, scale: float) -> str:
    from agent import protocol as P

    payload = os.urandom(int(60 * MB * scale))

    async def one(k):
        ws = await raw_session(url, tokens["ann"])
        try:
            for i in range(5):
                data = payload[:-2] + bytes([k, i])
                await asyncio.wait_for(ws.send(P.encode_blob(hashlib.sha256(data).hexdigest(), data)), 60)
        except Exception:  # closed while sending
            pass
        return await closed_how(ws, 30)

    return "closed: " + tally(await asyncio.gather(*(one(k) for k in range(8))))


async def still_answers(url: str, tokens: dict) -> bool:
    from agent.sync.session import Session

    try:
        s = await Session.open(url, tokens["ann"])
        ok = (await s.request("list_episodes", timeout=30)).type == "episodes"
        await s.close()
        return ok
    except Exception:  # any failure means it does not answer
        return False


IMPORT_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from agent.storage.bundle import ImportError_, import_file
from agent.storage.store import Store
t0 = time.perf_counter()
try:
    import_file(Store(sys.argv[2]), sys.argv[1]); outcome = "imported"
except ImportError_ as e:
    outcome = "refused: " + str(e)[-70:]
except Exception as e:
    outcome = "crashed: " + type(e).__name__ + ": " + str(e)[-60:]
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))  # this process's own peak
rss = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
print(json.dumps({"outcome": outcome, "peak_mb": hwm / 1024, "rss_mb": rss / 1024, "seconds": time.perf_counter() - t0}))
"""


def run_import(path: Path, store: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", IMPORT_CHILD, str(path), str(store), str(ROOT)],
                         capture_output=True, text=True, timeout=900)
    lines = out.stdout.strip().splitlines()
    if not lines:
        return {"outcome": f"died: {out.stderr.strip()[-80:]}", "peak_mb": float("nan"), "rss_mb": float("nan"), "seconds": 0.0}
    return json.loads(lines[-1])


def a_source_episode(tmp: Path):
    from agent.storage.store import Store
    from tests.factories import make_episode

    src = Store(tmp / "src")
    ep = make_episode(src, n_steps=1)
    src.close()
    return ep


def import_bomb(tmp: Path, scale: float) -> dict:
    ep = a_source_episode(tmp)
    want = next(iter(ep.blob_hashes()))
    path = tmp / "bomb.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"episodes/{ep.id}.json", json.dumps(ep.to_dict()))
        with z.open(f"blobs/{want}", "w", force_zip64=True) as f:
            chunk = b"\0" * MB
            for _ in range(int(1024 * scale)):
                f.write(chunk)
    return {**run_import(path, tmp / "store"), "zip_mb": path.stat().st_size / MB}


def import_json(tmp: Path, scale: float) -> dict:
    ep = a_source_episode(tmp)
    path = tmp / "json.zip"
    n = int(40 * MB * scale) // 4
    seps = [b", " if bit else b",\n" for byte in os.urandom(n // 16 + 1) for bit in (byte & 1, byte & 2)]
    body = b"".join(b"{}" + (seps[i // 8] if i % 8 == 0 else b", ") for i in range(n - 1))  # ~77x, as the issue's
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open(f"episodes/{ep.id}.json", "w", force_zip64=True) as f:
            f.write(b"[" + body + b"{}]")
    return {**run_import(path, tmp / "store"), "zip_mb": path.stat().st_size / MB}


def import_bundle(tmp: Path, scale: float) -> dict:
    """16 screenshots of 64 MiB (PNG-signed, a random 16 KiB per MiB so that each inflates
    ~64x, under the importer's ratio limit) in one episode: 1 GiB from a ~16 MB bundle."""
    from agent.schema import Episode

    ep = a_source_episode(tmp).to_dict()
    size = int(64 * MB * scale)
    step = ep["steps"][0]
    ep["steps"] = []
    path = tmp / "bundle.zip"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for i in range(16):
            h = hashlib.sha256()
            blocks = [os.urandom(16384) + b"\0" * (MB - 16384) for _ in range(max(1, size // MB))]
            blocks[0] = b"\x89PNG\r\n\x1a\n" + bytes([i]) + blocks[0][9:]
            for b in blocks:
                h.update(b)
            digest = h.hexdigest()
            with z.open(f"blobs/{digest}", "w", force_zip64=True) as f:
                for b in blocks:
                    f.write(b)
            ep["steps"].append({**json.loads(json.dumps(step)), "index": i})
            ep["steps"][-1]["observation"]["screenshot"] = digest
        Episode.from_dict(ep)
        z.writestr(f"episodes/{ep['id']}.json", json.dumps(ep))
    return {**run_import(path, tmp / "store"), "zip_mb": path.stat().st_size / MB}


BACKEND_ATTACKS = {
    "anonymous": ("24 anonymous 60 MB frames", anonymous),
    "proposals": ("400 undecided 1 MiB proposals", proposals),
    "subscribe": ("5000 subscribe/leave rounds", subscribe),
    "unread-blobs": ("70 unread get_blob of 16 MB", unread_blobs),
    "text-frames": ("8 conns x 60 MB text frame", text_frames),
    "proposal-runs": ("4 runs x 8 open 32 MB proposals", proposal_runs),
    "manifests": ("4 manifests of 3.9M empty objects", manifests),
    "unrequested-blobs": ("8 conns x 5 unrequested 60 MB blobs", unrequested_blobs),
    "uploads": ("(use) 8 conns upload a 32 MB blob", uploads),
}
IMPORT_ATTACKS = {
    "import-bomb": ("import: 1 MB zip, 1 GB member", import_bomb),
    "import-json": ("import: zip of 40 MB [{}, ...] JSON", import_json),
    "import-bundle": ("import: 16 MB bundle -> 1 GiB", import_bundle),
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(BACKEND_ATTACKS) + sorted(IMPORT_ATTACKS))
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the sizes (not the counts) for a quick run")
    args = ap.parse_args(argv)
    chosen = args.only or list(BACKEND_ATTACKS) + list(IMPORT_ATTACKS)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for key in [k for k in chosen if k in BACKEND_ATTACKS]:
            label, attack = BACKEND_ATTACKS[key]
            proc, url, tokens = start_backend(tmp / key)
            try:
                time.sleep(1.0)
                base = rss_mb(proc.pid)
                t0 = time.perf_counter()
                try:
                    outcome = asyncio.run(attack(url, tokens, args.scale))
                except Exception as e:  # the attacker's side failing is an outcome too
                    outcome = f"attacker failed: {type(e).__name__}: {str(e)[:60]}"
                seconds = time.perf_counter() - t0
                answers = asyncio.run(still_answers(url, tokens))
                time.sleep(2.0)
                rows.append({"attack": label, "outcome": outcome + ("" if answers else "; SERVER DOES NOT ANSWER"),
                             "seconds": seconds, "idle_mb": base, "rss_mb": rss_mb(proc.pid), "peak_mb": peak_mb(proc.pid),
                             "ok": answers})
            finally:
                proc.terminate()
                proc.wait(30)
        for key in [k for k in chosen if k in IMPORT_ATTACKS]:
            label, attack = IMPORT_ATTACKS[key]
            (tmp / key).mkdir()
            r = attack(tmp / key, args.scale)
            rows.append({"attack": f"{label} ({r['zip_mb']:.1f} MB zip)", "outcome": r["outcome"], "seconds": r["seconds"],
                         "idle_mb": float("nan"), "rss_mb": r["rss_mb"], "peak_mb": r["peak_mb"], "ok": True})
    for r in rows:
        r["verdict"] = "pass" if r["ok"] and r["peak_mb"] < GOAL_MB else "FAIL"
    print_table(rows, [("attack", "attack", "<"), ("outcome", "outcome", "<"), ("s", "seconds", ".1f"),
                       ("idle MB", "idle_mb", ".0f"), ("peak RSS MB", "peak_mb", ".0f"),
                       ("RSS MB after", "rss_mb", ".0f"), (f"< {GOAL_MB} MB", "verdict", ">")])
    return 0 if all(r["verdict"] == "pass" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
