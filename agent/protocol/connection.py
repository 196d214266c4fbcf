"""The sync protocol, sans-I/O: frames in, events out, frames to send.

Transport-agnostic: a websocket (or anything that carries whole text and binary messages) feeds
`receive_text` / `receive_bytes` and sends what `data_to_send()` returns. Nothing here touches a
socket, a clock or a thread, so every branch is tested by feeding frames and looking at events.

Wire format (version 1):
- control messages are JSON objects in text frames: {"v": 1, "type": ..., "ref"?: ..., fields};
- blobs (screenshots, audio) are binary frames: b"TDB" + version byte + 32-byte SHA-256 digest +
  the bytes. The receiver checks the digest, so a blob is named by its content end to end.

Conversation:
  client hello(token) -> server welcome | error(auth_failed, fatal)
  client manifest(episode, blobs, content_hash) -> server ack (already had it) | need(hashes)
  client sends only the needed blobs -> server ack(status) once the episode is stored
Idempotence lives in (episode id, revision, content hash): the same manifest twice is acked as
a duplicate without a write; a resumed upload is just the manifest again, and the server asks
only for the blobs it still lacks.
Live supervision: proposal(run, step, screenshot) travels from the agent to the subscribed
supervisors; claim makes one supervisor the decider; decision(approve|edit|reject|takeover)
travels back; model_version announces a new policy to everyone.
Models: get_model(version?) -> model(version, info, manifest | endpoint): the files of a checkpoint
as SHA-256-named chunks (agent.storage.model_files); get_model_chunk(version, hash) -> that chunk as a blob
frame. A download resumes by asking only for the chunks it lacks. A model version is a plain name
(agent.storage.model_files.is_model_version), since the puller makes a folder of it; the info clients get
never holds the backend's paths.

Bad input (malformed JSON, unknown types or versions, wrong field types, oversized frames,
unexpected blobs) never raises: it becomes a ProtocolError event and an error message queued for
the peer. Errors in the handshake, and too many errors, are fatal: `close_code` is then set.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Any

from agent.errors import TandemError
from agent.protocol.events import DecisionReceived, ErrorReceived, ProposalReceived, ProtocolError
from agent.storage.model_files import is_model_version  # a model version names the folder it is pulled into

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
BLOB_MAGIC = b"TDB"
BLOB_HEADER_LEN = len(BLOB_MAGIC) + 1 + 32

ROLES = ("annotator", "supervisor", "admin")
DECISIONS = ("approve", "edit", "reject", "takeover")
ACK_STATUSES = ("stored", "replaced", "duplicate", "superseded")

# Websocket close codes the I/O layer uses when a connection must end.
CLOSE_POLICY = 1008  # authentication failed, too many errors
CLOSE_PROTOCOL = 1002  # version mismatch, garbage in the handshake

ERROR_CODES = (
    "bad_json", "bad_text", "bad_message", "bad_version", "unknown_type", "bad_field", "too_large",
    "auth_required", "auth_failed", "forbidden", "not_found", "bad_state", "hash_mismatch",
    "unexpected_blob", "bad_episode", "bad_manifest", "conflict", "overloaded", "internal",
    "too_many_errors",
)


class ProtocolUsageError(TandemError, ValueError):
    """Our own code called the protocol wrongly (not the peer's fault): a bug, so it raises."""


@dataclass(frozen=True)
class Limits:
    max_text: int = 16 * 2**20  # one control message (an episode manifest is the largest)
    max_blob: int = 64 * 2**20  # one screenshot or audio clip
    max_blobs_per_manifest: int = 100_000
    max_pending_proposals: int = 64  # proposals whose screenshot has not arrived yet
    max_errors: int = 100  # protocol errors a connection may cause before it is dropped
    # The shape of one control message, checked on its text before json.loads builds anything: parsed
    # JSON takes ~25x its text for tiny values (14 MB of `[{}, {}, ...]` became 330 MB of dicts). A
    # recorded step is ~45 values in ~800 characters, so a 16 MB episode stays under max_json_values.
    max_json_values: int = 1_000_000
    max_json_depth: int = 64

    @property
    def max_frame(self) -> int:
        """What the websocket layer's max_size must allow."""
        return max(self.max_text, self.max_blob + BLOB_HEADER_LEN)


DEFAULT_LIMITS = Limits()  # frozen: one shared instance is the default everywhere


# ---------------------------------------------------------------- field checks
def _is_hash(v) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _is_id(v) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 200


_CHECKS = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "id": (_is_id, "a non-empty string of at most 200 characters"),
    "version": (is_model_version, "a model version name such as v0003 (letters, digits, '.', '_', '-', at most 64)"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "hash": (_is_hash, "a SHA-256 hex digest"),
    "hashes": (lambda v: isinstance(v, list) and all(_is_hash(h) for h in v), "a list of SHA-256 hex digests"),
    "role": (lambda v: v in ROLES, f"one of {', '.join(ROLES)}"),
    "decision": (lambda v: v in DECISIONS, f"one of {', '.join(DECISIONS)}"),
    "status": (lambda v: v in ACK_STATUSES, f"one of {', '.join(ACK_STATUSES)}"),
    "code": (lambda v: isinstance(v, str) and 0 < len(v) <= 64, "an error code"),
}

C2S, S2C, BOTH = "client", "server", "both"  # who may send a message type

# type -> (sender, {field: kind}); a kind ending in "?" is optional and may be null.
MESSAGES: dict[str, tuple[str, dict[str, str]]] = {
    "hello": (C2S, {"token": "str", "client": "str?"}),
    "welcome": (S2C, {"user": "id", "role": "role", "server": "str", "limits": "dict", "server_id": "id?"}),
    "manifest": (C2S, {"episode": "dict", "blobs": "hashes", "content_hash": "hash"}),
    "need": (S2C, {"episode_id": "id", "revision": "int", "hashes": "hashes"}),
    "ack": (S2C, {"episode_id": "id", "revision": "int", "content_hash": "hash", "status": "status"}),
    "list_episodes": (C2S, {"owner": "id?", "limit": "int?"}),
    "episodes": (S2C, {"items": "list"}),
    "get_episode": (C2S, {"episode_id": "id"}),
    "episode": (S2C, {"episode": "dict", "owner": "id?"}),
    "get_blob": (C2S, {"hash": "hash"}),  # answered by the blob frame itself
    "subscribe": (C2S, {"run_id": "id"}),
    "unsubscribe": (C2S, {"run_id": "id"}),
    "claim": (C2S, {"run_id": "id"}),
    "release": (C2S, {"run_id": "id"}),
    "claimed": (S2C, {"run_id": "id", "by": "id?"}),
    "proposal": (BOTH, {"run_id": "id", "proposal_id": "id", "step": "dict", "screenshot": "hash?", "sender": "id?"}),
    "decision": (BOTH, {"run_id": "id", "proposal_id": "id", "decision": "decision", "step": "dict?", "reason": "str?", "by": "id?"}),
    "run_end": (BOTH, {"run_id": "id", "reason": "str?"}),
    "announce_model": (C2S, {"version": "version", "info": "dict?"}),
    "model_version": (S2C, {"version": "version", "info": "dict?"}),
    "get_model": (C2S, {"version": "version?"}),  # None: the latest announced
    "model": (S2C, {"version": "version", "info": "dict?", "manifest": "dict?", "endpoint": "dict?"}),
    "get_model_chunk": (C2S, {"version": "version", "hash": "hash"}),  # answered by the blob frame itself
    "user_add": (C2S, {"name": "id", "role": "role"}),
    "user_token": (S2C, {"name": "id", "role": "role", "token": "str"}),
    "user_list": (C2S, {}),
    "users": (S2C, {"items": "list"}),
    "user_revoke": (C2S, {"name": "id"}),
    "ok": (S2C, {"what": "str?"}),
    "error": (BOTH, {"code": "code", "reason": "str", "fatal": "bool?", "detail": "dict?"}),
}


def check_fields(mtype: str, body: dict) -> str | None:
    """Why `body` is not a valid `mtype` message, or None when it is."""
    _, fields = MESSAGES[mtype]
    for name, kind in fields.items():
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if name not in body or body[name] is None:
            if optional:
                continue
            return f"{mtype}: missing field {name!r}"
        ok, what = _CHECKS[kind]
        if not ok(body[name]):
            return f"{mtype}: field {name!r} must be {what}, got {_short(body[name])}"
    return None


def _short(v: Any, n: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


# ---------------------------------------------------------------- codec
def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(episode: dict) -> str:
    """The hash that names one version of an episode: SHA-256 of its canonical JSON."""
    return hashlib.sha256(canonical_json(episode).encode()).hexdigest()


def encode_message(mtype: str, **fields) -> str:
    """One control message as text; fields are checked (a bad one is our bug: it raises)."""
    if mtype not in MESSAGES:
        raise ProtocolUsageError(f"unknown message type {mtype!r}")
    body = {k: v for k, v in fields.items() if v is not None}
    problem = check_fields(mtype, body)
    if problem:
        raise ProtocolUsageError(problem)
    return json.dumps({"v": PROTOCOL_VERSION, "type": mtype, **body}, separators=(",", ":"), ensure_ascii=False)


def encode_blob(digest: str, data: bytes) -> bytes:
    if not _is_hash(digest):
        raise ProtocolUsageError(f"not a blob hash: {_short(digest)}")
    return BLOB_MAGIC + bytes([PROTOCOL_VERSION]) + bytes.fromhex(digest) + data


@dataclass(frozen=True)
class Decoded:
    """A frame that decoded to a well-formed message, or the reason why not."""

    type: str | None = None
    body: dict = field(default_factory=dict)
    error: tuple[str, str] | None = None  # (code, reason)


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_shape_problem(text: str, limits: Limits = Limits()) -> str | None:
    """Why `text` would parse into more values or deeper nesting than `limits` allow, or None.
    Counted on the text (commas and brackets outside strings), so a refusal costs no parsing."""
    opened = text.count("[") + text.count("{")
    if text.count(",") + opened < limits.max_json_values and opened <= limits.max_json_depth:
        return None  # the raw counts bound both: the common case costs three str.count calls
    structure = _JSON_STRING.sub('""', text)  # a string may hold any of , [ ] { }
    values = structure.count(",") + structure.count("[") + structure.count("{") + 1
    if values > limits.max_json_values:
        return f"the message holds about {values} JSON values, more than {limits.max_json_values}"
    brackets = _NOT_BRACKET.sub("", structure)
    depth = max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)
    if depth > limits.max_json_depth:
        return f"the message nests JSON {depth} levels deep, more than {limits.max_json_depth}"
    return None


def _encodes(obj) -> bool:
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def decode_message(text: str, limits: Limits = Limits()) -> Decoded:
    if len(text) > limits.max_text:
        return Decoded(error=("too_large", f"control message of {len(text)} characters exceeds {limits.max_text}"))
    shape = json_shape_problem(text, limits)
    if shape:
        return Decoded(error=("too_large", shape))
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        return Decoded(error=("bad_json", f"not JSON: {str(e)[:120]}"))
    if _SURROGATE_ESCAPE.search(text) and not _encodes(obj):  # "\ud800" alone: no UTF-8 frame can carry it on
        return Decoded(error=("bad_text", "the message holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"))
    if not isinstance(obj, dict):
        return Decoded(error=("bad_message", f"a message must be a JSON object, got {type(obj).__name__}"))
    v = obj.get("v")
    if "v" not in obj:
        return Decoded(error=("bad_version", "message has no protocol version 'v'"))
    if v not in SUPPORTED_VERSIONS or isinstance(v, bool):
        return Decoded(error=("bad_version", f"protocol version {_short(v)} is not supported (supported: {list(SUPPORTED_VERSIONS)})"))
    mtype = obj.get("type")
    if not isinstance(mtype, str):
        return Decoded(error=("bad_message", f"message 'type' must be a string, got {_short(mtype)}"))
    if mtype not in MESSAGES:
        return Decoded(error=("unknown_type", f"unknown message type {_short(mtype)}"))
    ref = obj.get("ref")
    if ref is not None and not _is_id(ref):
        return Decoded(error=("bad_field", f"{mtype}: 'ref' must be a short string, got {_short(ref)}"))
    body = {k: v for k, v in obj.items() if k not in ("v", "type")}
    problem = check_fields(mtype, body)
    if problem:
        return Decoded(type=mtype, body={"ref": ref} if ref else {}, error=("bad_field", problem))
    return Decoded(type=mtype, body=body)


def decode_blob(data: bytes, limits: Limits = Limits()) -> tuple[str, bytes] | tuple[None, tuple[str, str]]:
    """(hash, payload) of a verified blob frame, or (None, (code, reason))."""
    if len(data) < BLOB_HEADER_LEN or data[:3] != BLOB_MAGIC:
        return None, ("bad_message", f"binary frame of {len(data)} bytes is not a blob frame (no TDB header)")
    if data[3] not in SUPPORTED_VERSIONS:
        return None, ("bad_version", f"blob frame version {data[3]} is not supported")
    if len(data) - BLOB_HEADER_LEN > limits.max_blob:
        return None, ("too_large", f"blob of {len(data) - BLOB_HEADER_LEN} bytes exceeds {limits.max_blob}")
    digest = data[4:BLOB_HEADER_LEN].hex()
    payload = memoryview(data)[BLOB_HEADER_LEN:]
    if hashlib.sha256(payload).hexdigest() != digest:
        return None, ("hash_mismatch", f"blob {digest} does not match its content")
    return digest, bytes(payload)


# ---------------------------------------------------------------- connections
class Connection:
    """What client and server share: decoding, error accounting, proposals with screenshots."""

    side = ""  # "client" or "server": which messages it sends

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.state = "new"
        self._out: list[str | bytes] = []
        self.errors = 0
        self.close_code: int | None = None
        self.close_reason = ""
        self._pending_proposals: dict[str, list[dict]] = {}  # screenshot hash -> proposals waiting
        self._refs = 0

    # -- output
    def data_to_send(self) -> list[str | bytes]:
        out, self._out = self._out, []
        return out

    def send(self, mtype: str, **fields) -> None:
        sender = MESSAGES.get(mtype, ("?",))[0]
        if sender not in (self.side, BOTH):
            raise ProtocolUsageError(f"a {self.side} does not send {mtype!r}")
        self._out.append(encode_message(mtype, **fields))

    def send_blob(self, digest: str, data: bytes) -> None:
        if len(data) > self.limits.max_blob:
            raise ProtocolUsageError(f"blob {digest} of {len(data)} bytes exceeds the limit {self.limits.max_blob}")
        self._out.append(encode_blob(digest, data))

    def next_ref(self) -> str:
        self._refs += 1
        return f"r{self._refs}"

    @property
    def closed(self) -> bool:
        return self.state == "closed"

    # -- input
    def receive_text(self, text) -> list:
        if self.closed:
            return []
        if not isinstance(text, str):
            return self._fail("bad_message", f"expected a text frame, got {type(text).__name__}")
        try:
            d = decode_message(text, self.limits)
            if d.error:
                return self._fail(*d.error, ref=d.body.get("ref"), fatal=self._fatal_in_state(d.type))
            assert d.type is not None  # a message that decoded has its type
            sender = MESSAGES[d.type][0]
            if sender == self.side:
                return self._fail("unknown_type", f"{d.type!r} is not a message a {self.side} accepts", ref=d.body.get("ref"))
            if d.type == "error":
                b = d.body
                if b.get("fatal"):  # the peer is closing; nothing more will be accepted
                    self._close(CLOSE_POLICY, b["reason"])
                return [ErrorReceived(b["code"], b["reason"], b.get("ref"), bool(b.get("fatal")), b.get("detail") or {})]
            return self._on_message(d.type, d.body)
        except Exception as e:  # a bug here must not take the server down; report it as a value
            return self._fail("internal", f"could not handle the message: {type(e).__name__}: {e}")

    def receive_bytes(self, data) -> list:
        if self.closed:
            return []
        if not isinstance(data, (bytes, bytearray, memoryview)):
            return self._fail("bad_message", f"expected a binary frame, got {type(data).__name__}")
        try:
            data = bytes(data)
            if self.state != "open":
                return self._fail("bad_state", "blob frame before the handshake finished", fatal=True)
            blob = decode_blob(data, self.limits)
            if blob[0] is None:  # the event names the blob its header claims: whoever waits for it can stop
                framed = len(data) >= BLOB_HEADER_LEN and data[:3] == BLOB_MAGIC
                return [replace(ev, hash=data[4:BLOB_HEADER_LEN].hex() if framed else None) for ev in self._fail(*blob[1])]
            return self._on_blob(*blob)
        except Exception as e:
            return self._fail("internal", f"could not handle the blob: {type(e).__name__}: {e}")

    def _fatal_in_state(self, mtype) -> bool:
        return self.state != "open"  # garbage in the handshake ends the connection

    def _fail(self, code: str, reason: str, *, ref: str | None = None, fatal: bool = False, detail: dict | None = None) -> list:
        self.errors += 1
        if self.errors > self.limits.max_errors and not fatal:
            code, reason, fatal = "too_many_errors", f"more than {self.limits.max_errors} protocol errors; last: {reason}", True
        self._out.append(encode_message("error", code=code, reason=reason[:500], fatal=fatal or None, detail=detail, ref=ref))
        if fatal:
            self._close(CLOSE_POLICY if code in ("auth_failed", "auth_required", "too_many_errors") else CLOSE_PROTOCOL, reason)
        return [ProtocolError(code, reason, fatal, ref)]

    def _close(self, code: int, reason: str) -> None:
        self.state = "closed"
        self.close_code = code
        self.close_reason = reason[:120]  # websocket close reasons are at most 123 bytes

    def _on_message(self, mtype: str, body: dict) -> list:  # pragma: no cover - overridden
        raise NotImplementedError

    def _on_blob(self, digest: str, data: bytes) -> list:
        waiting = self._pending_proposals.pop(digest, None)
        if waiting:
            return [self._proposal_event(p, data) for p in waiting]
        return self._fail("unexpected_blob", f"blob {digest} was not asked for", detail={"hash": digest})

    # -- proposals (either side receives them: the server from the agent, a supervisor from the server)
    def _proposal_event(self, b: dict, data: bytes | None) -> ProposalReceived:
        return ProposalReceived(b["run_id"], b["proposal_id"], b["step"], b.get("screenshot"), data, b.get("sender"))

    def _receive_proposal(self, body: dict) -> list:
        shot = body.get("screenshot")
        if not shot:
            return [self._proposal_event(body, None)]
        if sum(len(v) for v in self._pending_proposals.values()) >= self.limits.max_pending_proposals:
            return self._fail("overloaded", f"more than {self.limits.max_pending_proposals} proposals wait for their screenshot", ref=body.get("ref"))
        self._pending_proposals.setdefault(shot, []).append(body)
        return []  # the event comes with the screenshot's blob frame, which follows

    def send_proposal(self, run_id: str, proposal_id: str, step: dict, screenshot: bytes | None = None, sender: str | None = None) -> str | None:
        """A proposal message, then its screenshot's blob frame; returns the screenshot's hash."""
        digest = hashlib.sha256(screenshot).hexdigest() if screenshot is not None else None
        self.send("proposal", run_id=run_id, proposal_id=proposal_id, step=step, screenshot=digest, sender=sender)
        if digest is not None and screenshot is not None:  # both or neither
            self.send_blob(digest, screenshot)
        return digest

    def send_decision(self, run_id: str, proposal_id: str, decision: str, *, step: dict | None = None, reason: str | None = None, by: str | None = None, ref: str | None = None) -> None:
        if decision == "edit" and step is None:
            raise ProtocolUsageError("an 'edit' decision carries the edited step")
        self.send("decision", run_id=run_id, proposal_id=proposal_id, decision=decision, step=step, reason=reason, by=by, ref=ref)

    @staticmethod
    def _decision_event(b: dict) -> DecisionReceived:
        return DecisionReceived(b["run_id"], b["proposal_id"], b["decision"], b.get("step"), b.get("reason"), b.get("by"), b.get("ref"))
