"""What every executor shares: the observation frame and the Gymnasium-like shape.

An executor is `reset() -> (Frame, info)`, `step(action) -> (Frame, reward, terminated,
truncated, info)`, `close()`, plus `release()` (let go of every held key and button: the kill
switch calls it from another thread). Actions arrive in the schema's normalized space; the
executor turns them into device pixels with the frame's geometry (agent.coords).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.errors import TandemError
from agent.schema import Action, ScreenGeometry, monotonic


class ExecutionError(TandemError):
    """An action that could not be carried out; the message says which and why."""


@dataclass
class Frame:
    """One observation: a screenshot (RGB pixels and/or encoded bytes) plus its geometry.

    `pixels` is an HxWx3 uint8 array in RGB order, or BGR when `bgr` is set (mss hands out BGRA
    and a BGR view costs nothing). `encoded` is PNG/JPEG bytes. At least one of them is given,
    except for text-only observations (the terminal), where `text` carries the output.
    Encoding happens once, on first use, and is cached.
    """

    geometry: ScreenGeometry
    pixels: Any = None
    encoded: bytes | None = None
    mime: str | None = None  # of `encoded`: image/png | image/jpeg
    bgr: bool = False
    time: float = field(default_factory=monotonic)
    text: str | None = None
    extra: dict = field(default_factory=dict)  # e.g. password_focused, hierarchy
    # what is on the screen (agent.elements.Element, screenshot pixels); None: this platform gave no list
    elements: list | None = None
    elements_source: str | None = None  # sandbox | dom | atspi | uiautomator2; why none, when none
    # what the previous tool action gave back, seen with this frame (agent.schema's Observation.tool_output)
    tool_output: dict | None = None
    _pil: Any = field(default=None, repr=False)

    @property
    def has_image(self) -> bool:
        return self.pixels is not None or self.encoded is not None

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the screenshot in pixels."""
        if self.pixels is not None:
            return int(self.pixels.shape[1]), int(self.pixels.shape[0])
        if self.encoded is not None:
            return self.pil().size
        return self.geometry.physical_width, self.geometry.physical_height

    def encode(self, fmt: str = "png", quality: int = 90) -> tuple[bytes, str]:
        """(bytes, mime). Reuses `encoded` when it already has this format."""
        want = "image/jpeg" if fmt in ("jpg", "jpeg") else "image/png"
        if self.encoded is not None and (self.mime == want or self.pixels is None):
            return self.encoded, self.mime or want
        if self.pixels is None:
            raise ExecutionError("this observation has no screenshot to encode")
        self.encoded, self.mime = encode_pixels(self.pixels, want, quality, bgr=self.bgr), want
        return self.encoded, self.mime

    def pil(self):
        """The screenshot as an RGB PIL image (cached)."""
        if self._pil is None:
            from PIL import Image

            if self.pixels is not None:
                px = self.pixels[:, :, ::-1] if self.bgr else self.pixels
                self._pil = Image.fromarray(px.copy() if self.bgr else px, "RGB")
            elif self.encoded is not None:
                self._pil = Image.open(io.BytesIO(self.encoded)).convert("RGB")
            else:
                raise ExecutionError("this observation has no screenshot")
        return self._pil


def encode_pixels(pixels, mime: str, quality: int = 90, *, bgr: bool = False) -> bytes:
    """Encode with OpenCV (about 3x faster than PIL on a full screen); PIL as a fallback."""
    try:
        import cv2
        import numpy as np

        px = pixels if bgr else pixels[:, :, ::-1]
        px = np.ascontiguousarray(px)
        if mime == "image/jpeg":
            ok, buf = cv2.imencode(".jpg", px, [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
        else:
            ok, buf = cv2.imencode(".png", px, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        if ok:
            return buf.tobytes()
    except ImportError:
        pass
    from PIL import Image

    img = Image.fromarray(pixels[:, :, ::-1] if bgr else pixels, "RGB")
    out = io.BytesIO()
    if mime == "image/jpeg":
        img.save(out, "JPEG", quality=int(quality))
    else:
        img.save(out, "PNG", compress_level=1)
    return out.getvalue()


def frame_from_image_bytes(data: bytes, geometry: ScreenGeometry | None = None, **kw) -> Frame:
    """A frame from PNG/JPEG bytes; the geometry defaults to the image size at scale 1."""
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    mime = "image/jpeg" if img.format == "JPEG" else "image/png"
    if geometry is None:
        geometry = ScreenGeometry.simple(img.width, img.height)
    f = Frame(geometry=geometry, encoded=data, mime=mime, **kw)
    return f


class Executor(Protocol):
    platform: str

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Frame, dict]: ...

    def step(self, action: Action) -> tuple[Frame, float, bool, bool, dict]: ...

    def observe(self) -> Frame: ...

    def release(self) -> None: ...

    def close(self) -> None: ...


def interruptible_sleep(seconds: float, stop_event=None) -> bool:
    """Sleep, waking early when `stop_event` is set; True when it was set."""
    if stop_event is not None:
        return stop_event.wait(seconds)
    import time

    time.sleep(seconds)
    return False
