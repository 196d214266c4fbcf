"""The sync protocol without a network: frames in, events out, frames to send."""
from __future__ import annotations

import hashlib
import json

import pytest
from factories import make_episode, screenshot_png

from agent import protocol as P


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def msg(mtype, **fields) -> str:
    return json.dumps({"v": 1, "type": mtype, **fields})


def server_open(limits=P.DEFAULT_LIMITS) -> P.ServerConnection:
    s = P.ServerConnection(limits)
    [ev] = s.receive_text(msg("hello", token="t"))
    assert ev == P.HelloReceived("t", None)
    s.accept("ann", "annotator")
    s.data_to_send()
    return s


def pair():
    """A client and a server connected by hand (each's output fed to the other)."""
    c = P.ClientConnection("tok", "test")
    s = P.ServerConnection()
    [hello] = deliver(c, s)
    assert isinstance(hello, P.HelloReceived) and hello.token == "tok" and hello.client == "test"
    s.accept("ann", "annotator")
    [welcome] = deliver(s, c)
    assert welcome.user == "ann" and welcome.role == "annotator" and c.state == "open"
    return c, s


def deliver(src, dst) -> list:
    events = []
    for frame in src.data_to_send():
        events += dst.receive_text(frame) if isinstance(frame, str) else dst.receive_bytes(frame)
    return events


def sent(conn) -> list[dict]:
    return [json.loads(f) if isinstance(f, str) else f for f in conn.data_to_send()]


# ---------------------------------------------------------------- codec
def test_message_round_trip_and_canonical_hash():
    text = P.encode_message("need", episode_id="e1", revision=2, hashes=["a" * 64], ref="r1")
    d = P.decode_message(text)
    assert d.error is None and d.type == "need"
    assert d.body == {"episode_id": "e1", "revision": 2, "hashes": ["a" * 64], "ref": "r1"}
    assert P.content_hash({"b": 1, "a": [1, 2]}) == P.content_hash({"a": [1, 2], "b": 1})
    assert P.content_hash({"a": 1}) != P.content_hash({"a": 2})


def test_blob_round_trip_and_header():
    data = screenshot_png()
    frame = P.encode_blob(sha(data), data)
    assert frame[:3] == b"TDB" and frame[3] == 1 and len(frame) == P.BLOB_HEADER_LEN + len(data)
    assert P.decode_blob(frame) == (sha(data), data)


@pytest.mark.parametrize("frame, code", [
    (b"xx", "bad_message"),
    (b"XYZ\x01" + bytes(32) + b"abc", "bad_message"),
    (b"TDB\x09" + bytes(32) + b"abc", "bad_version"),
    (b"TDB\x01" + bytes(32) + b"abc", "hash_mismatch"),
])
def test_bad_blob_frames(frame, code):
    digest, err = P.decode_blob(frame)
    assert digest is None and err[0] == code


def test_blob_over_the_limit():
    data = b"x" * 101
    digest, err = P.decode_blob(P.encode_blob(sha(data), data), P.Limits(max_blob=100))
    assert digest is None and err[0] == "too_large" and "101" in err[1]


@pytest.mark.parametrize("text, code", [
    ("{not json", "bad_json"),
    ("[" * 100000, "too_large"),  # nesting past max_json_depth: refused before json.loads recurses
    ('{"v": 1, "type": "hello", "token": "a\\ud800b"}', "bad_text"),  # a lone surrogate cannot be sent on as UTF-8
    ("[1, 2]", "bad_message"),
    ('{"type": "hello", "token": "x"}', "bad_version"),
    ('{"v": 2, "type": "hello", "token": "x"}', "bad_version"),
    ('{"v": true, "type": "hello", "token": "x"}', "bad_version"),
    ('{"v": 1, "type": 5}', "bad_message"),
    ('{"v": 1, "type": "launch_missiles"}', "unknown_type"),
    ('{"v": 1, "type": "hello"}', "bad_field"),
    ('{"v": 1, "type": "hello", "token": 5}', "bad_field"),
    ('{"v": 1, "type": "get_blob", "hash": "zz"}', "bad_field"),
    ('{"v": 1, "type": "need", "episode_id": "e", "revision": -1, "hashes": []}', "bad_field"),
    ('{"v": 1, "type": "need", "episode_id": "e", "revision": true, "hashes": []}', "bad_field"),
    ('{"v": 1, "type": "hello", "token": "x", "ref": 7}', "bad_field"),
    ('{"v": 1, "type": "decision", "run_id": "r", "proposal_id": "p", "decision": "maybe"}', "bad_field"),
    ('{"v": 1, "type": "subscribe", "run_id": ""}', "bad_field"),
])
def test_decode_errors_are_values(text, code):
    d = P.decode_message(text)
    assert d.error is not None and d.error[0] == code, d


