"""What one peer may make the backend hold in memory: the budgets, and the incoming half of them.

websockets reads a whole frame before handing it on, and its `max_size` is one number for text and
binary frames alike (64 MiB, for blobs), so a 60 MB text message was read before being refused,
and frames the handler had not reached yet (up to `max_queue` of them per connection) were held
whatever their size. Here each frame is judged on its header, before its payload is read:

- its limit depends on its kind: a text frame may be `max_text` bytes; a binary frame may be a
  whole blob only while the connection expects one (an upload's `need`, a proposal's screenshot,
  or a text message read but not handled yet, which may be the proposal it belongs to), else
  UNEXPECTED_BLOB_MAX. A frame over its limit ends the connection with 1009 (message too big)
  having read 14 bytes of it;
- its length (x TEXT_COST for text) is reserved against the connection's and the server's read-ahead budget until the
  handler is done with it (a blob: until it is on disk). A frame that does not fit waits unread:
  the connection's socket is no longer read, so TCP holds the rest at the sender.

The hook: websockets' parse() (17.x, pinned by test_websockets_version_pinned) reads the protocol's
`max_message_size` once per frame, right after `reader.at_eof()` has seen the frame's first byte
in the reader's buffer (it reads it twice, then parses that frame); `_AdmittingProtocol` answers it
from that buffer.
"""
from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from websockets.asyncio.server import ServerConnection
from websockets.frames import Opcode
from websockets.server import ServerProtocol

MiB = 2**20
PRE_AUTH_MAX_FRAME = 64 * 1024  # until hello succeeds a frame is a hello: larger ones close the connection
UNEXPECTED_BLOB_MAX = 64 * 1024  # a binary frame nobody asked for, larger than this, is refused unread
TEXT_COST = 4  # a text message is held ~4 times while handled (frame bytes, unmasked copy, str, parsed JSON)


@dataclass(frozen=True)
class Budgets:
    """Bytes one connection, and all of them together, may make the server hold (README, Security).
    A single frame or reply larger than a per-connection budget still passes, alone."""

    read_ahead: int = 80 * MiB  # frames received and not yet handled (blobs: not yet written), per connection
    read_ahead_total: int = 96 * MiB  # the same, all connections together
    send: int = 32 * MiB  # replies and live messages queued for one connection
    send_total: int = 96 * MiB  # the same, all connections together
    send_stall_s: float = 20.0  # a connection whose queued replies do not move for this long is closed
    proposals: int = 32 * MiB  # screenshots of open proposals one connection published
    proposals_total: int = 64 * MiB  # the same, all connections together


DEFAULT_BUDGETS = Budgets()  # frozen: one shared instance is the default


class ReadAhead:
    """The server-wide side of the read-ahead budget: bytes admitted, connections waiting to read."""

    def __init__(self, budgets: Budgets):
        self.budgets = budgets
        self.held = 0
        self.waiting: list[BudgetedConnection] = []

    def fits(self, conn: BudgetedConnection, n: int) -> bool:
        b = self.budgets
        return ((conn.held == 0 or conn.held + n <= b.read_ahead)
                and (self.held == 0 or self.held + n <= b.read_ahead_total))

    def wake(self) -> None:
        for conn in list(self.waiting):
            if self.fits(conn, conn.wants):
                self.waiting.remove(conn)
                conn.reserve(conn.wants)
                conn.wants = 0
                conn.unpause("budget")


def frame_header(buf) -> tuple[int, bool, int | None]:
    """(opcode, fin, payload length or None while the header is not all in `buf`) of the frame
    that starts `buf` (RFC 6455 5.2: 2 bytes, then 2 or 8 more for long lengths)."""
    opcode, fin, length = buf[0] & 0x0F, bool(buf[0] & 0x80), None
    if len(buf) >= 2:
        length = buf[1] & 0x7F
        if length == 126:
            length = struct.unpack("!H", bytes(buf[2:4]))[0] if len(buf) >= 4 else None
        elif length == 127:
            length = struct.unpack("!Q", bytes(buf[2:10]))[0] if len(buf) >= 10 else None
    return opcode, fin, length


