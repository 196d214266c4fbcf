"""A real backend and real clients on 127.0.0.1: uploads, idempotence, resume, live supervision,
model announcements, the embedded backend, bounded live state (who may do what: test_sync_access)."""
from __future__ import annotations

import asyncio
import time

import pytest
import websockets
from factories import make_episode, screenshot_png
from sync_helpers import local, sync
from websockets.asyncio.client import connect

from agent import protocol as P
from agent.storage.secret_store import saved_secret
from agent.storage.store import Store, sha256
from agent.sync.client import SyncClient
from agent.sync.outbox import Outbox
from agent.sync.session import RequestRefused, Session, SyncError
from trainer.backend.server_thread import start_in_thread


def test_upload_stores_episodes_with_intact_blobs(tmp_path, backend):
    store = local(tmp_path)
    eps = [make_episode(store, 3) for _ in range(3)]
    outbox = Outbox(store)
    assert len(outbox.submit_all()) == 3
    report = sync(store, backend)
    assert report.ok and sorted(report.sent) == sorted((e.id, "stored") for e in eps)
    assert report.steps_sent == 9 and report.blobs_sent == 9
    for ep in eps:
        got = backend.store.store.load_episode(ep.id)
        assert got.to_dict() == ep.to_dict()
        for h in ep.blob_hashes():
            assert sha256(backend.store.store.get_blob(h)) == h
        e = outbox.get(ep.id)
        assert e.state == "synced" and e.ack_status == "stored" and e.content_hash == P.content_hash(ep.to_dict())
    assert backend.store.store.check() == []


def test_idempotent_resend_revision_replace_and_superseded(tmp_path, backend):
    store = local(tmp_path)
    ep = make_episode(store, 2)
    outbox = Outbox(store)
    outbox.submit(ep.id)
    assert sync(store, backend).sent == [(ep.id, "stored")]
    outbox.submit(ep.id)
    report = sync(store, backend)
    assert report.sent == [(ep.id, "duplicate")] and report.blobs_sent == 0
    assert backend.store.store.counts()["episodes"] == 1
    # an edit bumps the revision: it replaces the server's copy, revision kept
    store.update_episode_fields(ep.id, instruction="Press OK twice")
    assert outbox.submit_all() == [ep.id]
    assert sync(store, backend).sent == [(ep.id, "replaced")]
    got = backend.store.store.load_episode(ep.id)
    assert got.revision == 1 and got.instruction == "Press OK twice"
    # an older revision arriving late does not overwrite the newer one
    old = ep.to_dict()
    old["instruction"] = "stale"

    async def send_old():
        s = await Session.open(backend.url, backend.tokens["ann"])
        s.conn.upload(old)
        await s.flush()
        ev = await s.next_event(10)
        await s.close()
        return ev

    ev = asyncio.run(send_old())
    assert isinstance(ev, P.Acked) and ev.status == "superseded"
    assert backend.store.store.load_episode(ep.id).instruction == "Press OK twice"
    statuses = [r["status"] for r in backend.store.ingest_log(ep.id)]
    assert statuses == ["stored", "duplicate", "replaced", "superseded"]


def test_half_sent_upload_resumes_without_resending_blobs(tmp_path, backend):
    store = local(tmp_path)
    ep = make_episode(store, 4)
    Outbox(store).submit(ep.id)

    async def half():
        s = await Session.open(backend.url, backend.tokens["ann"])
        s.conn.upload(ep.to_dict())
        await s.flush()
        need = await s.next_event(10)
        for h in need.hashes[:3]:
            s.conn.send_blob(h, store.get_blob(h))
        await s.flush()
        await s.request("list_episodes")  # a round trip: the three blobs have been handled
        await s.close()
        return need

    need = asyncio.run(half())
    assert len(need.hashes) == 4 and not backend.store.store.has_episode(ep.id)
    report = sync(store, backend)
    assert report.sent == [(ep.id, "stored")] and report.blobs_sent == 1