def test_message_shape_is_limited_before_parsing():
    """14 MB of `[{}, {}, ...]` parsed into 330 MB of dicts: values and depth are counted on the
    text first (brackets and commas inside strings do not count), and refused with one clear line."""
    lim = P.Limits(max_json_values=1000, max_json_depth=5)
    flood = msg("list_episodes", owner="x") [:-1] + ', "junk": [' + ", ".join(["{}"] * 2000) + "]}"
    d = P.decode_message(flood, lim)
    assert d.error[0] == "too_large" and "JSON values, more than 1000" in d.error[1]
    deep = msg("list_episodes")[:-1] + ', "junk": ' + "[" * 6 + "]" * 6 + "}"
    d = P.decode_message(deep, lim)
    assert d.error == ("too_large", "the message nests JSON 7 levels deep, more than 5")
    text_like = msg("hello", token="[{," * 5000)  # the same characters inside a string are text
    assert P.decode_message(text_like, lim).error is None
    assert P.decode_message(msg("list_episodes")[:-1] + ', "junk": ' + "[" * 4 + "]" * 4 + "}", lim).error is None


def test_text_over_the_limit():
    d = P.decode_message(msg("hello", token="x" * 200), P.Limits(max_text=100))
    assert d.error[0] == "too_large"


def test_encode_refuses_our_own_mistakes():
    with pytest.raises(P.ProtocolUsageError, match="unknown message type"):
        P.encode_message("nope")
    with pytest.raises(P.ProtocolUsageError, match="field 'revision'"):
        P.encode_message("need", episode_id="e", revision="2", hashes=[])
    with pytest.raises(P.ProtocolUsageError, match="not a blob hash"):
        P.encode_blob("abc", b"")


def test_optional_fields_may_be_null():
    assert P.check_fields("proposal", {"run_id": "r", "proposal_id": "p", "step": {}, "screenshot": None}) is None
    assert "screenshot" in P.check_fields("proposal", {"run_id": "r", "proposal_id": "p", "step": {}, "screenshot": "x"})


# ---------------------------------------------------------------- handshake
def test_server_handshake_accept_and_reject():
    s = P.ServerConnection()
    s.receive_text(msg("hello", token="bad", client="c"))
    assert s.state == "auth"
    s.reject("unknown token")
    [err] = sent(s)
    assert err["type"] == "error" and err["code"] == "auth_failed" and err["fatal"] is True
    assert s.closed and s.close_code == P.CLOSE_POLICY
    assert s.receive_text(msg("hello", token="x")) == []  # closed: nothing more is read


def test_first_message_must_be_hello():
    s = P.ServerConnection()
    [ev] = s.receive_text(msg("list_episodes"))
    assert ev.code == "auth_required" and ev.fatal and s.closed


def test_garbage_before_hello_is_fatal():
    s = P.ServerConnection()
    [ev] = s.receive_text("garbage")
    assert ev.code == "bad_json" and ev.fatal and s.close_code == P.CLOSE_PROTOCOL


def test_wrong_version_hello_is_fatal_and_says_what_is_supported():
    s = P.ServerConnection()
    [ev] = s.receive_text(json.dumps({"v": 7, "type": "hello", "token": "t"}))
    assert ev.code == "bad_version" and ev.fatal
    assert "[1]" in sent(s)[0]["reason"]


def test_messages_while_authenticating_and_blob_before_open():
    s = P.ServerConnection()
    s.receive_text(msg("hello", token="t"))
    [ev] = s.receive_text(msg("list_episodes"))
    assert ev.code == "bad_state" and ev.fatal
    s2 = P.ServerConnection()
    [ev] = s2.receive_bytes(P.encode_blob(sha(b"x"), b"x"))
    assert ev.code == "bad_state" and s2.closed


