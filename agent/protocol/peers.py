"""The two sides of the sync protocol (agent.protocol, where to import them from): the server's
connection (handshake, manifests and the blobs an upload still needs) and the client's (hello,
requests, the blobs it asked for). Sans-I/O, as the rest of the protocol."""
from __future__ import annotations

from agent.protocol.connection import (
    _CHECKS,
    CLOSE_POLICY,
    DEFAULT_LIMITS,
    SUPPORTED_VERSIONS,
    Connection,
    Limits,
    ProtocolUsageError,
    _is_id,
    _short,
    content_hash,
    encode_message,
    json_shape_problem,
)
from agent.protocol.events import (
    Acked,
    BlobReceived,
    BlobsNeeded,
    ClaimChanged,
    HelloReceived,
    ManifestReceived,
    Message,
    ModelVersion,
    RunEnded,
    UploadComplete,
    Welcome,
)
from agent.schema import Episode, SchemaError


class ServerConnection(Connection):
    """The server's side of one connection. States: new -> auth (hello seen, the server checks
    the token) -> open (accept) | closed (reject or a fatal error)."""

    side = "server"

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.user: str | None = None
        self.role: str | None = None
        self._uploads: dict[str, dict] = {}  # episode id -> manifest with its missing hashes
        self._needed: dict[str, set[str]] = {}  # blob hash -> episode ids waiting for it

    def _on_message(self, mtype: str, body: dict) -> list:
        if self.state == "new":
            if mtype != "hello":
                return self._fail("auth_required", f"the first message must be 'hello', got {mtype!r}", ref=body.get("ref"), fatal=True)
            self.state = "auth"
            return [HelloReceived(body["token"], body.get("client"))]
        if self.state == "auth":
            return self._fail("bad_state", f"{mtype!r} before the server answered 'hello'", fatal=True)
        if mtype == "hello":
            return self._fail("bad_state", "'hello' was already received", ref=body.get("ref"))
        if mtype == "manifest":
            return self._receive_manifest(body)
        if mtype == "proposal":
            return self._receive_proposal(body)
        if mtype == "decision":
            return [self._decision_event(body)]
        if mtype == "run_end":
            return [RunEnded(body["run_id"], body.get("reason"))]
        return [Message(mtype, body)]

    def _receive_manifest(self, body: dict) -> list:
        ref = body.get("ref")
        ep = body["episode"]
        if len(body["blobs"]) > self.limits.max_blobs_per_manifest:
            return self._fail("too_large", f"manifest lists {len(body['blobs'])} blobs, more than {self.limits.max_blobs_per_manifest}", ref=ref)
        try:
            parsed = Episode.from_dict(ep)
        except (SchemaError, ValueError, TypeError, KeyError, AttributeError) as e:
            return self._fail("bad_episode", f"episode does not validate: {e}", ref=ref, detail={"episode_id": str(ep.get("id"))[:200]})
        if not _is_id(parsed.id):
            return self._fail("bad_episode", f"episode id must be a short non-empty string, got {_short(parsed.id)}", ref=ref)
        if not _CHECKS["int"][0](parsed.revision):  # acks carry it: refused here, never stored unacked
            return self._fail("bad_episode", f"episode revision must be a non-negative integer, got {_short(parsed.revision)}",
                              ref=ref, detail={"episode_id": parsed.id})
        digest = content_hash(ep)
        if digest != body["content_hash"]:
            return self._fail("bad_manifest", f"content_hash {body['content_hash']} does not match the episode ({digest})", ref=ref, detail={"episode_id": parsed.id})
        if set(body["blobs"]) != parsed.blob_hashes():
            return self._fail("bad_manifest", "the manifest's blob list differs from the blobs the episode refers to", ref=ref, detail={"episode_id": parsed.id})
        return [ManifestReceived(parsed.id, parsed.revision, digest, ep, tuple(sorted(set(body["blobs"]))), ref)]

    # -- the server's answers
    def accept(self, user: str, role: str, server: str = "tandem", server_id: str | None = None) -> None:
        if self.state != "auth":
            raise ProtocolUsageError(f"accept() in state {self.state!r}")
        self.user, self.role, self.state = user, role, "open"
        lim = {"max_text": self.limits.max_text, "max_blob": self.limits.max_blob,
               "max_blobs_per_manifest": self.limits.max_blobs_per_manifest, "versions": list(SUPPORTED_VERSIONS),
               "max_json_values": self.limits.max_json_values, "max_json_depth": self.limits.max_json_depth}
        self.send("welcome", user=user, role=role, server=server, limits=lim, server_id=server_id)

    def reject(self, reason: str, code: str = "auth_failed") -> None:
        self._out.append(encode_message("error", code=code, reason=reason, fatal=True))
        self._close(CLOSE_POLICY, reason)

    def error(self, code: str, reason: str, *, ref: str | None = None, detail: dict | None = None) -> None:
        """An error about a valid request (forbidden, not found, conflict...); not a protocol fault."""
        self.send("error", code=code, reason=reason[:500], ref=ref, detail=detail)

    def need(self, m: ManifestReceived, missing) -> None:
        """Ask for the blobs of `m` the server lacks; UploadComplete follows when all arrived."""
        missing = sorted(set(missing))
        if not missing:
            raise ProtocolUsageError("need() with no missing blobs: store and ack the episode instead")
        old = self._uploads.pop(m.episode_id, None)
        if old:  # a newer manifest of the same episode replaces the half-sent one
            for h in old["missing"]:
                self._needed.get(h, set()).discard(m.episode_id)
        self._uploads[m.episode_id] = {"m": m, "missing": set(missing)}
        for h in missing:
            self._needed.setdefault(h, set()).add(m.episode_id)
        self.send("need", episode_id=m.episode_id, revision=m.revision, hashes=missing, ref=m.ref)

    def ack(self, episode_id: str, revision: int, digest: str, status: str, ref: str | None = None) -> None:
        self.send("ack", episode_id=episode_id, revision=revision, content_hash=digest, status=status, ref=ref)

    def pending_uploads(self) -> list[str]:
        return sorted(self._uploads)

    def expects_blob(self) -> bool:
        """A blob frame would be wanted now: an upload's needed blob or a proposal's screenshot."""
        return bool(self._needed or self._pending_proposals)

    def _on_blob(self, digest: str, data: bytes) -> list:
        waiting = {e for e in self._needed.pop(digest, set()) if e in self._uploads}
        events: list = []
        if digest in self._pending_proposals:
            events += super()._on_blob(digest, data)
        if not waiting:
            return events or super()._on_blob(digest, data)
        events.append(BlobReceived(digest, data, tuple(sorted(waiting))))
        for eid in sorted(waiting):
            up = self._uploads[eid]
            up["missing"].discard(digest)
            if not up["missing"]:
                del self._uploads[eid]
                m = up["m"]
                events.append(UploadComplete(m.episode_id, m.revision, m.content_hash, m.episode, m.ref))
        return events