def test_live_supervision_round_trip(backend):
    shot = screenshot_png(label="live step")
    step = {"thought": "Press OK.", "action": {"name": "click", "args": {"start_box": [0.2, 0.2]}}}

    async def run():
        agent = await Session.open(backend.url, backend.tokens["ann"])
        sup = await Session.open(backend.url, backend.tokens["sup"])
        sup2 = await Session.open(backend.url, backend.tokens["sup2"])
        await sup.request("subscribe", run_id="run-1")
        assert await sup.next_event(5) == P.ClaimChanged("run-1", None)
        await agent.propose("run-1", "p1", step, shot)
        prop = await sup.next_event(5)
        await sup.request("claim", run_id="run-1")
        assert await sup.next_event(5) == P.ClaimChanged("run-1", "sup")
        assert await agent.next_event(5) == P.ClaimChanged("run-1", "sup")
        with pytest.raises(RequestRefused) as e:  # one decider at a time
            await sup2.request("claim", run_id="run-1")
        claim_code = e.value.code
        await sup2.request("subscribe", run_id="run-1")
        assert await sup2.next_event(5) == P.ClaimChanged("run-1", "sup")
        late = await sup2.next_event(5)  # a late subscriber gets the open proposal
        with pytest.raises(RequestRefused) as e:
            await sup2.decide("run-1", "p1", "approve")
        not_claimer = e.value.code
        edited = {**step, "thought": "Press OK, it is the default."}
        await sup.decide("run-1", "p1", "edit", step=edited)
        dec = await agent.next_event(5)
        seen = await sup2.next_event(5)
        with pytest.raises(RequestRefused) as e:  # decided already
            await sup.decide("run-1", "p1", "approve")
        twice = e.value.code
        await agent.end_run("run-1", "finished")
        end = await sup.next_event(5)
        for s in (agent, sup, sup2):
            await s.close()
        return prop, claim_code, late, not_claimer, dec, seen, twice, end

    prop, claim_code, late, not_claimer, dec, seen, twice, end = asyncio.run(run())
    assert isinstance(prop, P.ProposalReceived) and prop.screenshot_data == shot and prop.sender == "ann"
    assert prop.step == step and prop.screenshot == sha256(shot)
    assert claim_code == "conflict" and not_claimer == "bad_state" and twice == "not_found"
    assert late.proposal_id == "p1" and late.screenshot_data == shot
    assert isinstance(dec, P.DecisionReceived) and dec.decision == "edit" and dec.by == "sup"
    assert dec.step["thought"] == "Press OK, it is the default." and seen.decision == "edit"
    assert end == P.RunEnded("run-1", "finished")


def test_disconnecting_agent_ends_its_run_and_claims_are_released(backend):
    async def run():
        agent = await Session.open(backend.url, backend.tokens["ann"])
        sup = await Session.open(backend.url, backend.tokens["sup"])
        await sup.request("claim", run_id="r")
        evs = [await sup.next_event(5)]
        await agent.propose("r", "p", {"thought": "x"})
        evs.append(await sup.next_event(5))
        await agent.close()
        evs.append(await sup.next_event(5))
        await sup.request("release", run_id="r")
        await sup.close()
        return evs

    claimed, prop, end = asyncio.run(run())
    assert claimed == P.ClaimChanged("r", "sup") and prop.screenshot is None
    assert end == P.RunEnded("r", "the agent disconnected")


def test_model_versions_are_announced(backend):
    async def run():
        s = await Session.open(backend.url, backend.tokens["ann"])
        admin = await Session.open(backend.url, backend.tokens["root"])
        await asyncio.to_thread(backend.announce_model, "v1", {"step": 10})
        first = await s.next_event(5)
        await admin.request("announce_model", version="v2", info={"step": 20})
        second = await s.next_event(5)
        with pytest.raises(RequestRefused):
            await s.request("announce_model", version="v3")
        late = await Session.open(backend.url, backend.tokens["sup"])
        third = await late.next_event(5)  # the latest version, right after welcome
        for x in (s, admin, late):
            await x.close()
        return first, second, third

    assert asyncio.run(run()) == (P.ModelVersion("v1", {"step": 10}), P.ModelVersion("v2", {"step": 20}),
                                  P.ModelVersion("v2", {"step": 20}))


def test_admin_manages_users_over_the_wire(backend):
    async def run():
        admin = await Session.open(backend.url, backend.tokens["root"])
        tok = (await admin.request("user_add", name="newbie", role="annotator")).body["token"]
        with pytest.raises(RequestRefused) as e:
            await admin.request("user_add", name="newbie", role="annotator")
        dup = e.value.code
        newbie = await Session.open(backend.url, tok)
        role = newbie.role
        users = (await admin.request("user_list")).body["items"]
        await admin.request("user_revoke", name="newbie")
        with pytest.raises(SyncError):
            await newbie.request("list_episodes", timeout=5)
        await newbie.close()
        await admin.close()
        return role, dup, {u["name"] for u in users}

    role, dup, names = asyncio.run(run())
    assert role == "annotator" and dup == "conflict" and {"newbie", "root", "ann"} <= names
    assert not backend.store.is_active("newbie")