class _AdmittingProtocol(ServerProtocol):
    """ServerProtocol whose per-frame size limit is decided by its connection (see the module doc)."""

    connection: BudgetedConnection
    _limit: int | None = None  # the frame being parsed was admitted with this limit

    @property
    def max_message_size(self) -> int | None:
        if self._limit is None and self.reader.buffer:  # parse() reads it twice per frame; admit once
            self._limit = self.connection.admit(self.reader.buffer, self.current_size)
        return self._limit

    def recv_frame(self, frame) -> None:
        self._limit = None
        super().recv_frame(frame)

    @max_message_size.setter
    def max_message_size(self, value) -> None:
        pass  # Protocol.__init__ sets it; the limit is the connection's


class BudgetedConnection(ServerConnection):
    """A websockets server connection whose incoming frames are limited by kind and budgeted in
    bytes (the module doc). The handler calls `take()` for each message it receives and
    `release()` with that number once the message's bytes are no longer held."""

    def __init__(self, protocol, server, *, read_ahead: ReadAhead, **kw):
        super().__init__(protocol, server, **kw)
        protocol.__class__ = _AdmittingProtocol
        protocol.connection = self
        self.read_ahead = read_ahead
        self.text_limit = self.binary_limit = PRE_AUTH_MAX_FRAME  # the server raises them after hello
        self.expects_blob = lambda: False  # the session's protocol state says a blob will come
        self.held = 0  # bytes reserved by frames admitted and not released
        self.wants = 0  # bytes of the frame waiting unread for room
        self._message = (Opcode.TEXT, 0)  # the opcode and bytes of the message being received
        self._messages: deque[tuple[Opcode, int]] = deque()  # whole messages, in the order the handler gets them
        self._paused: set[str] = set()
        self._lost = False

    # -- flow control: the socket is read only while neither websockets' queue nor the budget says stop
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.recv_messages.pause = lambda: self.pause("queue")
        self.recv_messages.resume = lambda: self.unpause("queue")

    def pause(self, why: str) -> None:
        if not self._paused:
            self.transport.pause_reading()
        self._paused.add(why)

    def unpause(self, why: str) -> None:
        if why in self._paused:
            self._paused.discard(why)
            if not self._paused and not self.transport.is_closing():
                self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        if self in self.read_ahead.waiting:
            self.read_ahead.waiting.remove(self)
        self.release(self.held)
        self._lost = True  # what the handler releases later was released here
        self._messages.clear()

    # -- admission
    def admit(self, buf, current_size: int | None) -> int:
        opcode, fin, length = frame_header(buf)
        if opcode >= Opcode.CLOSE:  # control frames: at most 125 bytes, websockets checks them
            return 125
        if opcode == Opcode.CONT:
            opcode = self._message[0]
        else:
            self._message = (opcode, 0)
        limit = self.text_limit if opcode == Opcode.TEXT else self.binary_limit
        if opcode == Opcode.BINARY and not (self.expects_blob() or any(op == Opcode.TEXT for op, _ in self._messages)):
            limit = min(limit, UNEXPECTED_BLOB_MAX)
        room = limit - (current_size or 0)
        n = room if length is None else length  # the header not all here yet: the most it can be
        if n <= room:
            n *= TEXT_COST if opcode == Opcode.TEXT else 1
            if self.read_ahead.fits(self, n):
                self.reserve(n)
            else:
                self.wants = n
                self.read_ahead.waiting.append(self)
                self.pause("budget")
            self._message = (opcode, self._message[1] + n)
            if fin:
                self._messages.append(self._message)
        return limit

    def reserve(self, n: int) -> None:
        self.held += n
        self.read_ahead.held += n

    # -- the handler's side
    def take(self) -> int:
        """Bytes of the message the handler just received (call once per message)."""
        return self._messages.popleft()[1] if self._messages else 0

    def release(self, n: int) -> None:
        if n and not self._lost:
            self.held -= n
            self.read_ahead.held -= n
            self.read_ahead.wake()
