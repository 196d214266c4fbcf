"""Frame encoding off the capture thread: raw BGRA -> JPEG/WebP/PNG bytes -> a store blob.

Identical content is encoded once: the encoder remembers the blob of the last few content ids
(the capture thread gives identical consecutive frames one id), and the store names blobs by
content hash, so the same image is stored once however many steps use it.
"""
from __future__ import annotations

import queue
import threading
from collections import OrderedDict

from agent.recorder.errors import RecorderError

FORMATS = {"jpeg": ".jpg", "webp": ".webp", "png": ".png"}


def encode_bgra(raw: bytes, width: int, height: int, fmt: str = "jpeg", quality: int = 80) -> bytes:
    """Encode one BGRA frame. quality: JPEG/WebP 1..100 (WebP above 100 is lossless); ignored for PNG."""
    import cv2
    import numpy as np

    if fmt not in FORMATS:
        raise RecorderError(f"unknown image format {fmt!r}; expected one of {', '.join(FORMATS)}")
    img = cv2.cvtColor(np.frombuffer(raw, np.uint8).reshape(height, width, 4), cv2.COLOR_BGRA2BGR)
    params = {
        "jpeg": [cv2.IMWRITE_JPEG_QUALITY, int(quality)],
        "webp": [cv2.IMWRITE_WEBP_QUALITY, int(quality)],
        "png": [cv2.IMWRITE_PNG_COMPRESSION, 1],
    }[fmt]
    ok, buf = cv2.imencode(FORMATS[fmt], img, params)
    if not ok:
        raise RecorderError(f"OpenCV could not encode a {width}x{height} frame as {fmt}")
    return buf.tobytes()


class FrameEncoder(threading.Thread):
    """Takes (frame, why) jobs; for each, stores the encoded image and calls done(frame, why, blob)."""

    def __init__(self, store, done, fmt: str = "jpeg", quality: int = 80):
        super().__init__(name="tandem-encoder", daemon=True)
        if fmt not in FORMATS:
            raise RecorderError(f"unknown image format {fmt!r}; expected one of {', '.join(FORMATS)}")
        if not 1 <= int(quality) <= 101:
            raise RecorderError(f"quality must be 1..100 (101: lossless WebP), got {quality}")
        self.store, self.done, self.fmt, self.quality = store, done, fmt, int(quality)
        self.jobs: queue.Queue = queue.Queue()
        self._cache: OrderedDict[int, str] = OrderedDict()
        self.encoded = 0
        self.encode_seconds = 0.0
        self.error: BaseException | None = None

    def submit(self, frame, why: str) -> None:
        self.jobs.put((frame, why))

    def finish(self, timeout: float = 30.0) -> None:
        """Encode what is queued, then end the thread."""
        self.jobs.put(None)
        self.join(timeout)

    def run(self) -> None:
        import time

        while True:
            job = self.jobs.get()
            if job is None:
                return
            frame, why = job
            try:
                blob = self._cache.get(frame.content_id)
                if blob is None:
                    t0 = time.monotonic()
                    data = encode_bgra(frame.raw, frame.width, frame.height, self.fmt, self.quality)
                    blob = self.store.put_blob(data)
                    self.encode_seconds += time.monotonic() - t0
                    self.encoded += 1
                    self._cache[frame.content_id] = blob
                    while len(self._cache) > 64:
                        self._cache.popitem(last=False)
                self.done(frame, why, blob)
            except BaseException as e:  # a failed frame must not stop the recording
                self.error = e