def test_second_hello_is_an_error_but_not_fatal():
    s = server_open()
    [ev] = s.receive_text(msg("hello", token="t"))
    assert ev.code == "bad_state" and not ev.fatal and not s.closed


def test_accept_twice_is_a_usage_error():
    s = server_open()
    with pytest.raises(P.ProtocolUsageError):
        s.accept("a", "admin")


def test_client_handshake_and_server_limits_apply():
    c = P.ClientConnection("tok")
    assert json.loads(c.data_to_send()[0])["token"] == "tok"
    with pytest.raises(P.ProtocolUsageError, match="not open"):
        c.request("list_episodes")
    [w] = c.receive_text(msg("welcome", user="u", role="admin", server="s", limits={"max_blob": 10, "max_text": True}))
    assert w == P.Welcome("u", "admin", "s", {"max_blob": 10, "max_text": True})
    assert c.limits.max_blob == 10 and c.limits.max_text == P.Limits().max_text  # a bool is not a size
    with pytest.raises(P.ProtocolUsageError, match="exceeds"):
        c.send_blob(sha(b"x" * 11), b"x" * 11)
    [ev] = c.receive_text(msg("welcome", user="u", role="admin", server="s", limits={}))
    assert ev.code == "bad_state" and not c.closed


def test_client_does_not_send_a_manifest_the_server_would_refuse_unread(tmp_path):
    """The server refuses a message over its value, depth or size limits before parsing it, so
    without its ref: the client checks its manifest against the limits the welcome announced
    and fails that episode with one clear line instead of waiting for an answer."""
    from factories import make_episode

    from agent.storage.store import Store

    ep = make_episode(Store(tmp_path), 30).to_dict()
    c, s = P.ClientConnection("tok"), P.ServerConnection(P.Limits(max_json_values=500, max_json_depth=4))
    deliver(c, s)
    s.accept("u", "annotator")
    deliver(s, c)  # the welcome carries the server's limits
    assert (c.limits.max_json_values, c.limits.max_json_depth) == (500, 4)
    with pytest.raises(P.ProtocolUsageError, match=r"^episode '.*': the message holds about \d+ JSON values, more than 500$"):
        c.upload(ep)
    assert c.data_to_send() == []
    c.limits = P.Limits(max_text=1000)
    with pytest.raises(P.ProtocolUsageError, match=r"the manifest is \d+ bytes, more than the server's 1000"):
        c.upload(ep)
    c.limits = P.Limits()
    c.upload(ep)
    assert json.loads(c.data_to_send()[0])["type"] == "manifest"


def test_client_refused_and_unexpected_first_message():
    c = P.ClientConnection("tok")
    [ev] = c.receive_text(msg("error", code="auth_failed", reason="unknown token", fatal=True))
    assert isinstance(ev, P.ErrorReceived) and ev.fatal and ev.code == "auth_failed" and c.closed
    c2 = P.ClientConnection("tok")
    [ev] = c2.receive_text(msg("ack", episode_id="e", revision=0, content_hash="a" * 64, status="stored"))
    assert isinstance(ev, P.ProtocolError) and ev.code == "bad_state" and c2.closed


def test_side_checks():
    s = server_open()
    [ev] = s.receive_text(msg("welcome", user="u", role="admin", server="s", limits={}))
    assert ev.code == "unknown_type" and "server accepts" in ev.reason
    with pytest.raises(P.ProtocolUsageError, match="does not send"):
        s.send("hello", token="x")
    c, _ = pair()
    [ev] = c.receive_text(msg("manifest", episode={}, blobs=[], content_hash="a" * 64))
    assert ev.code == "unknown_type"


def test_wrong_frame_types_are_errors():
    s = server_open()
    assert s.receive_text(b"bytes")[0].code == "bad_message"
    assert s.receive_bytes("text")[0].code == "bad_message"
    assert s.receive_bytes(memoryview(b"abc"))[0].code == "bad_message"


def test_too_many_errors_close_the_connection():
    s = server_open(P.Limits(max_errors=3))
    for _ in range(3):
        assert not s.receive_text("nope")[0].fatal
    [ev] = s.receive_text("nope")
    assert ev.code == "too_many_errors" and ev.fatal and s.close_code == P.CLOSE_POLICY


