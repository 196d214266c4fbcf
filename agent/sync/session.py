"""One authenticated websocket connection to a backend: a thin asyncio wrapper over
agent.protocol's ClientConnection. Qt-free.

    session = await Session.open("ws://127.0.0.1:8765", token)
    items = (await session.request("list_episodes")).body["items"]
    await session.request("subscribe", run_id="r1")     # supervisors
    ev = await session.next_event()                      # ProposalReceived, DecisionReceived, ...

Replies to a request (matched by `ref`) resolve that request; everything else (upload needs and
acks, live proposals, decisions, claims, model versions, errors without a ref) comes out of
`next_event()` in order.
"""
from __future__ import annotations

import asyncio
import hashlib
import socket

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from agent import protocol as P
from agent.errors import TandemError


class SyncError(TandemError):
    """A sync failure; `permanent` ones (bad token, refused request) are not worth retrying."""

    def __init__(self, reason: str, *, code: str | None = None, permanent: bool = False):
        super().__init__(reason)
        self.code = code
        self.permanent = permanent


class RequestRefused(SyncError):
    """The server answered a request with an error message."""


async def _open_ws(url: str, ssl=None, timeout: float = 10.0, limits: P.Limits = P.DEFAULT_LIMITS):
    try:
        return await connect(url, ssl=ssl, compression=None, max_size=limits.max_frame + 1024,
                             open_timeout=timeout, max_queue=16, ping_interval=20, ping_timeout=60)
    except InvalidURI as e:
        raise SyncError(f"not a websocket URL: {url!r} ({e})", permanent=True) from None
    except (TimeoutError, OSError, InvalidHandshake) as e:
        raise SyncError(f"cannot reach {url}: {unreachable_reason(e, timeout)}") from None


def unreachable_reason(e: BaseException, timeout: float) -> str:
    """Why a connection could not be made, as a person reads it (not the exception's repr)."""
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is the server running, and is the port right?)"
    if isinstance(e, socket.gaierror):
        return f"unknown host ({e.strerror or e})"
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return f"no answer within {timeout:g} s"
    if isinstance(e, InvalidHandshake):
        return f"it did not answer as a websocket server ({e})"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e) or type(e).__name__