class ClientConnection(Connection):
    """The client's side: hello is queued at once; other requests wait for `Welcome`."""

    side = "client"

    def __init__(self, token: str, client: str = "tandem", limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.user: str | None = None
        self.role: str | None = None
        self.server_id: str | None = None
        self._requested_blobs: set[str] = set()
        self.send("hello", token=token, client=client)
        self.state = "hello_sent"

    def _require_open(self) -> None:
        if self.state != "open":
            raise ProtocolUsageError(f"the connection is {self.state!r}, not open: wait for Welcome")

    def send(self, mtype: str, **fields) -> None:
        if mtype != "hello" and self.state != "open" and mtype != "error":
            self._require_open()
        super().send(mtype, **fields)

    def _on_message(self, mtype: str, body: dict) -> list:
        if self.state == "hello_sent":
            if mtype != "welcome":
                return self._fail("bad_state", f"expected 'welcome', got {mtype!r}", fatal=True)
            self.state = "open"
            self.user, self.role, self.server_id = body["user"], body["role"], body.get("server_id")
            lim = body["limits"]
            # The server's limits bind what we send.
            self.limits = Limits(
                max_text=_int_or(lim.get("max_text"), self.limits.max_text),
                max_blob=_int_or(lim.get("max_blob"), self.limits.max_blob),
                max_blobs_per_manifest=_int_or(lim.get("max_blobs_per_manifest"), self.limits.max_blobs_per_manifest),
                max_pending_proposals=self.limits.max_pending_proposals, max_errors=self.limits.max_errors,
                max_json_values=_int_or(lim.get("max_json_values"), self.limits.max_json_values),
                max_json_depth=_int_or(lim.get("max_json_depth"), self.limits.max_json_depth),
            )
            return [Welcome(body["user"], body["role"], body["server"], lim, body.get("server_id"))]
        if mtype == "welcome":
            return self._fail("bad_state", "a second 'welcome'")
        if mtype == "need":
            return [BlobsNeeded(body["episode_id"], body["revision"], tuple(body["hashes"]))]
        if mtype == "ack":
            return [Acked(body["episode_id"], body["revision"], body["content_hash"], body["status"])]
        if mtype == "proposal":
            return self._receive_proposal(body)
        if mtype == "decision":
            return [self._decision_event(body)]
        if mtype == "claimed":
            return [ClaimChanged(body["run_id"], body.get("by"))]
        if mtype == "model_version":
            return [ModelVersion(body["version"], body.get("info") or {})]
        if mtype == "run_end":
            return [RunEnded(body["run_id"], body.get("reason"))]
        return [Message(mtype, body)]

    def _on_blob(self, digest: str, data: bytes) -> list:
        if digest in self._requested_blobs:
            self._requested_blobs.discard(digest)
            events = [BlobReceived(digest, data)]
            if digest in self._pending_proposals:
                events += super()._on_blob(digest, data)
            return events
        return super()._on_blob(digest, data)

    # -- requests
    def upload(self, episode: dict, ref: str | None = None) -> str:
        """Send a manifest for `episode` (a to_dict()); returns its content hash."""
        blobs = sorted(Episode.from_dict(episode).blob_hashes())
        digest = content_hash(episode)
        self.send("manifest", episode=episode, blobs=blobs, content_hash=digest, ref=ref)
        text = self._out[-1]  # what the server would refuse unread (and without its ref) is not sent
        assert isinstance(text, str)  # send() queued a text frame
        problem = json_shape_problem(text, self.limits)
        if len(text.encode("utf-8")) > self.limits.max_text:
            problem = f"the manifest is {len(text.encode('utf-8'))} bytes, more than the server's {self.limits.max_text}"
        if problem:
            self._out.pop()
            raise ProtocolUsageError(f"episode {_short(episode.get('id'))}: {problem}")
        return digest

    def get_blob(self, digest: str, ref: str | None = None) -> None:
        self._requested_blobs.add(digest)
        self.send("get_blob", hash=digest, ref=ref)

    def get_model_chunk(self, version: str, digest: str, ref: str | None = None) -> None:
        self._requested_blobs.add(digest)
        self.send("get_model_chunk", version=version, hash=digest, ref=ref)

    def request(self, mtype: str, **fields) -> str:
        """Any other request (list_episodes, subscribe, claim, user_add, ...); returns its ref."""
        ref = fields.pop("ref", None) or self.next_ref()
        self.send(mtype, ref=ref, **fields)
        return ref


def _int_or(v, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else default