def test_slow_supervisor_is_dropped_not_buffered(backend):
    """Backpressure: a subscriber that stops reading is cut; the agent goes on."""
    big = bytes(range(256)) * 4096  # 1 MiB

    def names():
        return sorted(s.user.name for s in backend.server.sessions if s.user and not s.dropped)

    async def run():
        slow = await connect(backend.url, compression=None, max_size=2**27, max_queue=1)
        conn = P.ClientConnection(backend.tokens["sup"])
        for f in conn.data_to_send():
            await slow.send(f)
        conn.receive_text(await slow.recv())
        conn.request("subscribe", run_id="r")
        for f in conn.data_to_send():
            await slow.send(f)
        await asyncio.sleep(0.2)  # from here on it reads nothing
        agent = await Session.open(backend.url, backend.tokens["ann"])
        before = backend.call(names)
        t0 = time.monotonic()
        for i in range(200):
            await agent.propose("r", f"p{i}", {"i": i}, big[:-1] + bytes([i % 256]))
        reply = (await agent.request("list_episodes")).type  # the agent's connection still answers
        elapsed = time.monotonic() - t0
        after = backend.call(names)
        await agent.close()
        slow.transport.abort()
        return before, after, reply, elapsed

    before, after, reply, elapsed = asyncio.run(run())
    assert before == ["ann", "sup"] and after == ["ann"] and reply == "episodes"
    assert elapsed < 10


def test_embedded_backend(tmp_path):
    from app.sync.embedded import EMBEDDED_TOKEN_KEY, start_embedded_backend

    store = local(tmp_path)
    url, token, stop = start_embedded_backend(store)
    try:
        assert url.startswith("ws://127.0.0.1:") and saved_secret(store, EMBEDDED_TOKEN_KEY) == token
        assert store.get_setting(EMBEDDED_TOKEN_KEY) is None  # never in tandem.db
        ep = make_episode(store, 2)
        Outbox(store).submit(ep.id)
        report = asyncio.run(SyncClient(store, url, token).sync(deadline=time.monotonic() + 10))
        assert report.sent == [(ep.id, "stored")]
    finally:
        stop()
    back = Store(store.root / "backend")
    assert back.load_episode(ep.id).to_dict() == ep.to_dict()
    back.close()
    url2, token2, stop2 = start_embedded_backend(store)  # the saved token is reused
    stop2()
    assert token2 == token and url2 != ""


def test_wss_with_tls(tmp_path):
    """The server speaks TLS when given a certificate (made here with openssl)."""
    import shutil
    import ssl
    import subprocess

    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    b = start_in_thread(tmp_path / "backend", ssl_context=server_ctx)
    token = b.store.add_user("ann", "annotator")
    client_ctx = ssl.create_default_context(cafile=str(cert))
    try:
        assert b.url.startswith("wss://")

        async def run():
            s = await Session.open(b.url, token, ssl=client_ctx)
            r = s.role
            await s.close()
            return r

        assert asyncio.run(run()) == "annotator"
    finally:
        b.stop()


def test_protocol_errors_over_the_wire_leave_the_server_up(backend):
    async def run():
        async with connect(backend.url, compression=None) as ws:
            await ws.send('{"v": 1, "type": "list_episodes"}')
            first = await ws.recv()
            await asyncio.wait_for(ws.wait_closed(), 5)
            code = ws.close_code
        s = await Session.open(backend.url, backend.tokens["ann"])
        await s.ws.send("garbage")
        err = await s.next_event(5)
        ok = (await s.request("list_episodes")).type
        await s.close()
        return first, code, err, ok

    first, code, err, ok = asyncio.run(run())
    assert '"auth_required"' in first and code == P.CLOSE_POLICY
    assert isinstance(err, P.ErrorReceived) and err.code == "bad_json" and ok == "episodes"


def test_websockets_version_pinned():
    assert websockets.__version__.startswith("17.")


def test_a_connection_that_never_says_hello_is_closed(backend, monkeypatch):
    import trainer.backend.server as server

    monkeypatch.setattr(server, "HELLO_TIMEOUT_S", 0.5)

    async def run():
        async with connect(backend.url) as ws:
            t0 = time.monotonic()
            with pytest.raises(websockets.ConnectionClosed) as e:
                await asyncio.wait_for(ws.recv(), 10)
            return time.monotonic() - t0, e.value.rcvd.code if e.value.rcvd else None

    waited, code = asyncio.run(run())
    assert waited < 5 and code == 1008