def test_an_internal_bug_is_reported_not_raised(monkeypatch):
    s = server_open()
    monkeypatch.setattr(s, "_on_message", lambda *a: 1 / 0)
    [ev] = s.receive_text(msg("list_episodes"))
    assert ev.code == "internal" and "ZeroDivisionError" in ev.reason
    monkeypatch.setattr(s, "_on_blob", lambda *a: 1 / 0)
    [ev] = s.receive_bytes(P.encode_blob(sha(b"x"), b"x"))
    assert ev.code == "internal"


# ---------------------------------------------------------------- upload
def test_upload_conversation(store):
    ep = make_episode(store, 3)
    c, s = pair()
    d = ep.to_dict()
    digest = c.upload(d, ref="m1")
    [m] = deliver(c, s)
    assert isinstance(m, P.ManifestReceived)
    assert (m.episode_id, m.revision, m.content_hash, m.ref) == (ep.id, 0, digest, "m1")
    assert set(m.blobs) == ep.blob_hashes()
    missing = sorted(ep.blob_hashes())[:2]
    s.need(m, missing)
    assert s.pending_uploads() == [ep.id]
    [need] = deliver(s, c)
    assert need == P.BlobsNeeded(ep.id, 0, tuple(missing))
    c.send_blob(missing[0], store.get_blob(missing[0]))
    [b] = deliver(c, s)
    assert isinstance(b, P.BlobReceived) and b.episode_ids == (ep.id,) and sha(b.data) == missing[0]
    c.send_blob(missing[1], store.get_blob(missing[1]))
    b, done = deliver(c, s)
    assert done == P.UploadComplete(ep.id, 0, digest, d, "m1") and s.pending_uploads() == []
    s.ack(ep.id, 0, digest, "stored", ref="m1")
    [ack] = deliver(s, c)
    assert ack == P.Acked(ep.id, 0, digest, "stored")


def test_a_blob_needed_by_two_uploads_completes_both(store):
    a, b = make_episode(store, 1), make_episode(store, 1)
    shared = store.put_blob(screenshot_png(label="shared"))
    for ep in (a, b):
        ep.steps[0].observation.screenshot = shared
    s = server_open()
    ms = []
    for ep in (a, b):
        d = ep.to_dict()
        [m] = s.receive_text(msg("manifest", episode=d, blobs=[shared], content_hash=P.content_hash(d)))
        s.need(m, [shared])
        ms.append(m)
    events = s.receive_bytes(P.encode_blob(shared, store.get_blob(shared)))
    assert events[0].episode_ids == tuple(sorted([a.id, b.id]))
    assert {e.episode_id for e in events[1:]} == {a.id, b.id}


def test_a_new_manifest_replaces_a_half_sent_one(store):
    ep = make_episode(store, 2)
    s = server_open()
    d = ep.to_dict()
    hs = sorted(ep.blob_hashes())
    [m] = s.receive_text(msg("manifest", episode=d, blobs=hs, content_hash=P.content_hash(d)))
    s.need(m, hs)
    s.need(m, hs[:1])  # resent manifest: the server now lacks only one
    [b, done] = s.receive_bytes(P.encode_blob(hs[0], store.get_blob(hs[0])))
    assert isinstance(done, P.UploadComplete)
    [ev] = s.receive_bytes(P.encode_blob(hs[1], store.get_blob(hs[1])))
    assert ev.code == "unexpected_blob"  # no longer wanted


def test_need_with_nothing_missing_is_a_usage_error(store):
    s = server_open()
    d = make_episode(store, 1).to_dict()
    [m] = s.receive_text(msg("manifest", episode=d, blobs=sorted({d["steps"][0]["observation"]["screenshot"]}),
                             content_hash=P.content_hash(d)))
    with pytest.raises(P.ProtocolUsageError):
        s.need(m, [])


