"""Files the store writes: the content hash of bytes, and writes that either land whole or not at all."""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from agent.errors import TandemError

TEMP_PREFIX = ".tmp-"  # a writer's temp file, beside the file it will replace (Store.gc removes stale ones)


class StoreError(TandemError):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a fresh temporary file (created exclusively beside it, so a
    planted link is never followed), flushed to disk, then renamed over `path`."""
    atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: Path, chunks, sha256_hex: str | None = None) -> None:
    """atomic_write of bytes that arrive in chunks (never whole in memory); with sha256_hex, the
    file replaces `path` only when its content has that hash (StoreError otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TEMP_PREFIX)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                h.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if sha256_hex is not None and h.hexdigest() != sha256_hex:
            raise StoreError(f"blob {sha256_hex} does not match its content hash")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
