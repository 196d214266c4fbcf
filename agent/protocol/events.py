"""The events the sans-I/O sync protocol (agent.protocol) hands its caller: plain frozen values,
one class per thing that can arrive. Re-exported by agent.protocol, which is where to import them."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Message:
    """A valid control message that no more specific event describes."""

    type: str
    body: dict

    @property
    def ref(self) -> str | None:
        return self.body.get("ref")


@dataclass(frozen=True)
class ProtocolError:
    """The peer sent something wrong; an error message has been queued for it."""

    code: str
    reason: str
    fatal: bool = False
    ref: str | None = None  # the request a malformed reply answered, when it says
    hash: str | None = None  # the blob a refused blob frame said it carries


@dataclass(frozen=True)
class ErrorReceived:
    """The peer reported an error about something we sent."""

    code: str
    reason: str
    ref: str | None = None
    fatal: bool = False
    detail: dict = field(default_factory=dict)


@dataclass(frozen=True)
class HelloReceived:
    token: str
    client: str | None


@dataclass(frozen=True)
class Welcome:
    user: str
    role: str
    server: str
    limits: dict
    server_id: str | None = None  # the backend's lasting identity (its store's id); None from older servers


@dataclass(frozen=True)
class ManifestReceived:
    episode_id: str
    revision: int
    content_hash: str
    episode: dict
    blobs: tuple[str, ...]
    ref: str | None = None


@dataclass(frozen=True)
class BlobReceived:
    """A verified blob: one an upload needed (episode_ids) or one we asked for (get_blob)."""

    hash: str
    data: bytes
    episode_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class UploadComplete:
    """Every blob an upload needed has arrived: the episode can be stored and acked."""

    episode_id: str
    revision: int
    content_hash: str
    episode: dict
    ref: str | None = None


@dataclass(frozen=True)
class BlobsNeeded:
    episode_id: str
    revision: int
    hashes: tuple[str, ...]


@dataclass(frozen=True)
class Acked:
    episode_id: str
    revision: int
    content_hash: str
    status: str


@dataclass(frozen=True)
class ProposalReceived:
    """A live step awaiting a decision, with its screenshot's bytes when it has one."""

    run_id: str
    proposal_id: str
    step: dict
    screenshot: str | None
    screenshot_data: bytes | None
    sender: str | None


@dataclass(frozen=True)
class DecisionReceived:
    run_id: str
    proposal_id: str
    decision: str
    step: dict | None
    reason: str | None
    by: str | None
    ref: str | None = None


@dataclass(frozen=True)
class ClaimChanged:
    run_id: str
    by: str | None  # None: nobody decides for this run now


@dataclass(frozen=True)
class ModelVersion:
    version: str
    info: dict


@dataclass(frozen=True)
class RunEnded:
    run_id: str
    reason: str | None
