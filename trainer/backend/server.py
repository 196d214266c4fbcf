"""The backend's websocket server: a thin asyncio wrapper over agent.protocol's ServerConnection.

One handler per connection reads a frame, feeds the protocol, acts on its events (store writes
run on one writer thread, so the event loop never blocks on disk) and queues the replies.
Memory is budgeted per connection and server-wide (trainer.backend.ws_budget.Budgets): incoming frames are
limited by kind and reserved in bytes before they are read (trainer.backend.ws_budget), replies are queued
against a send budget in bytes (the handler reads on only when its replies fit; a connection
whose replies do not move for `send_stall_s` is closed, and one too slow for live messages is
cut at once), and open proposals' screenshots have their own budget (the oldest give theirs up).
Shutdown closes connections (1001), lets every handler finish the event it is on and waits for
the writes in flight before the store closes.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import functools
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from agent import protocol as P
from trainer.backend.model_shelf import ModelShelf, client_info
from trainer.backend.store import BackendError, BackendStore, User
from trainer.backend.ws_budget import DEFAULT_BUDGETS, BudgetedConnection, Budgets, ReadAhead

log = logging.getLogger("tandem.backend")
SERVER_NAME = "tandem-backend/1"
REVOCATION_CHECK_S = 1.0  # how stale a session's view of its own token may be
HELLO_TIMEOUT_S = 10.0  # a connection that has not said hello by then is closed
CLOSE_TOO_SLOW = 1013  # a connection that does not take what it is sent ("try again later")
CLOSE_TIMEOUT_S = 3.0  # how long a closing handshake may take before the TCP connection is cut
MAX_PENDING_PER_RUN = 8  # open proposals a run keeps (an agent waits on one at a time; watched runs never decide)
MAX_RUNS_PER_SESSION = 32  # runs one connection publishes or subscribes to
SUPERVISOR_ROLES = ("supervisor", "admin")
WRITE_AHEAD = 32 * 2**20  # bytes of received blobs a session may have queued for the disk
TRIM_AFTER = 16 * 2**20  # bytes received and sent since the last trim that make the next sweep trim


def _malloc_trim():
    """glibc keeps freed memory of big frames in its arenas; malloc_trim(0) gives it back to the OS
    (None elsewhere)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


MALLOC_TRIM = _malloc_trim()


@dataclass(eq=False)
class Session:
    ws: object
    conn: P.ServerConnection
    out: asyncio.Queue
    user: User | None = None
    out_bytes: int = 0  # of the frames queued for it, the one being sent included
    sent_at: float = field(default_factory=time.monotonic)  # when its queued frames last moved
    buffered: int = 0  # the transport's write buffer at the last sweep
    frame_cost: int = 0  # read-ahead bytes of the message being handled (trainer.backend.ws_budget)
    shot_bytes: int = 0  # screenshots of the open proposals it published
    checked_at: float = 0.0
    runs: set = field(default_factory=set)  # run ids this session subscribes to
    writes: list = field(default_factory=list)  # (future, bytes) of blob writes in flight
    tasks: set = field(default_factory=set)  # ingest-and-ack tasks in flight
    dropped: bool = False
    opened: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Run:
    """A live run: the agent's session publishes proposals, supervisors subscribe, one decides."""

    run_id: str
    publisher: Session | None = None
    subscribers: set = field(default_factory=set)
    claimer: Session | None = None
    pending: dict = field(default_factory=dict)  # proposal id -> (step, screenshot hash, bytes or None, sender)


