"""Who may do what on a real backend on 127.0.0.1: bad and revoked tokens, revocation of a connected
session, annotators' scope, blob hashes that are not yours, and corrections and judged outcomes only
from their own supervisor."""
from __future__ import annotations

import asyncio
import time

import pytest
from factories import make_episode
from sync_helpers import local, sync

from agent import protocol as P
from agent.storage.store import sha256
from agent.sync.client import Backoff, SyncClient
from agent.sync.outbox import Outbox
from agent.sync.session import RequestRefused, Session, SyncError


def test_bad_and_revoked_tokens(tmp_path, backend):
    async def open_with(token):
        return await Session.open(backend.url, token)

    for token in ("nope", "tdm_000000000000_x", backend.tokens["ann"][:-2] + "xx"):
        with pytest.raises(SyncError) as e:
            asyncio.run(open_with(token))
        assert e.value.permanent and e.value.code == "auth_failed"
    backend.store.revoke_user("ann2")
    with pytest.raises(SyncError, match="revoked"):
        asyncio.run(open_with(backend.tokens["ann2"]))
    store = local(tmp_path)
    Outbox(store).submit(make_episode(store, 1).id)
    client = SyncClient(store, backend.url, "nope", backoff=Backoff(0.05, 0.1))
    report = asyncio.run(client.sync(deadline=time.monotonic() + 5))
    assert not report.sent and "malformed token" in report.connection_errors[-1]
    assert len(report.connection_errors) == 1  # a bad token is not retried


def test_revocation_cuts_a_connected_session(tmp_path, backend):
    async def run():
        s = await Session.open(backend.url, backend.tokens["ann"])
        await s.request("list_episodes")
        backend.store.revoke_user("ann")  # as `backend user revoke` would, from another connection
        await asyncio.sleep(P.Limits().max_errors * 0 + 1.1)
        with pytest.raises((SyncError, asyncio.TimeoutError)) as e:
            await s.request("list_episodes", timeout=5)
        await s.close()
        return e.value

    err = asyncio.run(run())
    assert "revoked" in str(err)


def test_annotators_read_only_their_own_and_cannot_supervise(tmp_path, backend):
    mine, theirs = local(tmp_path, "a"), local(tmp_path, "b")
    ep_a = make_episode(mine, 2)
    ep_b = make_episode(theirs, 1)
    Outbox(mine).submit(ep_a.id)
    Outbox(theirs).submit(ep_b.id)
    assert sync(mine, backend, "ann").ok and sync(theirs, backend, "ann2").ok
    h_a = sorted(ep_a.blob_hashes())[0]

    async def as_ann2():
        s = await Session.open(backend.url, backend.tokens["ann2"])
        out = {"list": [i["id"] for i in (await s.request("list_episodes")).body["items"]]}
        for name, coro in [
            ("get", s.request("get_episode", episode_id=ep_a.id)),
            ("blob", s.get_blob(h_a)),
            ("list_other", s.request("list_episodes", owner="ann")),
            ("subscribe", s.request("subscribe", run_id="r1")),
            ("claim", s.request("claim", run_id="r1")),
            ("decide", s.decide("r1", "p1", "approve")),
            ("user_add", s.request("user_add", name="x", role="admin")),
        ]:
            try:
                await coro
                out[name] = "allowed"
            except RequestRefused as e:
                out[name] = e.code
        own = (await s.request("get_episode", episode_id=ep_b.id)).body
        out["own"] = own["owner"]
        await s.close()
        return out

    out = asyncio.run(as_ann2())
    assert out["list"] == [ep_b.id] and out["own"] == "ann2"
    assert out["get"] == out["blob"] == out["list_other"] == "forbidden"
    assert out["subscribe"] == out["claim"] == out["decide"] == out["user_add"] == "forbidden"
    # nor overwrite it: ann2 uploading an episode with ann's id fails with the reason
    theirs.save_episode(make_episode(theirs, 1).__class__.from_dict({**ep_a.to_dict(), "steps": []}))
    Outbox(theirs).submit(ep_a.id)
    report = sync(theirs, backend, "ann2")
    assert report.failed and "forbidden" in report.failed[0][1]
    assert backend.store.store.load_episode(ep_a.id).to_dict() == ep_a.to_dict()

    async def as_sup():
        s = await Session.open(backend.url, backend.tokens["sup"])
        items = (await s.request("list_episodes")).body["items"]
        ep = (await s.request("get_episode", episode_id=ep_a.id)).body["episode"]
        blob = await s.get_blob(h_a)
        with pytest.raises(RequestRefused) as e:
            await s.request("get_episode", episode_id="no-such")
        await s.close()
        return items, ep, blob, e.value.code

    items, ep, blob, code = asyncio.run(as_sup())
    assert {i["id"] for i in items} == {ep_a.id, ep_b.id} and ep["id"] == ep_a.id
    assert sha256(blob) == h_a and code == "not_found"