def test_live_state_stays_bounded(backend):
    """Open proposals of a run are capped (the newest kept), runs nobody follows any more are
    dropped, and a frame larger than a hello before authenticating closes the connection."""
    from trainer.backend.server import MAX_PENDING_PER_RUN
    from trainer.backend.ws_budget import PRE_AUTH_MAX_FRAME

    async def run():
        agent = await Session.open(backend.url, backend.tokens["ann"])
        for i in range(MAX_PENDING_PER_RUN * 5):
            await agent.propose("watched", f"p{i}", {"i": i}, b"x" * 1000)
        await agent.request("list_episodes")
        pending = backend.call(lambda: list(backend.server.runs["watched"].pending))
        sup = await Session.open(backend.url, backend.tokens["sup"])
        for k in range(50):
            await sup.request("subscribe", run_id=f"gone-{k}")
            await sup.request("unsubscribe", run_id=f"gone-{k}")
        runs = backend.call(lambda: sorted(backend.server.runs))
        await sup.close()
        await agent.close()
        async with connect(backend.url, compression=None, max_size=None) as ws:
            await ws.send(b"\0" * (PRE_AUTH_MAX_FRAME * 4))
            with pytest.raises(websockets.ConnectionClosed) as e:
                await asyncio.wait_for(ws.recv(), 10)
        return pending, runs, e.value.rcvd.code if e.value.rcvd else None

    pending, runs, code = asyncio.run(run())
    assert pending == [f"p{i}" for i in range(MAX_PENDING_PER_RUN * 4, MAX_PENDING_PER_RUN * 5)]
    assert runs == ["watched"]
    assert code == 1009  # message too big


def test_a_lone_surrogate_fails_its_episode_and_not_the_queue_behind_it(tmp_path, backend):
    """An episode whose meta holds a lone surrogate (stored before the schema refused it) cannot be
    hashed or sent: it fails with the reason, and the episodes queued behind it are sent."""
    store = local(tmp_path)
    bad = make_episode(store, 1)
    store.update_episode_fields(bad.id, meta={"note": "x\ud800y"})  # json.dumps keeps it as an escape
    good = [make_episode(store, 1) for _ in range(2)]
    for e in [bad, *good]:
        Outbox(store).submit(e.id)
    report = sync(store, backend)
    assert sorted(report.sent) == sorted((e.id, "stored") for e in good)
    (eid, reason), = report.failed
    assert eid == bad.id and "meta.note holds a lone UTF-16 surrogate" in reason


def test_an_unknown_action_inside_a_steps_info_is_refused_on_upload(tmp_path, backend):
    """A step's info.more_actions become training targets: an unknown action there is refused
    where the episode arrives (not later, by the flywheel), and the episode is not stored; our own
    client does not even send it."""
    store = local(tmp_path)
    ep = make_episode(store, 2)
    doc = ep.to_dict()
    doc["steps"][1]["info"] = {"more_actions": [{"name": "no_such_action"}]}

    async def upload_raw():  # as a hostile client would: the manifest as it is
        s = await Session.open(backend.url, backend.tokens["ann"])
        s.conn.send("manifest", episode=doc, blobs=sorted(ep.blob_hashes()), content_hash=P.content_hash(doc), ref="m1")
        await s.flush()
        ev = await s.next_event(10)
        await s.close()
        return ev

    ev = asyncio.run(upload_raw())
    assert isinstance(ev, P.ErrorReceived) and ev.code == "bad_episode" and ev.ref == "m1"
    assert "unknown action 'no_such_action'" in ev.reason
    assert not backend.store.store.has_episode(ep.id) and backend.store.store.check() == []
    ep.steps[1].info = doc["steps"][1]["info"]
    store.save_episode(ep)
    Outbox(store).submit(ep.id)
    report = sync(store, backend)
    assert report.failed == [(ep.id, "the local episode does not load: action: unknown action 'no_such_action'")]