def test_bad_manifests(store):
    ep = make_episode(store, 2)
    d = ep.to_dict()
    hs = sorted(ep.blob_hashes())
    s = server_open(P.Limits(max_blobs_per_manifest=1))
    assert s.receive_text(msg("manifest", episode=d, blobs=hs, content_hash=P.content_hash(d)))[0].code == "too_large"
    s = server_open()
    ev = s.receive_text(msg("manifest", episode=d, blobs=hs, content_hash="0" * 64))[0]
    assert ev.code == "bad_manifest" and "content_hash" in ev.reason
    ev = s.receive_text(msg("manifest", episode=d, blobs=hs[:1], content_hash=P.content_hash(d)))[0]
    assert ev.code == "bad_manifest" and "blob list" in ev.reason
    bad = {**d, "kind": "dream"}
    ev = s.receive_text(msg("manifest", episode=bad, blobs=hs, content_hash=P.content_hash(bad)))[0]
    assert ev.code == "bad_episode" and "dream" in ev.reason
    assert sent(s)[-1]["detail"] == {"episode_id": ep.id}
    bad = {**d, "id": ""}
    ev = s.receive_text(msg("manifest", episode=bad, blobs=hs, content_hash=P.content_hash(bad)))[0]
    assert ev.code == "bad_episode"
    bad = {**d, "steps": [{"index": "x"}]}
    ev = s.receive_text(msg("manifest", episode=bad, blobs=[], content_hash=P.content_hash(bad)))[0]
    assert ev.code == "bad_episode"
    bad = {**d, "revision": -1}  # it could be stored but never acknowledged (acks take revisions >= 0)
    ev = s.receive_text(msg("manifest", episode=bad, blobs=hs, content_hash=P.content_hash(bad)))[0]
    assert ev.code == "bad_episode" and "revision must be a non-negative integer, got -1" in ev.reason


def test_unexpected_and_corrupt_blobs():
    s = server_open()
    [ev] = s.receive_bytes(P.encode_blob(sha(b"hi"), b"hi"))
    assert ev.code == "unexpected_blob" and sent(s)[0]["detail"] == {"hash": sha(b"hi")}
    [ev] = s.receive_bytes(b"TDB\x01" + bytes.fromhex(sha(b"hi")) + b"ho")
    assert ev.code == "hash_mismatch" and not s.closed


def test_client_side_needs_acks_and_errors():
    c, s = pair()
    h = "b" * 64
    s.send("need", episode_id="e", revision=1, hashes=[h])
    s.ack("e", 1, h, "duplicate")
    s.error("forbidden", "not yours", ref="m1", detail={"episode_id": "e"})
    need, ack, err = deliver(s, c)
    assert need == P.BlobsNeeded("e", 1, (h,)) and ack.status == "duplicate"
    assert err == P.ErrorReceived("forbidden", "not yours", "m1", False, {"episode_id": "e"})


def test_client_upload_and_requests(store):
    ep = make_episode(store, 1)
    c, _ = pair()
    digest = c.upload(ep.to_dict())
    [m] = sent(c)
    assert m["type"] == "manifest" and m["content_hash"] == digest and m["blobs"] == sorted(ep.blob_hashes())
    ref = c.request("list_episodes", limit=5)
    [r] = sent(c)
    assert r == {"v": 1, "type": "list_episodes", "limit": 5, "ref": ref}
    assert c.request("claim", run_id="x", ref="mine") == "mine"


def test_requested_blob_arrives_and_unrequested_does_not():
    c, s = pair()
    c.get_blob(sha(b"img"))
    s.send_blob(sha(b"img"), b"img")
    [ev] = deliver(s, c)
    assert ev == P.BlobReceived(sha(b"img"), b"img")
    s.send_blob(sha(b"img"), b"img")  # twice: the second was not asked for
    [ev] = deliver(s, c)
    assert ev.code == "unexpected_blob"


def test_generic_messages_reach_both_sides():
    c, s = pair()
    c.request("subscribe", run_id="r", ref="q1")
    [ev] = deliver(c, s)
    assert ev == P.Message("subscribe", {"run_id": "r", "ref": "q1"}) and ev.ref == "q1"
    s.send("ok", what="subscribe", ref="q1")
    [ev] = deliver(s, c)
    assert ev.type == "ok" and ev.ref == "q1"


