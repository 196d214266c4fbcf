"""The backend's memory budgets, attacked over loopback with a real backend (small budgets set
through its constructor, so that each attack stays light): a client that stops reading is closed,
frames are judged on their header before they are read, open proposals' screenshots are capped
per connection and server-wide, and messages too many values or too deep are refused unparsed.
tests/bench/bench_hostile.py measures the same attacks at full size."""
from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import struct
import time

import pytest
import websockets
from factories import make_episode
from websockets.asyncio.client import connect

from agent import protocol as P
from agent.storage.store import Store
from agent.sync.client import Backoff, SyncClient
from agent.sync.outbox import Outbox
from agent.sync.session import Session
from trainer.backend.server_thread import start_in_thread
from trainer.backend.ws_budget import UNEXPECTED_BLOB_MAX, Budgets

KiB = 1024


def backend_with(tmp_path, **kw):
    b = start_in_thread(tmp_path / "backend", **kw)
    b.tokens = {name: b.store.add_user(name, role) for name, role in [("ann", "annotator"), ("sup", "supervisor")]}
    return b


async def raw_session(url: str, token: str, **kw):
    ws = await connect(url, compression=None, max_size=None, **kw)
    await ws.send(json.dumps({"v": 1, "type": "hello", "token": token}))
    assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "welcome"
    return ws


async def close_code(ws, timeout: float = 10.0) -> int | None:
    """Read until the server closes; the code it closed with."""
    with pytest.raises(websockets.ConnectionClosed) as e:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)
    return e.value.rcvd.code if e.value.rcvd else None


def frame_header(opcode: int, length: int) -> bytes:
    """A client frame's header (FIN, masked) announcing `length` bytes of payload."""
    return struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, length) + b"\0\0\0\0"


async def upload_blob(url: str, token: str, tmp_path, blob: bytes) -> str:
    """Store an episode of the user's whose screenshot is `blob`; returns the blob's hash."""
    store = Store(tmp_path / "src")
    ep = make_episode(store, 1).to_dict()
    store.close()
    digest = hashlib.sha256(blob).hexdigest()
    ep["steps"][0]["observation"]["screenshot"] = digest
    s = await Session.open(url, token)
    s.conn.upload(ep)
    await s.flush()
    assert isinstance(await s.next_event(10), P.BlobsNeeded)
    s.conn.send_blob(digest, blob)
    await s.flush()
    assert isinstance(await s.next_event(10), P.Acked)
    await s.close()
    return digest


def test_a_client_that_stops_reading_is_closed_and_others_are_answered(tmp_path, caplog):
    """70 get_blob of a 16 MB blob never read pinned 1.1 GB before, and the connection stayed:
    now the queued replies stay within the send budget and the connection is closed once they
    stop moving, while other sessions are answered."""
    budgets = Budgets(send=64 * KiB, send_total=256 * KiB, send_stall_s=0.5)
    b = backend_with(tmp_path, budgets=budgets)
    blob = os.urandom(200 * KiB)

    def queued():
        return max([s.out_bytes for s in b.server.sessions] + [0]), b.server.out_bytes, len(b.server.sessions)

    async def run():
        digest = await upload_blob(b.url, b.tokens["ann"], tmp_path, blob)
        ws = await raw_session(b.url, b.tokens["ann"], max_queue=1)  # reads one frame ahead, then TCP backs up
        for k in range(70):
            await ws.send(json.dumps({"v": 1, "type": "get_blob", "hash": digest, "ref": f"g{k}"}))
        most, now = 0, None
        deadline = time.monotonic() + 60  # a bound on the wait, not on the speed
        while time.monotonic() < deadline:  # the client reads nothing: the server's side is watched
            one, total, sessions = now = b.call(queued)
            most = max(most, one)
            if sessions == 0 and total == 0:
                break
            await asyncio.sleep(0.05)
        ws.transport.abort()
        other = await Session.open(b.url, b.tokens["ann"])
        reply = (await other.request("list_episodes")).type
        await other.close()
        return most, now, reply

    try:
        most, (_, total, sessions), reply = asyncio.run(run())
        assert (sessions, total) == (0, 0)  # closed by the server, and what was queued for it freed
        assert any("dropping ann: stopped reading" in r.getMessage() for r in caplog.records)  # not by a keepalive
        assert most <= budgets.send + len(blob) + 1024  # the budget, and the one reply that went over it
        assert reply == "episodes"
    finally:
        b.stop()


