"""The backend's websocket server: a thin asyncio wrapper over agent.protocol's ServerConnection.

One handler per connection reads a frame, feeds the protocol, acts on its events (store writes
run on one writer thread, so the event loop never blocks on disk) and queues the replies.
Backpressure: websockets buffers at most `max_queue` incoming frames, the handler reads the next
one only when the last is handled, and each connection's outgoing queue is bounded; a
supervisor too slow to take live proposals is disconnected rather than let memory grow.
Shutdown closes connections (1001), lets every handler finish the event it is on and waits for
the writes in flight before the store closes.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed

from agent import protocol as P
from trainer.backend_store import BackendError, BackendStore, User
from trainer.model_shelf import ModelShelf, client_info

log = logging.getLogger("tandem.backend")
SERVER_NAME = "tandem-backend/1"
REVOCATION_CHECK_S = 1.0  # how stale a session's view of its own token may be
HELLO_TIMEOUT_S = 10.0  # a connection that has not said hello by then is closed
PRE_AUTH_MAX_FRAME = 64 * 1024  # until hello succeeds a frame is a hello: larger ones close the connection
MAX_PENDING_PER_RUN = 8  # open proposals a run keeps (an agent waits on one at a time; watched runs never decide)
MAX_RUNS_PER_SESSION = 32  # runs one connection publishes or subscribes to
SUPERVISOR_ROLES = ("supervisor", "admin")
WRITE_AHEAD = 32 * 2**20  # bytes of received blobs a session may have queued for the disk


@dataclass(eq=False)
class Session:
    ws: object
    conn: P.ServerConnection
    out: asyncio.Queue
    user: User | None = None
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
    pending: dict = field(default_factory=dict)  # proposal id -> (step, screenshot hash, bytes)


class BackendServer:
    def __init__(self, data_dir, host: str = "127.0.0.1", port: int = 8765, *, limits: P.Limits = P.Limits(),
                 ssl_context=None, out_queue: int = 64, max_queue: int = 4, models: dict | None = None):
        self.store = BackendStore(data_dir)
        self.models = ModelShelf(self.store, **(models or {}))  # readers, max_bytes, endpoint
        self._announced: str | None = None  # the latest model version the sweep has told clients about
        self.host, self.port, self.limits, self.ssl = host, port, limits, ssl_context
        self.out_queue, self.max_queue = out_queue, max_queue
        self.sessions: set[Session] = set()
        self.runs: dict[str, Run] = {}
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="backend-writer")
        self._inflight: set[asyncio.Future] = set()
        self._server = None
        self._sweeper = None
        self.stats = {"connections": 0, "acks": 0, "errors": 0, "blobs": 0, "blob_bytes": 0}

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> int:
        self._server = await serve(
            self._handle, self.host, self.port, ssl=self.ssl, compression=None,
            # the full frame size only once a session is authenticated (_hello): 30 anonymous connections
            # sending 60 MB frames held 760 MB before
            max_size=PRE_AUTH_MAX_FRAME, max_queue=self.max_queue, close_timeout=3,
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
            now = time.monotonic()
            for s in [s for s in self.sessions if s.user is None and not s.dropped and now - s.opened > HELLO_TIMEOUT_S]:
                s.dropped = True
                asyncio.get_running_loop().create_task(s.ws.close(1008, "no hello"))
            authed = [s for s in self.sessions if s.user is not None and not s.dropped]
            if not authed:
                continue
            try:
                valid = await self._io(self.store.sessions_still_valid, [s.user for s in authed])
            except Exception as e:  # noqa: BLE001 - a store hiccup must not end the sweeper
                log.error("revocation sweep failed: %s", e)
                continue
            for s, ok in zip(authed, valid):
                if not ok:
                    self._cut(s, f"the token of user {s.user.name!r} was revoked")

    async def _tell_new_model(self) -> None:
        """A model recorded in the store by another process (a flywheel run on this data folder)
        is pushed to the connected clients, as one announced over the wire is."""
        try:
            latest = await self._io(self.store.latest_model)
        except Exception as e:  # noqa: BLE001 - a store hiccup must not end the sweeper
            log.error("model check failed: %s", e)
            return
        if latest and latest[0] != self._announced:
            self.announce_model(*latest)

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
        s = Session(ws, P.ServerConnection(self.limits), asyncio.Queue(self.out_queue))
        self.sessions.add(s)
        self.stats["connections"] += 1
        writer = asyncio.create_task(self._send_loop(s))
        try:
            async for frame in ws:
                events = s.conn.receive_text(frame) if isinstance(frame, str) else s.conn.receive_bytes(frame)
                for ev in events:
                    await self._event(s, ev)
                await self._flush(s)
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

    async def _send_loop(self, s: Session) -> None:
        while (item := await s.out.get()) is not None:
            try:
                await s.ws.send(item)
            except ConnectionClosed:
                s.dropped = True

    async def _flush(self, s: Session) -> None:
        for item in s.conn.data_to_send():
            await s.out.put(item)  # waits when the peer does not read: backpressure

    def _push(self, s: Session) -> None:
        """Queue frames for a session other than the one being handled, without waiting on it."""
        if s.dropped:
            s.conn.data_to_send()
            return
        for item in s.conn.data_to_send():
            try:
                s.out.put_nowait(item)
            except asyncio.QueueFull:
                s.dropped = True
                log.warning("dropping %s: it does not keep up with live messages", s.user and s.user.name)
                asyncio.get_running_loop().create_task(s.ws.close(1013, "too slow to receive live messages"))
                return

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
        ingest (queued later) finds its blobs written. Bounded by WRITE_AHEAD bytes per session."""
        fut = self._write_soon("blob write", self.store.put_blob, data, s.user)
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
        s.ws.protocol.max_message_size = self.limits.max_frame + 1024
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
        run.pending[ev.proposal_id] = (ev.step, ev.screenshot, ev.screenshot_data, s.user.name)
        while len(run.pending) > MAX_PENDING_PER_RUN:  # only the newest are kept for late subscribers; a watched
            del run.pending[next(iter(run.pending))]  # run's proposals are never decided (131 -> 803 MB before)
        for sub in list(run.subscribers):
            if not sub.dropped:
                sub.conn.send_proposal(ev.run_id, ev.proposal_id, ev.step, ev.screenshot_data, sender=s.user.name)
                self._push(sub)

    def _decision(self, s: Session, ev: P.DecisionReceived) -> None:
        self._require(s, SUPERVISOR_ROLES, "decide on proposals")
        run = self.runs.get(ev.run_id)
        if run is None or run.claimer is not s:
            raise BackendError("bad_state", f"claim run {ev.run_id} before deciding on its proposals")
        if ev.proposal_id not in run.pending:
            raise BackendError("not_found", f"run {ev.run_id} has no open proposal {ev.proposal_id}")
        proposed, _, _, publisher = run.pending.pop(ev.proposal_id)
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
