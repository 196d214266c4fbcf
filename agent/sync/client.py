"""The sync client: sends the outbox to a backend, resumably. Qt-free (asyncio).

An upload is: manifest -> the server names the blobs it lacks -> only those are sent -> ack.
Up to `window` episodes are in flight at once. When the connection drops, in-flight episodes go
back to the queue and the client reconnects with exponential backoff; the resent manifest makes
the server ask only for the blobs it still lacks, so a half-sent upload resumes where it was.
Refusals that retrying cannot fix (invalid episode, not yours, corrupt local blob) mark the
episode failed with the server's reason.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from websockets.exceptions import ConnectionClosed

from agent import protocol as P
from agent.redaction import RedactionError
from agent.redaction.review import upload_view
from agent.retry import Backoff
from agent.schema import SchemaError
from agent.storage.store import NotFound, Store
from agent.sync.outbox import QUIET_S, Outbox
from agent.sync.session import Session, SyncError

# Error codes about one episode that a retry would only repeat.
PERMANENT = ("bad_episode", "bad_manifest", "forbidden", "hash_mismatch", "too_large", "conflict", "bad_field")
SYNCED_USER = "sync.user"  # setting: the backend user this store last synced as


def signing_name(store: Store, default: str) -> str:
    """The name a supervisor on this machine signs decisions with: the backend user the store
    syncs as (the backend stores a correction from a supervisor's session only in that user's
    name), else the configured `supervise.name`, else `default`."""
    return store.get_setting(SYNCED_USER) or store.get_setting("supervise.name") or default


@dataclass
class SyncReport:
    sent: list = field(default_factory=list)  # (episode_id, ack status)
    failed: list = field(default_factory=list)  # (episode_id, reason)
    connection_errors: list = field(default_factory=list)
    blobs_sent: int = 0
    bytes_sent: int = 0
    steps_sent: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed


class SyncClient:
    def __init__(self, store: Store, url: str, token: str, *, window: int = 8, ssl=None,
                 reply_timeout: float = 60.0, backoff: Backoff | None = None, alias: str | None = None):
        """`alias`: what the server is known by until its welcome names its id (default the URL;
        agent.sync.outbox.EMBEDDED for the app's built-in backend, whose URL changes every start)."""
        self.store, self.url, self.token, self.ssl = store, url, token, ssl
        self.alias = alias or url
        self.outbox = Outbox(store)
        self.outbox.use_server(self.alias)  # states and acknowledgements from now on are this server's
        self.window, self.reply_timeout = window, reply_timeout
        self.backoff = backoff or Backoff()
        self.on_model_version = None  # fn(version, info)
        self.on_connection = None  # fn(connected: bool, detail: str)

    # ------------------------------------------------------------ one connection's work
    async def upload_pending(self, session: Session, report: SyncReport) -> None:
        """Send everything queued over `session` until the queue is empty or the session ends."""
        queue = self.outbox.pending()
        inflight: dict[str, dict] = {}  # episode id -> {"steps", "sent", "total", "hashes"}
        by_ref: dict[str, str] = {}
        try:
            while queue or inflight:
                while queue and len(inflight) < self.window:
                    eid = queue.pop(0)
                    info = await self._start(session, eid, report)
                    if info is not None:
                        inflight[eid] = info
                        by_ref[info["ref"]] = eid
                if not inflight:
                    continue
                ev = await session.next_event(self.reply_timeout)
                if isinstance(ev, P.BlobsNeeded) and ev.episode_id in inflight:
                    if not await self._send_blobs(session, ev, inflight[ev.episode_id], report):
                        by_ref.pop(inflight.pop(ev.episode_id)["ref"], None)
                elif isinstance(ev, P.Acked) and ev.episode_id in inflight:
                    info = inflight.pop(ev.episode_id)
                    by_ref.pop(info["ref"], None)
                    self.outbox.mark_synced(ev.episode_id, ev.revision, ev.content_hash, ev.status)
                    report.sent.append((ev.episode_id, ev.status))
                    report.steps_sent += info["steps"]
                elif isinstance(ev, P.ErrorReceived):
                    eid = by_ref.get(ev.ref or "") or ev.detail.get("episode_id")
                    if eid not in inflight and ev.detail.get("hash"):
                        eid = next((e for e, i in inflight.items() if ev.detail["hash"] in i["hashes"]), None)
                    if eid in inflight and ev.code in PERMANENT:
                        info = inflight.pop(eid)
                        by_ref.pop(info["ref"], None)
                        self._fail(eid, f"{ev.code}: {ev.reason}", report)
                    else:
                        self._server_event(ev)
                else:
                    self._server_event(ev)
        except (TimeoutError, SyncError, OSError, ConnectionClosed) as e:
            for eid in inflight:  # not acked: back to the queue for the next connection
                self.outbox.mark_queued(eid, f"interrupted: {e or type(e).__name__}")
            if isinstance(e, asyncio.TimeoutError):
                raise SyncError(f"no answer from the server within {self.reply_timeout} s") from None
            if not isinstance(e, SyncError):
                raise SyncError(f"connection lost: {type(e).__name__}: {e}") from None
            raise

    async def _start(self, session: Session, eid: str, report: SyncReport) -> dict | None:
        try:
            ep = self.store.load_episode(eid)
        except NotFound:
            self._fail(eid, "the episode no longer exists locally", report)
            return None
        except SchemaError as e:  # stored before a check that now refuses it: it alone stays behind
            self._fail(eid, f"the local episode does not load: {e}", report)
            return None
        try:  # personal data out: the reviewed, redacted version is what leaves the machine (a run's
            # automatic redaction runs OCR for seconds a frame: off the loop, which keeps the connection alive)
            ep = await asyncio.to_thread(upload_view, self.store, ep)
        except RedactionError as e:  # held, not failed: it goes once its privacy review passes
            self.outbox.mark_held(eid, str(e))
            report.failed.append((eid, str(e)))
            return None
        d = ep.to_dict()
        ref = f"m{session.conn.next_ref()}"
        try:
            digest = session.conn.upload(d, ref=ref)
        except (P.ProtocolUsageError, SchemaError) as e:  # larger than the server's limit, not valid text...
            self._fail(eid, str(e), report)  # this episode fails; the ones queued behind it go on
            return None
        missing_local = [h for h in ep.blob_hashes() if not self.store.has_blob(h)]
        if missing_local:
            session.conn.data_to_send()  # drop the manifest: it could never be completed
            self._fail(eid, f"blob {missing_local[0]} is missing from the local store", report)
            return None
        self.outbox.mark_sending(eid, new_attempt=True)
        await session.flush()
        return {"ref": ref, "digest": digest, "steps": len(ep.steps), "sent": 0, "total": 0, "hashes": set(),
                "blobs": set(ep.blob_hashes())}

    async def _send_blobs(self, session: Session, ev: P.BlobsNeeded, info: dict, report: SyncReport) -> bool:
        """Send the blobs the server needs for this upload. Only blobs the uploaded (redacted)
        episode references leave the machine: a `need` naming any other (an original behind a
        reviewed frame, another episode's) fails the upload and sends nothing; False then."""
        foreign = [h for h in ev.hashes if h not in info["blobs"]]
        if foreign:
            self._fail(ev.episode_id, f"the server asked for blob {foreign[0]}, which this episode's upload does "
                                      "not contain: nothing was sent", report)
            return False
        info["hashes"] = set(ev.hashes)
        paths = [self.store.blob_path(h) for h in ev.hashes]
        info["total"] = sum(p.stat().st_size for p in paths if p.exists())
        self.outbox.progress(ev.episode_id, 0, info["total"])
        for h in ev.hashes:
            data = self.store.get_blob(h)  # from the page cache, mostly: cheaper than a thread hop
            session.conn.send_blob(h, data)
            await session.flush()
            info["sent"] += len(data)
            report.blobs_sent += 1
            report.bytes_sent += len(data)
            self.outbox.progress(ev.episode_id, info["sent"], info["total"])
        return True

    def _fail(self, eid: str, reason: str, report: SyncReport) -> None:
        self.outbox.mark_failed(eid, reason)
        report.failed.append((eid, reason))

    # ------------------------------------------------------------ retrying
    async def sync(self, *, deadline: float | None = None, stop: asyncio.Event | None = None) -> SyncReport:
        """Send the outbox, reconnecting with backoff, until it is empty, `deadline` (a
        time.monotonic() value) passes, or a permanent error (bad token) ends it."""
        report = SyncReport()
        self.outbox.recover()
        self.outbox.requeue_changed(quiet=0)  # edited since this server acknowledged them
        while self.outbox.pending():
            if stop is not None and stop.is_set():
                break
            try:
                session = await Session.open(self.url, self.token, ssl=self.ssl, timeout=min(10.0, self._left(deadline)))
            except SyncError as e:
                report.connection_errors.append(str(e))
                self._connection(False, str(e))
                if e.permanent or not await self._wait(deadline, stop):
                    break
                continue
            self._connected(session)
            try:
                await self.upload_pending(session, report)
            except SyncError as e:
                report.connection_errors.append(str(e))
                self._connection(False, str(e))
                if e.permanent or not await self._wait(deadline, stop):
                    break
            finally:
                await session.close()
        return report

    @staticmethod
    def _left(deadline: float | None) -> float:
        return 10.0 if deadline is None else max(0.1, deadline - time.monotonic())

    async def _wait(self, deadline: float | None, stop: asyncio.Event | None) -> bool:
        """Sleep the next backoff delay; False when that would pass the deadline or stop is set."""
        delay = self.backoff.next()
        if deadline is not None and time.monotonic() + delay > deadline:
            return False
        if stop is None:
            await asyncio.sleep(delay)
            return True
        try:
            await asyncio.wait_for(stop.wait(), delay)
            return False
        except TimeoutError:
            return True

    def _connected(self, session: Session) -> None:
        self.backoff.reset()
        self.outbox.bind(self.alias, session.server_id)
        if self.store.get_setting(SYNCED_USER) != session.user:
            self.store.set_setting(SYNCED_USER, session.user)
        self._connection(True, f"{session.user} ({session.role})")

    def _connection(self, up: bool, detail: str) -> None:
        if self.on_connection:
            self.on_connection(up, detail)

    async def run_forever(self, stop: asyncio.Event, wake: asyncio.Event, poll: float = QUIET_S / 2) -> None:
        """The app's loop, until `stop`: stay connected, so that model versions the backend
        announces arrive as they happen; send the outbox whenever something is queued (`wake`
        is set on submit, and the queue is looked at every `poll` seconds, as are episodes edited
        since the server acknowledged them, re-queued once their edits are quiet); reconnect with backoff.
        A refused token waits for `wake` (new settings restart the bridge anyway)."""
        while not stop.is_set():
            self.outbox.recover()
            try:
                session = await Session.open(self.url, self.token, ssl=self.ssl, timeout=10.0)
            except SyncError as e:
                if not await self._after_failure(e, stop, wake):
                    return
                continue
            self._connected(session)
            try:
                while not stop.is_set():
                    wake.clear()
                    self.outbox.requeue_changed()
                    if self.outbox.pending():
                        await self.upload_pending(session, SyncReport())
                    await self._idle(session, stop, wake, poll)
            except SyncError as e:
                if not await self._after_failure(e, stop, wake):
                    return
            finally:
                await session.close()

    async def _after_failure(self, e: SyncError, stop: asyncio.Event, wake: asyncio.Event) -> bool:
        """Report the failure and wait before the next try; False when stop was set."""
        self._connection(False, str(e))
        if e.permanent:  # retrying the same token cannot help: wait for new settings (or a minute)
            await self._idle(None, stop, wake, 60.0)
            return not stop.is_set()
        return await self._wait(None, stop)

    async def _idle(self, session: Session | None, stop: asyncio.Event, wake: asyncio.Event, timeout: float) -> None:
        """Wait for wake, stop, `timeout`, or (with a session) the server's next event, which
        is handled here: a model version is reported, the session's end raises SyncError."""
        tasks = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())]
        if session is not None:
            tasks.append(asyncio.ensure_future(session.next_event()))
        try:
            done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                if t.done() and not t.cancelled():
                    t.exception()  # retrieved: a session's end is seen again by the next read
                t.cancel()
        if session is not None and tasks[2] in done:
            self._server_event(tasks[2].result())  # result() raises SyncError when the connection has ended

    def _server_event(self, ev) -> None:
        """What the server says outside an upload's exchange: a model version is reported, a
        fatal error ends the session (SyncError); anything else is not the sync client's business."""
        if isinstance(ev, P.ModelVersion) and self.on_model_version:
            self.on_model_version(ev.version, ev.info)
        elif isinstance(ev, P.ErrorReceived) and ev.fatal:
            raise SyncError(f"the server ended the session: {ev.reason}", code=ev.code,
                            permanent=ev.code in ("auth_failed",))