def test_check_fix_during_an_upload_deletes_nothing_the_upload_needs(tmp_path, backend):
    """An annotator's upload is half way: the backend has received three of the episode's four
    screenshots (written, not yet referenced: the episode commits when the last one arrives).
    `python main.py check --fix` runs on the backend's folder in another process meanwhile. It
    keeps those three (pinned by the backend's put_blob, the store's one writer) and the blobs of
    an episode stored before, removes what a writer killed long ago left, and the upload then
    completes with every blob there."""
    import subprocess

    from factories import blob_debris, check_fix

    store = local(tmp_path)
    kept = make_episode(store, 2, width=300, height=180)
    Outbox(store).submit(kept.id)
    assert sync(store, backend).sent == [(kept.id, "stored")]
    ep = make_episode(store, 4)
    with Store(tmp_path / "backend") as other:  # the folder as another process sees it
        orphan, stale, fresh = blob_debris(other)

    async def upload_with_check_fix_in_the_middle():
        s = await Session.open(backend.url, backend.tokens["ann"])
        s.conn.upload(ep.to_dict())
        await s.flush()
        need = await s.next_event(10)
        for h in need.hashes[:3]:
            s.conn.send_blob(h, store.get_blob(h))
        await s.flush()
        await s.request("list_episodes")  # a round trip: the three blobs have been written
        fix = await asyncio.to_thread(subprocess.run, check_fix(tmp_path / "backend"), capture_output=True, text=True,
                                      timeout=120)
        there = [backend.store.store.has_blob(h) for h in need.hashes]
        for h in need.hashes[3:]:
            s.conn.send_blob(h, store.get_blob(h))
        await s.flush()
        ack = await s.next_event(10)
        await s.close()
        return need, fix, there, ack

    need, fix, there, ack = asyncio.run(upload_with_check_fix_in_the_middle())
    assert len(need.hashes) == 4 and there == [True, True, True, False]
    assert fix.returncode == 0 and "removed 2 unused file(s)" in fix.stdout, fix.stdout + fix.stderr
    assert isinstance(ack, P.Acked) and ack.status == "stored"
    b = backend.store.store
    assert b.load_episode(ep.id).to_dict() == ep.to_dict() and b.load_episode(kept.id).to_dict() == kept.to_dict()
    assert not b.has_blob(orphan) and not stale.exists() and fresh.exists()
    assert b.check() == []  # nothing missing, nothing left over


def test_a_reupload_after_routing_keeps_the_old_contents_route_and_routes_the_new_one(tmp_path, backend):
    """The flywheel routes an annotator's episode on the backend; the annotator then changes it
    (marks it failed) and syncs again. The new content shows as unscored until the flywheel
    routes it, the old content keeps its route, revisions stay the annotator's (the routing wrote
    nothing into the episode), and the old content's routing record still answers growth() and
    undo(): undoing it leaves the new content's route alone."""
    from agent.schema import Outcome
    from agent.storage.flywheel_routes import FlywheelRoutes
    from trainer.flywheel.routing import Router

    store = local(tmp_path)
    ep = make_episode(store, 2)
    ep.outcome = Outcome(True, 1.0, "annotator")
    store.save_episode(ep)
    outbox = Outbox(store)
    outbox.submit(ep.id)
    assert sync(store, backend).sent == [(ep.id, "stored")]
    b = backend.store.store
    router = Router(b)
    assert router.route(iteration=1) == {"sft": 1, "ct": 0, "rejected": 0}
    routed, old = b.load_episode_version(ep.id)
    assert routed.to_dict() == ep.to_dict()  # as uploaded: route, outcome, meta and revision untouched
    outbox.submit(ep.id)  # the same content again: a duplicate, its route stands
    assert sync(store, backend).sent == [(ep.id, "duplicate")] and b.judgement(ep.id).route == "sft"

    store.update_episode_fields(ep.id, outcome=Outcome(False, 0.0, "annotator"))
    assert outbox.submit_all() == [ep.id]
    assert sync(store, backend).sent == [(ep.id, "replaced")]
    got, new = b.load_episode_version(ep.id)
    assert new != old and got.revision == 1 and got.outcome.success is False
    assert b.judgement(ep.id).route == "unscored" and router.unscored() == [ep.id]  # pending
    assert (b.judgement(ep.id, old).route, b.judgement(ep.id, old).revision) == ("sft", 1)
    assert [(r["revision"], r["user"]) for r in b.query("SELECT * FROM revisions ORDER BY revision")] == [
        (0, "ann"), (1, "ann")]  # one revision per content
    assert router.growth() == [{"iteration": 1, "sft": 1, "ct": 0, "rejected": 0}]
    assert [r["content_hash"] for r in router.decisions(1)] == [old]

    assert router.route(iteration=2) == {"sft": 0, "ct": 1, "rejected": 0}  # judged failed: CT
    assert b.judgement(ep.id).route == "ct" and b.list_episodes(route="ct")[0].id == ep.id
    shown = FlywheelRoutes(store, tmp_path / "backend").of([store.load_episode(ep.id)])[ep.id]
    assert (shown.route, shown.routing["iteration"]) == ("ct", 2)  # what the app's Library shows
    assert router.undo(1) == 1
    assert b.judgement(ep.id).route == "ct"  # undoing the old content's routing leaves the new one's
    assert (b.judgement(ep.id, old).route, b.judgement(ep.id, old).revision) == ("unscored", 2)
    assert router.growth() == [{"iteration": 2, "sft": 0, "ct": 1, "rejected": 0}]
    assert b.load_episode(ep.id).revision == 1  # still the annotator's