# ---------------------------------------------------------------- live supervision
def test_proposal_with_screenshot_travels_as_message_then_blob():
    c, s = pair()
    shot = screenshot_png(label="live")
    step = {"thought": "click OK", "action": {"name": "click", "args": {"start_box": [0.1, 0.2]}}}
    digest = c.send_proposal("run1", "p1", step, shot)
    assert digest == sha(shot)
    frames = c.data_to_send()
    assert isinstance(frames[0], str) and isinstance(frames[1], bytes)
    assert s.receive_text(frames[0]) == []  # waits for its screenshot
    [ev] = s.receive_bytes(frames[1])
    assert ev == P.ProposalReceived("run1", "p1", step, digest, shot, None)
    # the server forwards it to a supervisor, naming who proposed
    sup, s2 = pair()
    s2.send_proposal("run1", "p1", step, shot, sender="agent-host")
    [ev] = deliver(s2, sup)
    assert ev.sender == "agent-host" and ev.screenshot_data == shot


def test_proposal_without_screenshot_and_pending_limit():
    s = server_open(P.Limits(max_pending_proposals=1))
    [ev] = s.receive_text(msg("proposal", run_id="r", proposal_id="p0", step={}))
    assert ev.screenshot is None and ev.screenshot_data is None
    assert s.receive_text(msg("proposal", run_id="r", proposal_id="p1", step={}, screenshot="c" * 64)) == []
    [ev] = s.receive_text(msg("proposal", run_id="r", proposal_id="p2", step={}, screenshot="d" * 64))
    assert ev.code == "overloaded"


def test_a_requested_blob_that_is_also_a_screenshot_gives_both_events():
    c, s = pair()
    shot = b"png"
    c.get_blob(sha(shot))
    s.send_proposal("r", "p", {}, shot)
    blob, prop = deliver(s, c)
    assert isinstance(blob, P.BlobReceived) and isinstance(prop, P.ProposalReceived)


def test_server_blob_both_for_upload_and_proposal(store):
    ep = make_episode(store, 1)
    [h] = ep.blob_hashes()
    s = server_open()
    d = ep.to_dict()
    [m] = s.receive_text(msg("manifest", episode=d, blobs=[h], content_hash=P.content_hash(d)))
    s.need(m, [h])
    s.receive_text(msg("proposal", run_id="r", proposal_id="p", step={}, screenshot=h))
    kinds = [type(e).__name__ for e in s.receive_bytes(P.encode_blob(h, store.get_blob(h)))]
    assert kinds == ["ProposalReceived", "BlobReceived", "UploadComplete"]


@pytest.mark.parametrize("decision, step, reason", [
    ("approve", None, None), ("edit", {"thought": "better"}, None), ("reject", None, "wrong button"),
    ("takeover", None, None),
])
def test_decisions_round_trip(decision, step, reason):
    c, s = pair()
    c.send_decision("r", "p", decision, step=step, reason=reason, ref="d1")
    [ev] = deliver(c, s)
    assert ev == P.DecisionReceived("r", "p", decision, step, reason, None, "d1")
    s.send_decision("r", "p", decision, step=step, reason=reason, by="sup")
    [ev] = deliver(s, c)
    assert ev.by == "sup" and ev.decision == decision


def test_edit_needs_its_step():
    c, _ = pair()
    with pytest.raises(P.ProtocolUsageError, match="edited step"):
        c.send_decision("r", "p", "edit")


def test_claims_run_end_and_model_versions():
    c, s = pair()
    s.send("claimed", run_id="r", by="sup")
    s.send("claimed", run_id="r", by=None)
    s.send("run_end", run_id="r", reason="done")
    s.send("model_version", version="v7", info={"step": 100})
    s.send("model_version", version="v8")
    evs = deliver(s, c)
    assert evs == [P.ClaimChanged("r", "sup"), P.ClaimChanged("r", None), P.RunEnded("r", "done"),
                   P.ModelVersion("v7", {"step": 100}), P.ModelVersion("v8", {})]
    c.send("run_end", run_id="r")
    [ev] = deliver(c, s)
    assert ev == P.RunEnded("r", None)


def test_server_errors_are_messages_and_peer_errors_events():
    s = server_open()
    s.error("not_found", "no episode 'x'", ref="q")
    [e] = sent(s)
    assert e == {"v": 1, "type": "error", "code": "not_found", "reason": "no episode 'x'", "ref": "q"}
    [ev] = s.receive_text(msg("error", code="internal", reason="client trouble"))
    assert ev == P.ErrorReceived("internal", "client trouble")


def test_limits_cover_blob_frames():
    lim = P.Limits(max_text=10, max_blob=100)
    assert lim.max_frame == 100 + P.BLOB_HEADER_LEN
