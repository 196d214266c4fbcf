"""Live supervision over the sync connection: the agent's side publishes, supervisors watch.

Qt-free. A `LiveLink` is one authenticated app.sync Session on its own asyncio thread; calls from
other threads go through `call()`; unsolicited events (proposals, decisions, claims, run ends) go
to `on_event(ev)` on the link's thread (a Qt page turns that into a signal).

    pub = RunPublisher(url, token).start()          # the machine where the agent acts
    loop = AgentLoop(..., gate=Gate("all", pub.supervisor)); pub.supervisor.stop_event = loop.stop_event
    ... loop.run(...); pub.end("finished")

    w = RunWatcher(url, token, pub.run_id, on_event).start()   # each supervisor
    w.claim(); w.decide(proposal_id, Decision.approve())       # one decides at a time (claim)
"""
from __future__ import annotations

import asyncio
import threading
import uuid

from agent import protocol as P
from agent.run.supervision import RemoteSupervisor, answer_to_wire
from agent.sync.session import Session, SyncError


class LiveLink:
    def __init__(self, url: str, token: str, on_event=None, *, client: str = "tandem-live", ssl=None):
        self.url, self.token, self.client, self.ssl = url, token, client, ssl
        self.on_event = on_event
        self.session: Session | None = None
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="tandem-live", daemon=True)
        self._pump = None

    def start(self, timeout: float = 10.0) -> LiveLink:
        self._thread.start()
        try:
            self.session = self.call(Session.open(self.url, self.token, ssl=self.ssl, timeout=timeout, client=self.client),
                                     timeout=timeout + 5)
        except BaseException:
            self._shutdown()
            raise
        self._pump = asyncio.run_coroutine_threadsafe(self._read(), self.loop)
        return self

    @property
    def user(self) -> str | None:
        return self.session.user if self.session else None

    def call(self, coro, timeout: float = 30.0):
        """Run a coroutine on the link's loop and return its result (from any other thread)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise SyncError(f"no answer from {self.url} within {timeout:g} s") from None

    async def _read(self) -> None:
        while True:
            try:
                ev = await self.session.next_event()
            except SyncError as e:
                if self.on_event:
                    self.on_event(e)
                return
            if self.on_event:
                try:
                    self.on_event(ev)
                except Exception:  # a failing listener must not stop the pump
                    import logging

                    logging.getLogger("tandem.live").exception("live event listener failed")

    def close(self) -> None:
        if self.session is not None and self.loop.is_running():
            try:
                self.call(self.session.close(), timeout=5)
            except Exception:  # closing a dead connection
                pass
        self._shutdown()

    def _shutdown(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


class RunPublisher:
    """The agent's side: a RemoteSupervisor whose proposals go to the run's subscribers."""

    def __init__(self, url: str, token: str, run_id: str | None = None, *, timeout: float | None = None, ssl=None):
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.link = LiveLink(url, token, self._event, client="tandem-agent", ssl=ssl)
        self.supervisor = RemoteSupervisor(self._publish, timeout=timeout)
        self.ended = False

    def start(self, timeout: float = 10.0) -> RunPublisher:
        self.link.start(timeout)
        return self

    def _publish(self, proposal_id: str, step: dict, screenshot: bytes | None) -> None:
        try:
            self.link.call(self.link.session.propose(self.run_id, proposal_id, step, screenshot))
        except SyncError as e:
            self.supervisor.cancel(f"cannot reach the supervisors: {e}")

    def _event(self, ev) -> None:
        if isinstance(ev, P.DecisionReceived) and ev.run_id == self.run_id:
            self.supervisor.deliver(ev.proposal_id, ev.decision, ev.step, ev.reason, ev.by)
        elif isinstance(ev, P.ErrorReceived) and self.run_id in ev.reason:
            # the server refused this run's proposal (another connection published the run id
            # first, a limit): no decision will ever come, so the agent stops and says why
            self.supervisor.cancel(f"the server refused run {self.run_id}: {ev.reason}")
        elif isinstance(ev, SyncError):
            self.supervisor.cancel(f"the connection to the supervisors ended: {ev}")

    def end(self, reason: str | None = None) -> None:
        if not self.ended:
            self.ended = True
            try:
                self.link.call(self.link.session.end_run(self.run_id, reason), timeout=5)
            except Exception:  # the server ends the run when the connection goes anyway
                pass
            self.link.close()


class RunWatcher:
    """A supervisor's side of one run: subscribe, claim to decide, decide, release."""

    def __init__(self, url: str, token: str, run_id: str, on_event=None, *, ssl=None):
        self.run_id = run_id
        self.link = LiveLink(url, token, on_event, client="tandem-supervisor", ssl=ssl)

    @property
    def user(self) -> str | None:
        return self.link.user

    def start(self, timeout: float = 10.0) -> RunWatcher:
        self.link.start(timeout)
        try:
            self.link.call(self.link.session.request("subscribe", run_id=self.run_id))
        except BaseException:
            self.link.close()
            raise
        return self

    def claim(self) -> None:
        """Become the one who decides; RequestRefused (code 'conflict') names who holds it."""
        self.link.call(self.link.session.request("claim", run_id=self.run_id))

    def release(self) -> None:
        self.link.call(self.link.session.request("release", run_id=self.run_id))

    def decide(self, proposal_id: str, answer) -> None:
        kind, step, reason = answer_to_wire(answer)
        self.link.call(self.link.session.decide(self.run_id, proposal_id, kind, step=step or None if kind != "edit" else step,
                                                reason=reason))

    def close(self) -> None:
        try:
            if self.link.session is not None:
                self.link.call(self.link.session.request("unsubscribe", run_id=self.run_id), timeout=5)
        except Exception:  # the server forgets us when the connection closes anyway
            pass
        self.link.close()
