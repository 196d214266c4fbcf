"""Fuzzing the server's message handling: the sans-I/O connection with messages shaped like the
real ones (right types, wrong values, junk fields, bad frames), and a live backend on loopback
fed random frames by an authenticated admin, which must answer with errors and stay up for
everyone else."""
from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect

from agent import protocol as P

_scalars = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats() | st.text(max_size=40)
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                               max_size=3), max_leaves=10)
_field_names = st.sampled_from(sorted({f.rstrip("?") for _, fields in P.MESSAGES.values() for f in fields} | {"ref", "x"}))
_messages = st.builds(lambda t, v, body: json.dumps({"v": v, "type": t, **body}, allow_nan=True),
                      st.sampled_from(sorted(P.MESSAGES)), st.sampled_from([1, 1, 1, 0, 2, "1"]),
                      st.dictionaries(_field_names, _values, max_size=5))
_frames = st.one_of(_messages, st.text(max_size=200), st.binary(max_size=200),
                    st.binary(max_size=100).map(lambda b: P.BLOB_MAGIC + bytes([1]) + b))


@settings(max_examples=400, deadline=None)
@given(frames=st.lists(_frames, max_size=8))
def test_server_connection_answers_any_frames_with_values(frames):
    s = P.ServerConnection(P.Limits())
    s.receive_text(json.dumps({"v": 1, "type": "hello", "token": "t"}))
    s.accept("root", "admin")
    for f in frames:
        events = s.receive_text(f) if isinstance(f, str) else s.receive_bytes(f)  # never raises
        assert isinstance(events, list)
        for out in s.data_to_send():  # whatever it answers is a frame it can send
            if isinstance(out, str):
                assert json.loads(out)["v"] == P.PROTOCOL_VERSION
                out.encode("utf-8")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_frames, min_size=1, max_size=6))
def test_live_backend_survives_random_frames_from_an_admin(backend_for_fuzz, frames):
    backend, token = backend_for_fuzz

    async def run():
        async with connect(backend.url, compression=None) as ws:
            await ws.send(json.dumps({"v": 1, "type": "hello", "token": token}))
            await asyncio.wait_for(ws.recv(), 10)
            for f in frames:
                try:
                    await ws.send(f)
                except Exception:  # the server may have closed on a fatal error
                    break
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 0.2)
            except Exception:  # quiet or closed: either is fine
                pass
        # the server is up and answers a fresh session
        async with connect(backend.url, compression=None) as ws:
            await ws.send(json.dumps({"v": 1, "type": "hello", "token": token}))
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            await ws.send(json.dumps({"v": 1, "type": "user_list", "ref": "r"}))
            while (msg := json.loads(await asyncio.wait_for(ws.recv(), 10)))["type"] != "users":
                pass
        return reply["type"], msg["type"]

    assert asyncio.run(run()) == ("welcome", "users")
