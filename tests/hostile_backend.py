"""A hostile backend for tests: a websockets server on loopback that speaks the real sync protocol
(agent.protocol's ServerConnection does the handshake and reads what the client sends) and
answers as the test scripts it, with frames no real backend would send.

    with HostileBackend(answer) as hb:      # answer(event) -> frames to send back (str or bytes)
        pull_model(hb.url, "any-token", dest)
    hb.asked    # the client's requests and manifests, in order
    hb.blobs    # hashes of the blob frames the client sent
"""
from __future__ import annotations

import asyncio
import json
import threading

from websockets.asyncio.server import serve

from agent import protocol as P
from agent.protocol.peers import ServerConnection


def frame(mtype: str, **fields) -> str:
    """A control message as a hostile server writes it: the fields are not checked."""
    return json.dumps({"v": P.PROTOCOL_VERSION, "type": mtype, **fields})


class HostileBackend:
    def __init__(self, answer, role: str = "supervisor", greeting=()):
        self.answer, self.role, self.greeting = answer, role, list(greeting)  # greeting: frames after welcome
        self.asked: list = []  # P.Message and P.ManifestReceived events from the client
        self.blobs: list[str] = []
        self._ready = threading.Event()
        self.port = 0

    async def _handle(self, ws) -> None:
        conn = ServerConnection()
        async for data in ws:
            if isinstance(data, bytes):
                digest, _ = P.decode_blob(data)
                self.blobs.append(digest)
                continue
            out = []
            for ev in conn.receive_text(data):
                if isinstance(ev, P.HelloReceived):
                    conn.accept("mallory", self.role, "hostile")
                    out += self.greeting
                elif isinstance(ev, (P.Message, P.ManifestReceived)):
                    self.asked.append(ev)
                    out += self.answer(ev) or []
            for item in conn.data_to_send() + out:
                await ws.send(item)

    async def _main(self) -> None:
        async with serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._stop = asyncio.Event()
            self._ready.set()
            await self._stop.wait()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def __enter__(self) -> HostileBackend:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self.thread.start()
        assert self._ready.wait(10), "the hostile backend did not start"
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)


def model_server(version: str, manifest: dict, chunks: dict[str, bytes], *, chunk=None):
    """answer() of a backend that offers one model as `version` (any string) with `manifest` (any
    object) and serves `chunks` by hash; chunk(digest) -> frames replaces how a chunk is answered
    (silence, a forged frame)."""
    def answer(ev):
        if isinstance(ev, P.Message) and ev.type == "get_model":
            return [frame("model", version=version, info={}, manifest=manifest, ref=ev.ref)]
        if isinstance(ev, P.Message) and ev.type == "get_model_chunk":
            h = ev.body["hash"]
            return chunk(h) if chunk else [P.encode_blob(h, chunks[h])]
        return []
    return answer