def test_revoked_then_readded_admin_loses_its_idle_admin_session(tmp_path, backend):
    """`backend user revoke root` then `backend user add root --role annotator` (another store
    connection, as the command line's): root's old idle admin session is cut within the sweep
    period without sending anything, and cannot create users."""
    from trainer.backend.server import REVOCATION_CHECK_S
    from trainer.backend.store import BackendStore

    async def run():
        old = await Session.open(backend.url, backend.tokens["root"])
        cli = BackendStore(tmp_path / "backend")  # the command line's own connection
        cli.revoke_user("root")
        new_token = cli.add_user("root", "annotator")
        cli.close()
        await asyncio.sleep(REVOCATION_CHECK_S * 2.5)  # the old session says nothing meanwhile
        with pytest.raises((SyncError, asyncio.TimeoutError, RequestRefused)):
            await old.request("user_add", name="mallory", role="admin", timeout=5)
        await old.close()
        fresh = await Session.open(backend.url, new_token)
        role = fresh.role
        with pytest.raises(RequestRefused):
            await fresh.request("user_add", name="mallory", role="admin", timeout=5)
        await fresh.close()
        return role

    assert asyncio.run(run()) == "annotator"
    assert "mallory" not in {u.name for u in backend.store.users()}


def test_naming_another_users_blob_hash_does_not_make_it_readable(tmp_path, backend):
    """ann2 uploads an episode that names ann's screenshot by hash without having it: the server
    asks ann2 for the data (the proof of having it) instead of taking the hash as present, so the
    upload cannot finish and the blob stays unreadable to ann2."""
    mine = local(tmp_path, "a")
    ep_a = make_episode(mine, 1)
    Outbox(mine).submit(ep_a.id)
    assert sync(mine, backend, "ann").ok
    h_a = sorted(ep_a.blob_hashes())[0]
    forged = {**ep_a.to_dict(), "id": "forged-episode"}

    async def as_ann2():
        s = await Session.open(backend.url, backend.tokens["ann2"])
        s.conn.upload(forged, ref="m1")
        await s.flush()
        ev = await s.next_event(timeout=10)
        with pytest.raises(RequestRefused) as e:
            await s.get_blob(h_a)
        await s.close()
        return ev, e.value.code

    need, refused = asyncio.run(as_ann2())
    assert isinstance(need, P.BlobsNeeded) and h_a in need.hashes
    assert refused == "forbidden"
    assert backend.store.owner_of("forged-episode") is None
    # ann's own re-upload still skips what ann already sent
    Outbox(mine).submit(ep_a.id)
    assert sync(mine, backend, "ann").blobs_sent == 0


def test_a_revoked_supervisor_stops_receiving_live_screenshots(tmp_path, backend):
    """Revoked from another process while it only listens: within the sweep period its
    connection ends, and the proposals published after that never reach it."""
    from trainer.backend.server import REVOCATION_CHECK_S
    from trainer.backend.store import BackendStore

    async def run():
        sup = await Session.open(backend.url, backend.tokens["sup"])
        await sup.request("subscribe", run_id="live")
        agent = await Session.open(backend.url, backend.tokens["ann"])
        await agent.propose("live", "p0", {"i": 0}, b"screen-0")
        first = await sup.next_event(timeout=10)
        while not isinstance(first, P.ProposalReceived):  # the claim state comes first
            first = await sup.next_event(timeout=10)
        cli = BackendStore(tmp_path / "backend")
        cli.revoke_user("sup")
        cli.close()
        await asyncio.sleep(REVOCATION_CHECK_S * 2.5)
        await agent.propose("live", "p1", {"i": 1}, b"screen-1")
        await agent.request("list_episodes")
        later = []
        try:
            while True:
                later.append(await sup.next_event(timeout=2))
        except (TimeoutError, SyncError) as e:
            end = e
        await agent.close()
        await sup.close()
        return first, later, end

    first, later, end = asyncio.run(run())
    assert isinstance(first, P.ProposalReceived) and first.proposal_id == "p0"
    assert not any(isinstance(e, P.ProposalReceived) and e.proposal_id == "p1" for e in later)
    assert isinstance(end, SyncError) and "revoked" in str(end)


