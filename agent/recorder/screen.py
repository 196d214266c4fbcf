"""Screen capture: mss at a capped rate into a ring buffer of raw frames, and the screens' geometry.

Scale, decided once here: the scale of a monitor is its captured pixel size divided by the size
the platform reports for it (the input coordinate space), measured by grabbing it, on both
axes. On X11 both are X server pixels, so it measures 1.0 exactly whatever Xft.dpi says (Xft.dpi
only tells toolkits how large to draw; it is recorded as `ui_scale` for information). On macOS
Retina it measures 2.0. When the two axes disagree, when monitors have different scales (the
union image would mix them), or on a Wayland session (X11 capture and input there see only
Xwayland windows), the recorder refuses to record rather than guess.

mss is imported in the capture thread (it needs a display, and its X connection belongs to the
thread that opened it); importing this module does nothing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

from agent.recorder.errors import RecorderError
from agent.schema import ScreenGeometry, monotonic


@dataclass
class Frame:
    seq: int
    t: float  # grab started (monotonic)
    t_end: float  # grab finished
    raw: bytes  # BGRA, width*height*4; identical consecutive frames share one object
    width: int
    height: int
    content_id: int  # changes only when the pixels change


def xft_dpi() -> float | None:
    """Xft.dpi from the X resource database (what toolkits scale by), or None."""
    try:
        out = subprocess.run(["xrdb", "-query"], capture_output=True, text=True, timeout=2).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        if line.startswith("Xft.dpi:"):
            try:
                return float(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def detect_screens(sct) -> tuple[dict, ScreenGeometry, list[dict]]:
    """(the mss region to capture: all monitors as one image, its geometry, every monitor's
    geometry) — or RecorderError saying why the scale cannot be known."""
    if sys.platform.startswith("linux") and os.environ.get("XDG_SESSION_TYPE", "").lower() == "wayland":
        raise RecorderError(
            "this is a Wayland session: X11 screen capture and input hooks see only Xwayland windows, "
            "so the recording would miss input and the scale is unknown; log into an X11 session"
        )
    monitors = []
    scales = []
    for i, mon in enumerate(sct.monitors[1:], start=1):
        shot = sct.grab(mon)
        sx, sy = shot.width / mon["width"], shot.height / mon["height"]
        if abs(sx - sy) > 0.01:
            raise RecorderError(f"monitor {i} ({mon['width']}x{mon['height']}) captures as {shot.width}x{shot.height}: "
                                f"the horizontal and vertical scales differ ({sx:.3f} vs {sy:.3f})")
        scale = round(sx, 3)
        scales.append(scale)
        monitors.append(ScreenGeometry(mon["width"], mon["height"], shot.width, shot.height, scale, mon["left"], mon["top"]).to_dict())
    if not monitors:
        raise RecorderError("no monitor found to record")
    if max(scales) - min(scales) > 0.01:
        raise RecorderError(f"the monitors have different scales {scales}: recording mixed-DPI setups is not supported")
    union = sct.monitors[0]
    scale = scales[0]
    geo = ScreenGeometry(
        logical_width=union["width"], logical_height=union["height"],
        physical_width=round(union["width"] * scale), physical_height=round(union["height"] * scale),
        scale_factor=scale, origin_x=union["left"], origin_y=union["top"],
    )
    return dict(union), geo, monitors


class FrameRing:
    """The last `capacity` frames. Thread-safe."""

    def __init__(self, capacity: int):
        self._frames: deque[Frame] = deque(maxlen=max(2, capacity))
        self._lock = threading.Lock()

    def append(self, f: Frame) -> None:
        with self._lock:
            self._frames.append(f)

    def latest(self) -> Frame | None:
        with self._lock:
            return self._frames[-1] if self._frames else None

    def before(self, t: float) -> Frame | None:
        """The last frame whose grab finished at or before t."""
        with self._lock:
            for f in reversed(self._frames):
                if f.t_end <= t:
                    return f
        return None

    def clear(self) -> None:
        with self._lock:
            self._frames.clear()


class ScreenCapture(threading.Thread):
    """Grabs the whole desktop at most `fps` times a second into `ring`.

    `allowed()` is asked before every grab: while it says no (paused, a denied window focused)
    nothing is grabbed. The geometry is detected in start_and_wait(), before recording begins.
    """

    def __init__(self, ring: FrameRing, fps: float, allowed=lambda: True):
        super().__init__(name="tandem-screen", daemon=True)
        if not 0 < fps <= 60:
            raise RecorderError(f"fps must be in (0, 60], got {fps}")
        self.ring, self.fps, self.allowed = ring, fps, allowed
        self.region: dict | None = None
        self.geometry: ScreenGeometry | None = None
        self.monitors: list[dict] = []
        self.error: BaseException | None = None
        self.grabbed = 0
        self.grab_seconds = 0.0
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._halt = threading.Event()
        self._ready = threading.Event()
        self._frame_done = threading.Condition()

    def start_and_wait(self, timeout: float = 10.0) -> ScreenCapture:
        self.start()
        if not self._ready.wait(timeout):
            raise RecorderError(f"the screen capture did not start within {timeout} s")
        if self.error is not None:
            raise self.error if isinstance(self.error, RecorderError) else RecorderError(f"screen capture failed: {self.error}")
        return self

    def stop(self) -> None:
        self._halt.set()

    def wait_for_frame_after(self, t: float, timeout: float) -> Frame | None:
        """Block until a frame that started after t exists (or the timeout); the latest frame."""
        deadline = time.monotonic() + timeout
        with self._frame_done:
            while True:
                f = self.ring.latest()
                if f is not None and f.t > t:
                    return f
                left = deadline - time.monotonic()
                if left <= 0 or self._halt.is_set() or not self.is_alive():
                    return f
                self._frame_done.wait(min(left, 0.05))

    def achieved_fps(self) -> float:
        if not self.started_at or self.grabbed < 2:
            return 0.0
        return self.grabbed / max(1e-6, (self.stopped_at or monotonic()) - self.started_at)

    def run(self) -> None:
        try:
            import mss

            sct = mss.MSS()
            self.region, self.geometry, self.monitors = detect_screens(sct)
        except BaseException as e:  # reported to start_and_wait
            self.error = e if isinstance(e, RecorderError) else RecorderError(f"cannot capture the screen: {e}")
            self._ready.set()
            return
        self._ready.set()
        period = 1.0 / self.fps
        seq, content_id, prev = 0, 0, None
        self.started_at = monotonic()
        next_at = self.started_at
        try:
            while not self._halt.is_set():
                now = monotonic()
                if now < next_at:
                    self._halt.wait(next_at - now)
                    continue
                next_at = max(next_at + period, now)  # a late grab does not cause a burst
                if not self.allowed():
                    prev = None
                    continue
                t0 = monotonic()
                shot = sct.grab(self.region)
                t1 = monotonic()
                raw = shot.raw
                if prev is not None and raw == prev.raw:  # memcmp: identical frames share bytes
                    raw = prev.raw
                else:
                    content_id += 1
                f = Frame(seq, t0, t1, raw, shot.width, shot.height, content_id)
                seq += 1
                if not self.allowed():  # the focus moved to a denied window during the grab
                    prev = None
                    continue
                self.ring.append(f)
                prev = f
                self.grabbed += 1
                self.grab_seconds += t1 - t0
                with self._frame_done:
                    self._frame_done.notify_all()
        except BaseException as e:  # the session reads it and stops cleanly
            self.error = RecorderError(f"screen capture stopped: {e}")
        finally:
            self.stopped_at = monotonic()
            sct.close()