def test_frames_are_judged_on_their_header_before_being_read(tmp_path):
    """A text frame over max_text and a blob frame nobody asked for are refused (1009) from their
    header alone: the frames here announce 1 MiB (within the 64 MiB blob frame limit, which was
    all websockets checked) and send none of it, so a server that waited to read them would never
    answer. A requested blob larger than max_text still arrives."""
    b = backend_with(tmp_path, limits=P.Limits(max_text=64 * KiB))

    async def announce(opcode: int) -> int | None:
        ws = await raw_session(b.url, b.tokens["ann"])
        ws.transport.write(frame_header(opcode, 2**20))
        return await close_code(ws)

    async def small_unrequested_blob():
        s = await Session.open(b.url, b.tokens["ann"])
        data = b"x" * (UNEXPECTED_BLOB_MAX // 2)
        s.conn.send_blob(hashlib.sha256(data).hexdigest(), data)
        await s.flush()
        ev = await s.next_event(10)
        await s.close()
        return ev

    try:
        assert asyncio.run(announce(0x1)) == 1009  # text
        assert asyncio.run(announce(0x2)) == 1009  # binary, nothing expected
        ev = asyncio.run(small_unrequested_blob())  # small enough to read: answered, not closed
        assert isinstance(ev, P.ErrorReceived) and ev.code == "unexpected_blob"
        asyncio.run(upload_blob(b.url, b.tokens["ann"], tmp_path, os.urandom(256 * KiB)))
        assert b.call(lambda: b.server.read_ahead.held) == 0
    finally:
        b.stop()


def test_uploads_share_a_small_read_ahead_budget_without_stalling(tmp_path):
    """Three clients upload at once through a server-wide read-ahead budget smaller than their
    blobs together: connections over it wait unread, and every upload completes."""
    b = backend_with(tmp_path, budgets=Budgets(read_ahead=300 * KiB, read_ahead_total=300 * KiB))
    stores = [Store(tmp_path / f"local{i}") for i in range(3)]
    eps = []
    for st in stores:
        ep = make_episode(st, 1)
        ep.steps[0].observation.screenshot = st.put_blob(os.urandom(200 * KiB))
        st.save_episode(ep)
        Outbox(st).submit(ep.id)
        eps.append(ep)

    async def run():
        clients = [SyncClient(st, b.url, b.tokens["ann"], backoff=Backoff(0.05, 0.2)) for st in stores]
        return await asyncio.gather(*(c.sync(deadline=time.monotonic() + 60) for c in clients))

    try:
        reports = asyncio.run(run())
        assert [r.sent for r in reports] == [[(ep.id, "stored")] for ep in eps]
        assert b.call(lambda: b.server.read_ahead.held) == 0
    finally:
        b.stop()


def test_open_proposals_screenshots_are_capped_per_connection_and_server(tmp_path):
    """4 runs x 8 open proposals of 32 MB from one connection held 1.1 GB before (the cap of 8 was
    per run): the oldest open proposals give up their screenshots beyond the budgets, stay open
    (a late subscriber sees them, without the picture) and can still be decided."""
    shot = 10 * KiB
    b = backend_with(tmp_path, budgets=Budgets(proposals=3 * shot, proposals_total=5 * shot))

    def kept():
        return {(r.run_id, pid): data is not None for r in b.server.runs.values() for pid, (_, _, data, _) in r.pending.items()}

    async def run():
        agent = await Session.open(b.url, b.tokens["ann"])
        other = await Session.open(b.url, b.tokens["sup"])
        for run_id in ("a", "b"):
            for i in range(4):
                await agent.propose(run_id, f"p{i}", {"i": i}, os.urandom(shot))
        await agent.request("list_episodes")
        one = b.call(kept)
        for i in range(4):
            await other.propose("c", f"p{i}", {"i": i}, os.urandom(shot))
        await other.request("list_episodes")
        both = b.call(kept)
        totals = b.call(lambda: (b.server.shot_bytes, sorted(s.shot_bytes for s in b.server.sessions)))
        await other.request("claim", run_id="a")
        late = []
        while len(late) < 4:
            ev = await other.next_event(10)
            if isinstance(ev, P.ProposalReceived):
                late.append(ev.screenshot_data is not None)
        await other.decide("a", "p0", "approve")  # open without its picture: still decided
        left = b.call(kept)
        await agent.close()
        await other.close()
        return one, both, totals, late, left

    try:
        one, both, totals, late, left = asyncio.run(run())
        assert len(one) == 8 and sum(one.values()) == 3  # all open, the newest 3 with their screenshot
        assert [k for k, v in one.items() if v] == [("b", "p1"), ("b", "p2"), ("b", "p3")]
        assert len(both) == 12 and sum(both.values()) == 5 and all(both[("c", f"p{i}")] for i in (1, 2, 3))
        assert totals[0] == 5 * shot and max(totals[1]) <= 3 * shot
        assert late == [False] * 4  # run a's proposals are open, their pictures given up
        assert ("a", "p0") not in left and len(left) == 11
    finally:
        b.stop()


def test_manifests_too_big_in_values_or_depth_are_refused_with_a_clear_error(tmp_path):
    """4 manifests of 3.9M empty objects took 1.3 GB: a message's values and nesting are counted
    on its text first and refused in one line naming the count; the connection goes on."""
    b = backend_with(tmp_path, limits=P.Limits(max_json_values=10_000, max_json_depth=16))

    def manifest(junk: str) -> str:
        return ('{"v":1,"type":"manifest","ref":"m1","blobs":[],"content_hash":"' + "0" * 64
                + '","episode":{"id":"e","steps":[],"junk":' + junk + "}}")

    async def run():
        s = await Session.open(b.url, b.tokens["ann"])
        errors = []
        for junk in ("[" + "{}," * 50_000 + "{}]", "[" * 40 + "]" * 40):
            await s.ws.send(manifest(junk))
            errors.append(await s.next_event(10))
        reply = (await s.request("list_episodes")).type
        await s.close()
        return errors, reply

    try:
        (many, deep), reply = asyncio.run(run())
        assert isinstance(many, P.ErrorReceived) and many.code == "too_large"
        assert re.fullmatch(r"the message holds about 1000\d\d JSON values, more than 10000", many.reason)
        assert deep.code == "too_large" and deep.reason == "the message nests JSON 42 levels deep, more than 16"
        assert reply == "episodes" and not b.store.store.has_episode("e")
    finally:
        b.stop()