class Session:
    def __init__(self, ws, conn: P.ClientConnection):
        self.ws, self.conn = ws, conn
        self.user, self.role = conn.user, conn.role
        self.server_id = conn.server_id  # the backend's lasting id; None from a server that names none
        self._events: asyncio.Queue = asyncio.Queue()
        self._waiting: dict[str, asyncio.Future] = {}  # ref -> reply
        self._blobs: dict[str, asyncio.Future] = {}  # hash -> bytes
        self._reader: asyncio.Task | None = None
        self.closed_reason: str | None = None

    @classmethod
    async def open(cls, url: str, token: str, *, ssl=None, timeout: float = 10.0, client: str = "tandem-app") -> Session:
        """Connect and authenticate; SyncError(permanent=True) for a bad token or URL."""
        ws = await _open_ws(url, ssl, timeout)
        conn = P.ClientConnection(token, client)
        try:
            for item in conn.data_to_send():
                await ws.send(item)
            while True:
                frame = await asyncio.wait_for(ws.recv(), timeout)
                events = conn.receive_text(frame) if isinstance(frame, str) else conn.receive_bytes(frame)
                for ev in events:
                    if isinstance(ev, P.Welcome):
                        s = cls(ws, conn)
                        s._reader = asyncio.get_running_loop().create_task(s._read())
                        return s
                    if isinstance(ev, (P.ErrorReceived, P.ProtocolError)):
                        code = ev.code
                        await ws.close()
                        raise SyncError(f"the server refused us: {ev.reason}", code=code,
                                        permanent=code in ("auth_failed", "auth_required", "bad_version"))
        except ConnectionClosed as e:
            raise SyncError(f"the connection closed during the handshake: {e}") from None
        except TimeoutError:
            await ws.close()
            raise SyncError(f"no answer to hello from {url} within {timeout} s") from None

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                events = self.conn.receive_text(frame) if isinstance(frame, str) else self.conn.receive_bytes(frame)
                for ev in events:
                    self._dispatch(ev)
                await self.flush()  # the protocol's error replies, if the server sent garbage
                if self.conn.closed:
                    break
        except ConnectionClosed as e:
            self.closed_reason = f"connection closed: {e}"
        finally:
            if self.closed_reason is None:
                self.closed_reason = self.conn.close_reason or "connection closed"
            err = SyncError(self.closed_reason)
            for fut in [*self._waiting.values(), *self._blobs.values()]:
                if not fut.done():
                    fut.set_exception(err)
            self._events.put_nowait(err)

    def _dispatch(self, ev) -> None:
        ref = getattr(ev, "ref", None)
        if ref is not None and ref in self._waiting and isinstance(ev, (P.Message, P.ErrorReceived)):
            fut = self._waiting.pop(ref)
            if not fut.done():
                fut.set_result(ev)
            return
        if isinstance(ev, P.ProtocolError) and ev.ref in self._waiting:  # a reply that does not validate
            fut = self._waiting.pop(ev.ref)
            if not fut.done():
                fut.set_exception(SyncError(f"the server's reply is invalid: {ev.reason}", code=ev.code, permanent=True))
            return
        if isinstance(ev, P.ProtocolError) and ev.hash in self._blobs:  # it came, but not as it should
            fut = self._blobs.pop(ev.hash)
            if not fut.done():
                fut.set_exception(SyncError(f"refused what the server sent: {ev.reason}"))
            return
        if isinstance(ev, P.BlobReceived) and ev.hash in self._blobs:
            fut = self._blobs.pop(ev.hash)
            if not fut.done():
                fut.set_result(ev.data)
            return
        if isinstance(ev, P.ErrorReceived) and ev.detail.get("hash") in self._blobs:
            fut = self._blobs.pop(ev.detail["hash"])
            fut.set_exception(RequestRefused(ev.reason, code=ev.code, permanent=True))
            return
        self._events.put_nowait(ev)

    def _check_open(self) -> None:
        if self.conn.closed or self.closed_reason is not None:
            raise SyncError(self.closed_reason or self.conn.close_reason or "the session has ended")

    async def flush(self) -> None:
        """Send what the protocol queued (waits while the socket's buffer is full: backpressure)."""
        for item in self.conn.data_to_send():
            await self.ws.send(item)

    async def next_event(self, timeout: float | None = None):
        """The next unsolicited event; raises SyncError when the connection has ended."""
        ev = await asyncio.wait_for(self._events.get(), timeout)
        if isinstance(ev, SyncError):
            self._events.put_nowait(ev)  # every later call sees the end too
            raise ev
        return ev

    async def request(self, mtype: str, timeout: float = 30.0, **fields) -> P.Message:
        """Send a request and wait for its reply; RequestRefused when the server says no."""
        self._check_open()
        ref = self.conn.next_ref()
        fut = asyncio.get_running_loop().create_future()
        self._waiting[ref] = fut
        self.conn.request(mtype, ref=ref, **fields)
        await self.flush()
        try:
            reply = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._waiting.pop(ref, None)
            raise SyncError(f"no reply to {mtype} from the server within {timeout:g} s") from None
        if isinstance(reply, P.ErrorReceived):
            raise RequestRefused(f"{mtype}: {reply.reason}", code=reply.code, permanent=True)
        return reply

    async def get_blob(self, digest: str, timeout: float = 60.0) -> bytes:
        return await self._fetch(digest, lambda: self.conn.get_blob(digest), timeout)

    async def get_model_chunk(self, version: str, digest: str, timeout: float = 120.0) -> bytes:
        return await self._fetch(digest, lambda: self.conn.get_model_chunk(version, digest), timeout,
                                 f"chunk {digest} of model {version}")

    async def _fetch(self, digest: str, ask, timeout: float, what: str = "") -> bytes:
        """The blob asked for; SyncError (worth a retry) naming it when it has not come in `timeout`,
        or came with bytes that do not match its hash."""
        self._check_open()
        fut = asyncio.get_running_loop().create_future()
        self._blobs[digest] = fut
        ask()
        await self.flush()
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            self._blobs.pop(digest, None)
            raise SyncError(f"{what or f'blob {digest}'} did not arrive from the server within {timeout:g} s") from None

    # -- live supervision, for the supervise feature
    async def propose(self, run_id: str, proposal_id: str, step: dict, screenshot: bytes | None = None) -> None:
        self._check_open()
        self.conn.send_proposal(run_id, proposal_id, step, screenshot)
        await self.flush()

    async def decide(self, run_id: str, proposal_id: str, decision: str, *, step: dict | None = None,
                     reason: str | None = None) -> P.Message:
        self._check_open()
        ref = self.conn.next_ref()
        fut = asyncio.get_running_loop().create_future()
        self._waiting[ref] = fut
        self.conn.send_decision(run_id, proposal_id, decision, step=step, reason=reason, ref=ref)
        await self.flush()
        reply = await asyncio.wait_for(fut, 30.0)
        if isinstance(reply, P.ErrorReceived):
            raise RequestRefused(f"decision: {reply.reason}", code=reply.code, permanent=True)
        return reply

    async def end_run(self, run_id: str, reason: str | None = None) -> None:
        self._check_open()
        self.conn.send("run_end", run_id=run_id, reason=reason)
        await self.flush()

    async def close(self) -> None:
        await self.ws.close()
        if self._reader:
            await self._reader


def blob_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