class BackendServer:
    def __init__(self, data_dir, host: str = "127.0.0.1", port: int = 8765, *, limits: P.Limits = P.DEFAULT_LIMITS,
                 ssl_context=None, budgets: Budgets = DEFAULT_BUDGETS, max_queue: int = 4, models: dict | None = None):
        self.store = BackendStore(data_dir)
        self.models = ModelShelf(self.store, **(models or {}))  # readers, max_bytes, endpoint
        self._announced: str | None = None  # the latest model version the sweep has told clients about
        self.host, self.port, self.limits, self.ssl = host, port, limits, ssl_context
        self.budgets, self.max_queue = budgets, max_queue
        self.read_ahead = ReadAhead(budgets)
        self.out_bytes = 0  # queued for all connections
        self._moved: asyncio.Event | None = None  # set when queued frames were sent or dropped
        self._shots: OrderedDict = OrderedDict()  # (run id, proposal id) -> (publisher, bytes), oldest first
        self.shot_bytes = 0
        self._moved_bytes = 0  # received and sent since the last malloc_trim
        self.sessions: set[Session] = set()
        self.runs: dict[str, Run] = {}
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="backend-writer")
        self._inflight: set[asyncio.Future] = set()
        self._server = None
        self._sweeper = None
        self.stats = {"connections": 0, "acks": 0, "errors": 0, "blobs": 0, "blob_bytes": 0}

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        self._moved = asyncio.Event()
        self._server = await serve(
            self._handle, self.host, self.port, ssl=self.ssl, compression=None, max_queue=self.max_queue,
            close_timeout=CLOSE_TIMEOUT_S,  # frame limits: BudgetedConnection (64 KiB until hello, then by kind)
            create_connection=functools.partial(BudgetedConnection, read_ahead=self.read_ahead),
        )
        self.port = self._server.sockets[0].getsockname()[1]
        latest = await self._io(self.store.latest_model)
        self._announced = latest[0] if latest else None
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return self.port

    async def _sweep(self) -> None:
        """Every REVOCATION_CHECK_S: cut sessions whose token was revoked or replaced by any route
        (the protocol, `backend user revoke` from another process), idle ones included, so a
        revoked supervisor stops receiving live screenshots at once; and close connections that
        never said hello."""
        while True:
            await asyncio.sleep(REVOCATION_CHECK_S)
            await self._tell_new_model()
            if self._moved_bytes > TRIM_AFTER and MALLOC_TRIM is not None:
                self._moved_bytes = 0
                MALLOC_TRIM(0)
            now = time.monotonic()
            for s in [s for s in self.sessions if not s.dropped]:
                self._check_stall(s, now)
            for s in [s for s in self.sessions if s.user is None and not s.dropped and now - s.opened > HELLO_TIMEOUT_S]:
                s.dropped = True
                asyncio.get_running_loop().create_task(s.ws.close(1008, "no hello"))
            authed = [s for s in self.sessions if s.user is not None and not s.dropped]
            if not authed:
                continue
            try:
                valid = await self._io(self.store.sessions_still_valid, [s.user for s in authed])
            except Exception as e:  # a store hiccup must not end the sweeper
                log.error("revocation sweep failed: %s", e)
                continue
            for s, ok in zip(authed, valid, strict=True):
                if not ok:
                    self._cut(s, f"the token of user {s.user.name!r} was revoked")

    async def _tell_new_model(self) -> None:
        """A model recorded in the store by another process (a flywheel run on this data folder)
        is pushed to the connected clients, as one announced over the wire is."""
        try:
            latest = await self._io(self.store.latest_model)
        except Exception as e:  # a store hiccup must not end the sweeper
            log.error("model check failed: %s", e)
            return
        if latest and latest[0] != self._announced:
            self.announce_model(*latest)

    def _check_stall(self, s: Session, now: float) -> None:
        """A connection whose queued frames have not moved for `send_stall_s` has stopped reading:
        close it, which frees what was queued for it (70 unread 16 MB blobs pinned 1.1 GB before)."""
        buffered = s.ws.transport.get_write_buffer_size()
        if s.out_bytes == 0 or buffered < s.buffered:
            s.sent_at = now
        s.buffered = buffered
        if now - s.sent_at > self.budgets.send_stall_s:
            self._drop(s, f"stopped reading: {s.out_bytes} bytes queued for it did not move in {self.budgets.send_stall_s:g} s")

    def _drop(self, s: Session, reason: str) -> None:
        """End a connection that does not take what it is sent."""
        s.dropped = True
        log.warning("dropping %s: %s", s.user and s.user.name, reason)
        asyncio.get_running_loop().create_task(_close_or_cut(s.ws, CLOSE_TOO_SLOW, reason))
        self._moved.set()  # its handler may be waiting for room

    def _cut(self, s: Session, reason: str) -> None:
        """End another session now: tell it why, then close."""
        s.conn.reject(reason)
        self._push(s)
        s.dropped = True
        asyncio.get_running_loop().create_task(s.ws.close(1008, "token revoked"))

    async def stop(self) -> None:
        """Stop accepting, close every connection, finish the writes in flight, close the store."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
            try:  # a peer that does not read blocks its closing handshake behind the frames queued for it
                await asyncio.wait_for(asyncio.shield(self._server.wait_closed()), CLOSE_TIMEOUT_S + 1)
            except TimeoutError:
                for s in list(self.sessions):
                    s.ws.transport.abort()
                await self._server.wait_closed()
        while self._inflight:
            await asyncio.wait(list(self._inflight))
        self._writer.shutdown(wait=True)
        self.store.close()

    async def serve_until(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    async def _io(self, fn, *args):
        """Run a store call on the writer thread; shielded so shutdown never cuts a write in half."""
        fut = asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)
        self._inflight.add(fut)
        fut.add_done_callback(self._inflight.discard)
        return await asyncio.shield(fut)

    # ------------------------------------------------------------ one connection
    async def _handle(self, ws) -> None:
        s = Session(ws, P.ServerConnection(self.limits), asyncio.Queue())
        ws.expects_blob = s.conn.expects_blob
        self.sessions.add(s)
        self.stats["connections"] += 1
        writer = asyncio.create_task(self._send_loop(s))
        try:
            async for frame in ws:
                await self._frame(s, frame)
                del frame  # an idle connection holds nothing of its last message
                if s.conn.closed or s.dropped:
                    break
        except ConnectionClosed:
            pass
        finally:
            self._forget(s)
            if s.tasks:  # episodes being stored: their acks go out before the connection ends
                await asyncio.wait(list(s.tasks))
            await s.out.put(None)
            await writer
            if s.conn.closed:
                closing = asyncio.create_task(ws.close(s.conn.close_code or 1008, s.conn.close_reason))
                try:  # discard what the peer still sends, so that its close frame can be read
                    async for _ in ws:
                        pass
                except ConnectionClosed:
                    pass
                await closing

    async def _frame(self, s: Session, frame: str | bytes) -> None:
        s.frame_cost = s.ws.take()
        self._moved_bytes += len(frame)
        events = s.conn.receive_text(frame) if isinstance(frame, str) else s.conn.receive_bytes(frame)
        del frame
        for ev in events:
            await self._event(s, ev)
        s.ws.release(s.frame_cost)  # a blob's bytes are released once written (_write_blob)
        s.frame_cost = 0
        await self._flush(s)

    async def _send_loop(self, s: Session) -> None:
        while (item := await s.out.get()) is not None:
            try:
                await s.ws.send(item)
            except ConnectionClosed:
                s.dropped = True
            finally:
                self._moved_bytes += len(item)
                s.out_bytes -= len(item)
                self.out_bytes -= len(item)
                s.sent_at = time.monotonic()
                del item
                self._moved.set()

    def _enqueue(self, s: Session) -> int:
        """Queue the session's frames; returns the bytes it had queued before."""
        before = s.out_bytes
        if before == 0:
            s.sent_at = time.monotonic()
        for item in s.conn.data_to_send():
            s.out.put_nowait(item)
            s.out_bytes += len(item)
            self.out_bytes += len(item)
        return before

    async def _flush(self, s: Session) -> None:
        """Queue the replies of the session being handled, then wait until its queue (and the
        server's) is back under the send budget: the handler reads on only then (backpressure)."""
        if s.dropped:
            s.conn.data_to_send()
            return
        self._enqueue(s)
        b = self.budgets
        while not s.dropped and s.out_bytes > 0 and (s.out_bytes > b.send or self.out_bytes > b.send_total):
            self._moved.clear()
            await self._moved.wait()

    def _push(self, s: Session) -> None:
        """Queue frames for a session other than the one being handled, without waiting on it:
        one that has frames waiting and would go over the send budget is dropped instead."""
        if s.dropped:
            s.conn.data_to_send()
            return
        before = self._enqueue(s)
        if before and (s.out_bytes > self.budgets.send or self.out_bytes > self.budgets.send_total):
            self._drop(s, "too slow to receive live messages")

    # ------------------------------------------------------------ events
    async def _event(self, s: Session, ev) -> None:
        try:
            if isinstance(ev, P.HelloReceived):
                await self._hello(s, ev)
                return
            if isinstance(ev, P.ProtocolError):
                self.stats["errors"] += 1
                return
            if isinstance(ev, P.ErrorReceived):
                log.info("client %s reports %s: %s", s.user and s.user.name, ev.code, ev.reason)
                return
            if not await self._still_valid(s):
                return
            if isinstance(ev, P.ManifestReceived):
                await self._manifest(s, ev)
            elif isinstance(ev, P.BlobReceived):
                await self._write_blob(s, ev.data)
            elif isinstance(ev, P.UploadComplete):
                self._ingest_soon(s, ev.episode, ev.content_hash, ev.ref)
            elif isinstance(ev, P.ProposalReceived):
                self._proposal(s, ev)
            elif isinstance(ev, P.DecisionReceived):
                self._decision(s, ev)
            elif isinstance(ev, P.RunEnded):
                self._run_end(s, ev.run_id, ev.reason)
            elif isinstance(ev, P.Message):
                await self._request(s, ev)
        except BackendError as e:
            s.conn.error(e.code, str(e), ref=getattr(ev, "ref", None))
        except Exception as e:  # one bad request must not end the server
            log.exception("handling %r", type(ev).__name__)
            s.conn.error("internal", f"{type(e).__name__}: {e}", ref=getattr(ev, "ref", None))

    async def _write_blob(self, s: Session, data: bytes) -> None:
        """Queue the write and read on: the writer thread runs jobs in order, so the episode's
        ingest (queued later) finds its blobs written. Bounded by WRITE_AHEAD bytes per session,
        and by the read-ahead budget, which gets the frame's bytes back once they are on disk."""
        fut = self._write_soon("blob write", self.store.put_blob, data, s.user)
        cost, s.frame_cost = s.frame_cost, 0
        fut.add_done_callback(lambda _: s.ws.release(cost))
        s.writes.append((fut, len(data)))
        self.stats["blobs"] += 1
        self.stats["blob_bytes"] += len(data)
        while s.writes and (s.writes[0][0].done() or sum(n for _, n in s.writes) > WRITE_AHEAD):
            await asyncio.shield(s.writes.pop(0)[0])

    def _write_soon(self, what: str, fn, *args) -> asyncio.Future:
        """Queue a store write on the writer thread without waiting for it; a failure is logged.
        The thread runs jobs in order, so a later read or ingest sees it."""
        fut = asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)
        self._inflight.add(fut)
        fut.add_done_callback(self._inflight.discard)
        fut.add_done_callback(lambda f: f.cancelled() or f.exception() and log.error("%s failed: %s", what, f.exception()))
        return fut

    async def _hello(self, s: Session, ev: P.HelloReceived) -> None:
        try:
            s.user = await self._io(self.store.authenticate, ev.token)
        except BackendError as e:
            s.conn.reject(str(e))
            return
        s.checked_at = time.monotonic()
        s.ws.text_limit, s.ws.binary_limit = self.limits.max_text, self.limits.max_blob + P.BLOB_HEADER_LEN
        s.conn.accept(s.user.name, s.user.role, SERVER_NAME, self.store.server_id)
        latest = await self._io(self.store.latest_model)
        if latest:
            s.conn.send("model_version", version=latest[0], info=client_info(latest[1]))

    async def _still_valid(self, s: Session) -> bool:
        """Re-read the user's token state now and then, so a revocation takes effect."""
        if time.monotonic() - s.checked_at < REVOCATION_CHECK_S:
            return True
        s.checked_at = time.monotonic()
        if (await self._io(self.store.sessions_still_valid, [s.user]))[0]:
            return True
        s.conn.reject(f"the token of user {s.user.name!r} was revoked")
        return False

    def _require(self, s: Session, roles, what: str) -> None:
        if s.user.role not in roles:
            raise BackendError("forbidden", f"role {s.user.role!r} may not {what}")

    async def _manifest(self, s: Session, m: P.ManifestReceived) -> None:
        status = await self._io(self.store.precheck, m.episode_id, m.revision, m.content_hash, s.user, m.episode)
        if status:
            await self._io(self._log_only, m, s.user, status)
            s.conn.ack(m.episode_id, m.revision, m.content_hash, status, ref=m.ref)
            self.stats["acks"] += 1
            return
        missing = await self._io(self.store.missing_blobs, m.blobs, s.user)
        if missing:
            s.conn.need(m, missing)
        else:
            await self._ingest(s, m.episode, m.content_hash, m.ref)

    def _log_only(self, m: P.ManifestReceived, user: User, status: str) -> None:
        self.store.log_ingest(user, m.episode_id, m.revision, m.content_hash, status)

    def _ingest_soon(self, s: Session, episode: dict, digest: str, ref) -> None:
        """Store and ack in a task, so the handler reads the next frames meanwhile (the writer
        thread then commits several episodes behind one disk flush)."""
        task = asyncio.get_running_loop().create_task(self._ingest_and_ack(s, episode, digest, ref))
        s.tasks.add(task)
        task.add_done_callback(s.tasks.discard)

    async def _ingest_and_ack(self, s: Session, episode: dict, digest: str, ref) -> None:
        try:
            await self._ingest(s, episode, digest, ref)
        except BackendError as e:
            s.conn.error(e.code, str(e), ref=ref, detail={"episode_id": episode.get("id")})
        except Exception as e:
            log.exception("ingest of %s", episode.get("id"))
            s.conn.error("internal", f"{type(e).__name__}: {e}", ref=ref, detail={"episode_id": episode.get("id")})
        if not s.dropped:
            await self._flush(s)

    async def _ingest(self, s: Session, episode: dict, digest: str, ref) -> None:
        revision, status = await self._io(self.store.ingest, episode, digest, s.user)
        s.conn.ack(episode["id"], revision, digest, status, ref=ref)
        self.stats["acks"] += 1

    async def _request(self, s: Session, ev: P.Message) -> None:
        b, ref, t = ev.body, ev.ref, ev.type
        if t == "list_episodes":
            items = await self._io(self.store.list_episodes, s.user, b.get("owner"), b.get("limit"))
            s.conn.send("episodes", items=items, ref=ref)
        elif t == "get_episode":
            ep, owner = await self._io(self.store.get_episode, b["episode_id"], s.user)
            s.conn.send("episode", episode=ep, owner=owner, ref=ref)
        elif t == "get_blob":
            try:
                data = await self._io(self.store.get_blob, b["hash"], s.user)
            except BackendError as e:  # the client waits on the hash, so name it
                s.conn.error(e.code, str(e), ref=ref, detail={"hash": b["hash"]})
                return
            s.conn.send_blob(b["hash"], data)
        elif t == "get_model":
            s.conn.send("model", **await self._io(self.models.describe, b.get("version"), s.user), ref=ref)
        elif t == "get_model_chunk":
            try:
                data = await self._io(self.models.chunk, b["version"], b["hash"], s.user)
            except BackendError as e:  # the client waits on the hash, so name it
                s.conn.error(e.code, str(e), ref=ref, detail={"hash": b["hash"]})
                return
            s.conn.send_blob(b["hash"], data)
        elif t in ("subscribe", "unsubscribe", "claim", "release"):
            self._require(s, SUPERVISOR_ROLES, "supervise runs")
            getattr(self, "_" + t)(s, b["run_id"])
            s.conn.send("ok", what=t, ref=ref)
        elif t == "announce_model":
            self._require(s, ("admin",), "announce model versions")
            await self._io(self.store.announce_model, b["version"], b.get("info") or {})
            self.announce_model(b["version"], b.get("info") or {})
            s.conn.send("ok", what=t, ref=ref)
        elif t == "user_add":
            self._require(s, ("admin",), "manage users")
            token = await self._io(self.store.add_user, b["name"], b["role"])
            s.conn.send("user_token", name=b["name"], role=b["role"], token=token, ref=ref)
        elif t == "user_list":
            self._require(s, ("admin",), "manage users")
            users = await self._io(self.store.users)
            s.conn.send("users", items=[{"name": u.name, "role": u.role, "created_at": u.created_at,
                                         "revoked_at": u.revoked_at} for u in users], ref=ref)
        elif t == "user_revoke":
            self._require(s, ("admin",), "manage users")
            await self._io(self.store.revoke_user, b["name"])
            for other in list(self.sessions):  # revocation takes effect at once on this server
                if other.user and other.user.name == b["name"] and other is not s:
                    self._cut(other, f"the token of user {b['name']!r} was revoked")
            s.conn.send("ok", what=t, ref=ref)
        else:
            raise BackendError("unknown_type", f"{t!r} is not a request the server answers")

    # ------------------------------------------------------------ live supervision
    def _run(self, run_id: str) -> Run:
        return self.runs.setdefault(run_id, Run(run_id))

    def _broadcast(self, run: Run, send, exclude=None) -> None:
        for sub in list(run.subscribers) + ([run.publisher] if run.publisher else []):
            if sub is not exclude and not sub.dropped:
                send(sub.conn)
                self._push(sub)

    def _subscribe(self, s: Session, run_id: str, tell_claim: bool = True) -> None:
        if run_id not in s.runs and len(s.runs) >= MAX_RUNS_PER_SESSION:
            raise BackendError("too_large", f"a connection may follow at most {MAX_RUNS_PER_SESSION} runs")
        run = self._run(run_id)
        run.subscribers.add(s)
        s.runs.add(run_id)
        if tell_claim:
            s.conn.send("claimed", run_id=run_id, by=run.claimer.user.name if run.claimer else None)
        for pid, (step, _, data, sender) in run.pending.items():  # a late subscriber sees the open step
            s.conn.send_proposal(run_id, pid, step, data, sender=sender)

    def _unsubscribe(self, s: Session, run_id: str) -> None:
        run = self.runs.get(run_id)
        s.runs.discard(run_id)
        if run:
            run.subscribers.discard(s)
            if run.claimer is s:
                self._release(s, run_id)
            if not run.subscribers and run.publisher is None and not run.pending:
                del self.runs[run_id]  # nobody left: 60k subscribe/leave rounds leaked 37 MB before

    def _claim(self, s: Session, run_id: str) -> None:
        run = self._run(run_id)
        if run.claimer is not None and run.claimer is not s:
            raise BackendError("conflict", f"run {run_id} is already claimed by {run.claimer.user.name}")
        run.claimer = s
        if s not in run.subscribers:
            self._subscribe(s, run_id, tell_claim=False)
        self._broadcast(run, lambda c: c.send("claimed", run_id=run_id, by=s.user.name), exclude=s)
        s.conn.send("claimed", run_id=run_id, by=s.user.name)

    def _release(self, s: Session, run_id: str) -> None:
        run = self.runs.get(run_id)
        if run and run.claimer is s:
            run.claimer = None
            self._broadcast(run, lambda c: c.send("claimed", run_id=run_id, by=None), exclude=s)

    def _proposal(self, s: Session, ev: P.ProposalReceived) -> None:
        if ev.run_id not in self.runs and sum(r.publisher is s for r in self.runs.values()) >= MAX_RUNS_PER_SESSION:
            raise BackendError("too_large", f"a connection may publish at most {MAX_RUNS_PER_SESSION} runs")
        run = self._run(ev.run_id)
        if run.publisher is None:
            run.publisher = s
        elif run.publisher is not s:
            raise BackendError("forbidden", f"run {ev.run_id} is published by another connection")
        self._forget_pending(run, ev.proposal_id)  # the same id again replaces it
        run.pending[ev.proposal_id] = (ev.step, ev.screenshot, ev.screenshot_data, s.user.name)
        if ev.screenshot_data:
            self._keep_shot(s, run, ev.proposal_id, len(ev.screenshot_data))
        while len(run.pending) > MAX_PENDING_PER_RUN:  # only the newest are kept for late subscribers; a watched
            self._forget_pending(run, next(iter(run.pending)))  # run's proposals are never decided (131 -> 803 MB before)
        for sub in list(run.subscribers):
            if not sub.dropped:
                sub.conn.send_proposal(ev.run_id, ev.proposal_id, ev.step, ev.screenshot_data, sender=s.user.name)
                self._push(sub)

    def _keep_shot(self, s: Session, run: Run, pid: str, n: int) -> None:
        """Count an open proposal's screenshot against its publisher's and the server's budget;
        over either, the oldest open proposals give up their screenshots (they stay open, and a
        late subscriber gets them without one). 4 runs x 8 x 32 MB from one agent held 1.1 GB before."""
        self._shots[(run.run_id, pid)] = (s, n)
        s.shot_bytes += n
        self.shot_bytes += n
        older = list(self._shots.items())[:-1]  # the newest stays, even alone over budget
        for key in [k for k, (owner, _) in older if owner is s]:  # first its publisher's own oldest
            if s.shot_bytes <= self.budgets.proposals:
                break
            self._drop_shot(key)
        for key in [k for k, _ in older if k in self._shots]:  # then anyone's oldest
            if self.shot_bytes <= self.budgets.proposals_total:
                break
            self._drop_shot(key)

    def _drop_shot(self, key) -> None:
        run, pid = self.runs[key[0]], key[1]
        step, shot, _, sender = run.pending[pid]
        run.pending[pid] = (step, shot, None, sender)
        self._forget_shot(key)

    def _forget_shot(self, key) -> None:
        owner, n = self._shots.pop(key, (None, 0))
        if owner is not None:
            owner.shot_bytes -= n
            self.shot_bytes -= n

    def _forget_pending(self, run: Run, pid: str) -> None:
        run.pending.pop(pid, None)
        self._forget_shot((run.run_id, pid))

    def _decision(self, s: Session, ev: P.DecisionReceived) -> None:
        self._require(s, SUPERVISOR_ROLES, "decide on proposals")
        run = self.runs.get(ev.run_id)
        if run is None or run.claimer is not s:
            raise BackendError("bad_state", f"claim run {ev.run_id} before deciding on its proposals")
        if ev.proposal_id not in run.pending:
            raise BackendError("not_found", f"run {ev.run_id} has no open proposal {ev.proposal_id}")
        proposed, _, _, publisher = run.pending[ev.proposal_id]
        self._forget_pending(run, ev.proposal_id)
        # recorded before the agent hears it, so the upload of the correction finds it (claims_problem)
        self._write_soon("recording a decision", self.store.record_decision, ev.run_id, ev.proposal_id, proposed,
                         publisher, s.user.name, ev.decision, ev.step)
        self._broadcast(run, lambda c: c.send_decision(ev.run_id, ev.proposal_id, ev.decision, step=ev.step,
                                                       reason=ev.reason, by=s.user.name), exclude=s)
        s.conn.send("ok", what="decision", ref=ev.ref)

    def _run_end(self, s: Session, run_id: str, reason: str | None) -> None:
        run = self.runs.get(run_id)
        if run is None or run.publisher is not s:
            raise BackendError("forbidden", f"run {run_id} is not yours to end")
        self._broadcast(run, lambda c: c.send("run_end", run_id=run_id, reason=reason), exclude=s)
        for sub in run.subscribers:
            sub.runs.discard(run_id)
        for pid in list(run.pending):
            self._forget_pending(run, pid)
        del self.runs[run_id]

    def _forget(self, s: Session) -> None:
        self.sessions.discard(s)
        for run_id in list(s.runs):
            self._unsubscribe(s, run_id)
        for run in list(self.runs.values()):
            if run.publisher is s:
                self._run_end(s, run.run_id, "the agent disconnected")

    def announce_model(self, version: str, info: dict | None = None) -> None:
        """Tell every connected client about a new model version (call on the server's loop)."""
        self._announced = version
        for other in list(self.sessions):
            if other.user and not other.dropped:
                other.conn.send("model_version", version=version, info=client_info(info))
                self._push(other)


async def _close_or_cut(ws, code: int, reason: str) -> None:
    """Close with a reason; if the closing handshake cannot happen within CLOSE_TIMEOUT_S (the
    close frame waits behind frames the peer does not read), cut the TCP connection, which frees
    what was buffered for it."""
    try:
        await asyncio.wait_for(ws.close(code, reason[:120]), CLOSE_TIMEOUT_S)
    except TimeoutError:
        pass
    ws.transport.abort()