def _claiming(store, *, decided_by=None, outcome_source=None, corrected=True):
    """An episode whose step 1 is a supervisor's correction of the agent's proposal (decided_by),
    and/or whose outcome names who judged it."""
    from agent.schema import Action, Outcome, Provenance

    ep = make_episode(store, 2, kind="supervised" if corrected else "recording")
    if corrected:
        ep.steps[1].provenance = Provenance("corrected", proposal_thought="Type rubbish.",
                                            proposal_action=Action("type", {"content": "rubbish"}),
                                            decision="edit", decided_by=decided_by)
    if outcome_source:
        ep.outcome = Outcome(True, 1.0, outcome_source)
    store.save_episode(ep)
    Outbox(store).submit(ep.id)
    return ep


@pytest.mark.parametrize("user, claim, refused", [
    # an annotator forging a named supervisor's correction, or one in its own name: annotators do not correct
    ("ann", {"decided_by": "sup"}, "step 2 is marked as a supervisor's correction (provenance 'corrected'); "
                                   "role 'annotator' may not upload corrections"),
    ("ann", {"decided_by": "ann"}, "role 'annotator' may not upload corrections"),
    ("ann", {"corrected": False, "outcome_source": "supervisor"},
     "the outcome is marked as judged by a supervisor; role 'annotator' may not upload that"),
    ("ann", {"corrected": False, "outcome_source": "annotator"}, None),  # its own mark on its own recording
    ("sup", {"decided_by": "sup2"}, "step 2 is a correction decided by 'sup2'; 'sup' may upload corrections only "
                                    "in its own name"),
    ("sup", {"decided_by": "sup", "outcome_source": "supervisor"}, None),
    ("root", {"decided_by": None}, None),  # a correction in nobody's name is the sender's
])
def test_corrections_and_judged_outcomes_are_stored_only_from_their_own_supervisor(tmp_path, backend, user, claim,
                                                                                   refused):
    """The flywheel trains on corrections (SFT, DPO) and trusts a supervisor's outcome: the backend
    stores them only from a supervisor's or admin's session, in its own name. A refused upload is
    failed with the reason before any of its blobs is sent, and leaves the backend's store sound."""
    store = local(tmp_path)
    ep = _claiming(store, **claim)
    other = make_episode(store, 1)  # queued behind it: sent either way
    Outbox(store).submit(other.id)
    report = sync(store, backend, user)
    bs = backend.store.store
    if refused is None:
        assert report.ok and sorted(report.sent) == sorted([(ep.id, "stored"), (other.id, "stored")])
        from agent.redaction.review import upload_view  # a supervised desktop run leaves redacted

        assert bs.load_episode(ep.id).to_dict() == upload_view(store, store.load_episode(ep.id)).to_dict()
    else:
        (eid, reason), = report.failed
        assert report.sent == [(other.id, "stored")] and eid == ep.id
        assert reason.startswith(f"forbidden: episode {ep.id}: ") and refused in reason
        assert not bs.has_episode(ep.id) and report.blobs_sent == 1  # the other's screenshot, none of the refused one's
        assert [r["status"] for r in bs.query("SELECT status FROM ingest_log WHERE episode_id = ?", [ep.id])] == ["forbidden"]
    assert bs.check() == []


def test_a_local_supervisor_signs_with_the_backend_user_it_syncs_as(tmp_path, backend):
    """A supervisor's app (and `tandem agent`) signed local decisions with a name of its own,
    "supervisor" unless configured, so the backend refused every correction it uploaded. Once its
    store has synced as 'sup', they are signed 'sup' and stored; the refusal before says why."""
    from agent.sync.client import signing_name

    store = local(tmp_path)
    store.set_setting("supervise.name", "Sam")
    early = _claiming(store, decided_by=signing_name(store, "supervisor"))
    report = sync(store, backend, "sup")
    (eid, reason), = report.failed
    assert eid == early.id and "decided by 'Sam'; 'sup' may upload corrections only in its own name" in reason
    assert "sign as the backend user they sync as, 'sup', once they have synced" in reason
    assert signing_name(store, "supervisor") == "sup"
    ep = _claiming(store, decided_by=signing_name(store, "supervisor"))
    report = sync(store, backend, "sup")
    assert report.sent == [(ep.id, "stored")]
    assert backend.store.store.load_episode(ep.id).steps[1].provenance.decided_by == "sup"
