"""A recording session: input, screen, audio and the store, tied together on one clock.
(Over 500 lines: the session owns the threads below and their start and stop order, which only
reads right in one place; capture, encoding, reduction and privacy are their own modules.)

Threads: pynput's listeners (enqueue only), the screen capture (mss into a ring buffer), the
encoder (JPEG/WebP off the capture thread), PortAudio's callback (enqueue only) and this
session's processing thread, which names keys, applies privacy, picks frames, writes raw events
to the store every `flush_s` (so a crash loses at most about that much) and saves the episode's
steps every `save_every_s`. Nothing here imports Qt: the CLI runs it headless, the app wraps it.

Which frames are kept (the rest stay in the ring buffer and are forgotten):
- pre: for an input that may begin an action (a mouse press, the first wheel click of a burst,
  a key press that does not continue a typing run), the last frame whose grab finished before
  it; reduction then uses, for each action, the last kept frame before the action began;
- settled: once input has been quiet for `settle_s`, the latest frame (the post-action frame);
- change: while idle, a frame whose pixels changed, at most every `change_interval_s` (so a
  wait for a loading screen is seen);
- start and stop.
At stop, kept frames that no step uses are deleted: every image left is one the annotator sees
in review.
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent.host.password_focus import PasswordFocus
from agent.recorder.audio import AudioCapture, WavSegment
from agent.recorder.element_watch import ElementWatcher
from agent.recorder.encoder import FrameEncoder
from agent.recorder.errors import NothingRecorded, RecorderError
from agent.recorder.input import InputCapture, key_name
from agent.recorder.privacy import DEFAULT_DENYLIST, DEFAULT_HOTKEYS, Denylist, FocusedWindow, Hotkey
from agent.recorder.reduce import MASK_CHAR, MODIFIERS, REDUCER_VERSION, Thresholds, build_steps
from agent.recorder.screen import FrameRing, ScreenCapture, xft_dpi
from agent.schema import Episode, ScreenGeometry, monotonic
from agent.wording import plural

RECORDER_VERSION = 1


@dataclass
class RecorderConfig:
    fps: float = 8.0  # capture rate cap
    image_format: str = "jpeg"  # jpeg | webp | png
    quality: int = 80
    ring_seconds: float = 2.0  # how much raw screen history is held (memory: fps*seconds*w*h*4)
    settle_s: float = 0.5
    change_interval_s: float = 2.0
    flush_s: float = 0.5
    save_every_s: float = 5.0
    move_hz: float = 20.0  # raw mouse moves kept at most this often
    audio: bool = False
    audio_device: object = None
    samplerate: int = 16000
    denylist: tuple = DEFAULT_DENYLIST
    hotkeys: dict = field(default_factory=lambda: dict(DEFAULT_HOTKEYS))
    thresholds: Thresholds = field(default_factory=Thresholds)
    producer: str | None = None
    password_fields: bool = True  # mask keys while the platform says a password field is focused
    elements: bool = True  # store the active window's element list (AT-SPI) beside each pre-action frame

    def __post_init__(self):  # refused when made, before any store or thread exists
        if not 0 < self.fps <= 60:
            raise RecorderError(f"fps must be in (0, 60], got {self.fps}")
        if not 1 <= self.quality <= 100:
            raise RecorderError(f"quality must be in [1, 100], got {self.quality}")


class RecordingSession:
    """start() -> (pause()/resume()/add_note()/set_secret())* -> stop() -> the saved Episode.

    on_control(name, t) is called from the processing thread when a control hotkey is pressed
    ('pause', 'secret', 'note'): the app opens its note box on 'note'. Pause and secret are
    applied here before the callback.

    own_windows (agent.recorder.privacy.OwnWindows) says which input went to the recording app's
    own windows; that input is left out (counted in meta recording.dropped_own)."""

    def __init__(self, store, instruction: str, config: RecorderConfig | None = None, on_control=None,
                 own_windows=None):
        self.warnings: list[str] = []  # said to the person once recording starts (start() fills it)
        if not instruction or not instruction.strip():
            raise RecorderError("a recording needs an instruction (what the task is)")
        self.store, self.instruction = store, instruction.strip()
        self.config = config or RecorderConfig()
        self.on_control = on_control
        self.own_windows = own_windows
        self._own_press = False  # the last mouse press went to the app: its release goes too
        self._own_keys: set[str] = set()  # keys pressed into the app: their releases go too
        self.dropped_own = 0
        self.hotkeys = {name: Hotkey.parse(text) for name, text in self.config.hotkeys.items()}
        self.denylist = Denylist(self.config.denylist)
        self.episode: Episode | None = None
        self.events: list[dict] = []  # everything written, for reduction
        self.paused = False
        # (time, paused) transitions: input is judged by when it happened, not by when the
        # consumer thread gets to it, so a click queued before a resume stays private
        self._pause_log: list[tuple[float, bool]] = []
        self.secret = False
        self.password = None  # PasswordFocus, when the platform can tell
        self.in_password = False
        self.denied: str | None = None  # the denylist entry matching the focused window
        self.event_count = 0
        self.dropped_private = 0
        self.error: BaseException | None = None
        self._batch: list[dict] = []
        self._batch_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kept: set[str] = set()  # blobs this session stored
        self._kept_seqs: set[int] = set()
        self._pending: list[float] = []  # times whose pre-action frame is still to be picked
        self._held: set[str] = set()
        self._suppressed: set[str] = set()  # control hotkey keys whose release is dropped too
        self._last_input = None
        self._last_key_down = None
        self._run_open = False
        self._last_mouse = -1.0
        self._last_scroll = -1e9
        self._last_move = -1e9
        self._settled = True
        self._last_change_save = -1e9
        self._last_kept_content = None
        self._audio_segments: list[dict] = []
        self._segment = None
        self.screen = self.input = self.encoder = self.audio = None
        self.elements = None  # agent.recorder.element_watch.ElementWatcher, when config.elements
        self._elements_seq = None  # the reading last written as an `elements` event

    # ------------------------------------------------------------ lifecycle
    def start(self) -> Episode:
        cfg = self.config
        self.ring = FrameRing(int(cfg.fps * cfg.ring_seconds) + 2)
        self.screen = ScreenCapture(self.ring, cfg.fps, allowed=lambda: not (self.paused or self.denied))
        self.screen.start_and_wait()  # refuses (RecorderError) before anything is stored
        self.encoder = FrameEncoder(self.store, self._frame_encoded, cfg.image_format, cfg.quality)
        if cfg.password_fields:
            self.password = PasswordFocus().start(timeout=2.0)
        if cfg.elements:
            self.elements = ElementWatcher(self.screen.geometry, allowed=lambda: not (self.paused or self.denied),
                                           masked=lambda: self.secret or bool(self.password and self.password.active)).start()
        self.focus = None
        dpi = xft_dpi() if self.screen.geometry and FocusedWindow().available else None
        self.episode = Episode(self.instruction, kind="recording", producer=cfg.producer)
        self.episode.meta = {
            "recording": {"status": "recording", "recorder_version": RECORDER_VERSION, "fps": cfg.fps,
                          "format": cfg.image_format, "quality": cfg.quality, "started": monotonic()},
            "reducer_version": REDUCER_VERSION,
            "thresholds": cfg.thresholds.to_dict(),
            "clock": "monotonic",
            "screen": self.screen.geometry.to_dict(),
            "monitors": self.screen.monitors,
            "ui_scale": round(dpi / 96.0, 3) if dpi else None,
            "privacy": {"denylist": list(self.denylist.entries), "denylist_active": FocusedWindow().available,
                        "hotkeys": dict(cfg.hotkeys),
                        "password_fields": {"watched": bool(self.password and self.password.available),
                                            "how": self.password.reason if self.password else "off"}},
            "elements": {"how": self.elements.reason if self.elements else "off"},
        }
        # what a person must hear before they type anything private (the CLI prints, the app shows these)
        self.warnings = []
        if cfg.password_fields and not (self.password and self.password.available):
            self.warnings.append("password fields are NOT masked: "
                                 f"{self.password.reason if self.password else 'the check did not start'}; "
                                 "use secret typing (Ctrl+Alt+Shift+S) for anything private")
        try:
            self.store.save_episode(self.episode)
            self.encoder.start()
            if cfg.audio:
                self.audio = AudioCapture(cfg.samplerate, 1, cfg.audio_device).start()
            self.input = InputCapture().start()
        except BaseException:
            self._teardown()
            # nothing was recorded yet: no empty episode is left behind to look like a recording
            try:
                self.store.delete_episode(self.episode.id)
            except Exception:  # the start's own error is the one to report
                pass
            raise
        self._emit({"t": monotonic(), "kind": "start"})
        self._thread = threading.Thread(target=self._run, name="tandem-recorder", daemon=True)
        self._thread.start()
        self._request_frame(monotonic() + 1e-6, "start")
        return self.episode

    def stop(self) -> Episode:
        """Stop capturing, store everything, reduce, and return the saved episode. A recording
        that holds no step is not kept as an episode: it is deleted with its frames and audio and
        NothingRecorded says why (unless the processing thread failed: then its raw events stay
        for `record --rereduce`)."""
        if self._thread is None:
            raise RecorderError("the recording was not started")
        t_stop = monotonic()
        if self.input:
            self.input.stop()
        self._stop.set()
        self._thread.join(10)
        if not (self.paused or self.denied):
            f = self.screen.wait_for_frame_after(t_stop, 2.0 / self.config.fps + 0.5)
            if f is not None:
                self._keep(f, "stop")
        self._emit({"t": monotonic(), "kind": "stop"})
        self._teardown()
        self._close_segment()
        self._flush()
        ep = self.episode
        rec = ep.meta["recording"]
        rec.update(status="complete", stopped=monotonic(), events=self.event_count,
                   dropped_private=self.dropped_private, dropped_own=self.dropped_own, achieved_fps=round(self.screen.achieved_fps(), 2))
        rec["duration_s"] = round(rec["stopped"] - rec["started"], 3)
        if self.audio is not None:
            rec["audio_overflows"] = self.audio.overflows
        self._save_steps()
        prune_unused_frames(self.store, ep, self._kept)
        if not ep.steps and self.error is None:
            self._discard_empty()
        return ep

    def _discard_empty(self) -> None:
        """Delete the step-less episode this session saved, and everything it stored."""
        ep = self.episode
        stored = self._kept | set(ep.meta.get("audio_blobs") or [])
        self.store.delete_episode(ep.id)
        self.store.remove_unreferenced(stored, own=stored)
        raise NothingRecorded(f"Nothing was recorded: {self._why_empty()}. No episode was saved.")

    def _why_empty(self) -> str:
        kept = sum(e["kind"] in ("mouse_down", "scroll") or e["kind"] == "key_down" and e["key"] not in MODIFIERS
                   for e in self.events)  # a lone modifier (a hotkey's Ctrl) is no input of its own
        own, private = self.dropped_own, self.dropped_private
        if kept:  # e.g. only modifier keys
            return f"the {plural(kept, 'input')} captured made no step (no click, typing, key or scroll)"
        if own and not private:
            return f"every input went to Tandem's own window ({plural(own, 'input event')} left out)"
        if private and not own:
            return f"every input came while paused or while a denied window had the focus ({plural(private, 'input event')} left out)"
        if own and private:
            return (f"every input went to Tandem's own window ({own}) or came while paused or while a denied "
                    f"window had the focus ({private})")
        return "no click, key press or scroll reached the screen while recording"

    def _teardown(self) -> None:
        for part in (self.input, self.audio, self.password, self.elements):
            if part is not None:
                try:
                    part.stop()
                except Exception:  # stopping must go on
                    pass
        if self.screen is not None:
            self.screen.stop()
            self.screen.join(5)
        if self.encoder is not None and self.encoder.is_alive():
            self.encoder.finish()

    # ------------------------------------------------------------ controls
    def pause(self, t: float | None = None) -> None:
        if not self.paused:
            t = monotonic() if t is None else t
            self.paused = True
            self._pause_log.append((t, True))
            if self.elements is not None:
                self.elements.clear()
            self._emit({"t": t, "kind": "pause"})

    def resume(self, t: float | None = None) -> None:
        if self.paused:
            t = monotonic() if t is None else t
            self.paused = False
            self._pause_log.append((t, False))
            self._emit({"t": t, "kind": "resume"})
            self._request_frame(t + 1e-6, "start")

    def toggle_pause(self, t: float | None = None) -> None:
        self.resume(t) if self.paused else self.pause(t)

    def _paused_at(self, t: float) -> bool:
        for when, paused in reversed(self._pause_log):
            if when <= t:
                return paused
        return False

    def set_secret(self, on: bool) -> None:
        if on != self.secret:
            self.secret = on
            self._emit({"t": monotonic(), "kind": "secret_on" if on else "secret_off"})

    def add_note(self, text: str, t: float | None = None) -> None:
        """A typed think-aloud note; it attaches to the step whose window holds t (default: now)."""
        if text and text.strip():
            self._emit({"t": monotonic() if t is None else float(t), "kind": "note", "text": text.strip()})

    def stats(self) -> dict:
        return {
            "fps": round(self.screen.achieved_fps(), 2) if self.screen else 0.0,
            "events": self.event_count,
            "frames_kept": len(self._kept),
            "audio_level": self.audio.level if self.audio else None,
            "paused": self.paused, "secret": self.secret, "password_field": self.in_password, "denied": self.denied,
            "elapsed_s": round(monotonic() - self.episode.meta["recording"]["started"], 1) if self.episode else 0.0,
        }

    # ------------------------------------------------------------ the processing thread
    def _run(self) -> None:
        cfg = self.config
        self.focus = FocusedWindow()
        last_flush = last_save = last_focus = monotonic()
        try:
            while not self._stop.is_set():
                try:
                    item = self.input.events.get(timeout=0.02)
                    self._handle(item)
                    while True:
                        self._handle(self.input.events.get_nowait())
                except queue.Empty:
                    pass
                now = monotonic()
                if now - last_focus >= 0.05:
                    self._check_focus(now)
                    last_focus = now
                self._pick_frames(now)
                self._audio_step()
                if now - last_flush >= cfg.flush_s:
                    self._flush()
                    last_flush = now
                if now - last_save >= cfg.save_every_s:
                    self._save_steps()
                    last_save = now
            # what arrived before the listeners stopped
            while True:
                try:
                    self._handle(self.input.events.get_nowait())
                except queue.Empty:
                    break
            self._pick_frames(monotonic() + 10)
            self._audio_step()
        except BaseException as e:  # kept for stop() and stats; raw events so far are stored
            self.error = e
        finally:
            self.focus.close()
            if self.own_windows is not None:
                self.own_windows.close()

    def _check_focus(self, now: float) -> None:
        if self.password is not None and self.password.active != self.in_password:
            self.in_password = not self.in_password  # a marker for review; keys are masked by their own time
            self._emit({"t": now, "kind": "password_on" if self.in_password else "password_off"})
        title, app = self.focus.get()
        hit = self.denylist.match(title, app)
        if hit and not self.denied:
            self.denied = hit
            self.ring.clear()  # frames grabbed just before the check may show the denied window
            if self.elements is not None:
                self.elements.clear()
            self._emit({"t": now, "kind": "denied", "entry": hit})
        elif not hit and self.denied:
            self.denied = None
            self._emit({"t": now, "kind": "allowed"})
            self._request_frame(now + 1e-6, "start")

    def _handle(self, item) -> None:
        kind, t = item[0], item[1]
        if kind in ("key_down", "key_up"):
            key = key_name(item[2])
            mod = MODIFIERS.get(key)
            if kind == "key_down":
                if mod:
                    self._held.add(mod)
                else:
                    for name, hk in self.hotkeys.items():
                        if hk.matches(self._held, key):
                            self._suppressed.add(key.lower())
                            self._control(name, t)
                            return
            else:
                if mod:
                    self._held.discard(mod)
                if key.lower() in self._suppressed:
                    self._suppressed.discard(key.lower())
                    return
            if self._paused_at(t) or self.denied:
                self.dropped_private += 1
                return
            if self._typed_into_self(kind, key):  # a note, a search box of the app itself
                self.dropped_own += 1
                return
            ev = {"t": t, "kind": kind, "key": key}
            masked = self.secret or (self.password is not None and self.password.active_at(t))
            if masked and (key == "space" or (len(key) == 1 and key.isprintable())):
                ev.update(key=MASK_CHAR, secret=True)
            if kind == "key_down":
                # a key that continues a typing run needs no frame of its own: the run's first has it
                chord = bool(self._held & {"ctrl", "alt", "win"})
                typing_key = not chord and (len(key) == 1 or key in ("space", "backspace"))
                continuing = (
                    typing_key and self._run_open and self._last_key_down is not None
                    and t - self._last_key_down <= self.config.thresholds.type_gap_s and self._last_mouse < self._last_key_down
                )
                if not mod:
                    self._last_key_down = t
                    self._run_open = typing_key
                    if not continuing:
                        self._request_frame(t, "pre")
            self._input_seen(t)
            self._emit(ev)
            return
        if self._paused_at(t) or self.denied:
            if kind != "move":
                self.dropped_private += 1
            return
        if kind == "move":
            if t - self._last_move < 1.0 / self.config.move_hz:
                return
            self._last_move = t
            self._emit({"t": t, "kind": "move", "x": int(item[2]), "y": int(item[3])})
            return
        if kind != "move" and self._aimed_at_self(kind, item[2], item[3]):
            self.dropped_own += 1
            return
        if kind in ("mouse_down", "mouse_up"):
            if kind == "mouse_down":
                self._request_frame(t, "pre")
            self._last_mouse = t
            self._emit({"t": t, "kind": kind, "x": int(item[2]), "y": int(item[3]), "button": item[4]})
        elif kind == "scroll":
            if t - self._last_scroll > self.config.thresholds.scroll_merge_s:
                self._request_frame(t, "pre")
            self._last_scroll = t
            self._emit({"t": t, "kind": "scroll", "x": int(item[2]), "y": int(item[3]), "dx": item[4], "dy": item[5]})
        self._input_seen(t)

    def _typed_into_self(self, kind: str, key: str) -> bool:
        """A key pressed while the app's own window has the keyboard, asked at each press (a
        sampled answer missed the first keys typed right after the focus moved); a release
        follows its press."""
        if self.own_windows is None:
            return False
        if kind == "key_up":
            if key in self._own_keys:
                self._own_keys.discard(key)
                return True
            return False
        if self.own_windows.focused():
            self._own_keys.add(key)
            return True
        return False

    def _aimed_at_self(self, kind: str, x, y) -> bool:
        """A press or a wheel click on the app's own window; a release follows its press (the
        note box's OK closes on release, so the window under it may be gone by then)."""
        if self.own_windows is None:
            return False
        if kind == "mouse_up":
            own, self._own_press = self._own_press, False
            return own
        own = self.own_windows.at(int(x), int(y))
        if kind == "mouse_down":
            self._own_press = own
        return own

    def _control(self, name: str, t: float) -> None:
        if name == "pause":
            self.toggle_pause(t)
        elif name == "secret":
            self.set_secret(not self.secret)
        if self.on_control is not None:
            try:
                self.on_control(name, t)
            except Exception:  # a UI callback must not stop the recording
                pass

    def _input_seen(self, t: float) -> None:
        self._last_input = t
        self._settled = False
        if self.elements is not None:
            self.elements.poke(0.1)  # the next action's list: read once the screen has answered this input

    # ------------------------------------------------------------ frames
    def _request_frame(self, t: float, why: str) -> None:
        self._pending.append((t, why))
        if why == "pre" and self.elements is not None:
            self._note_elements(t)

    def _note_elements(self, t: float) -> None:
        """Write the element list read last before the input at t, once per reading."""
        snap = self.elements.before(t)
        if snap.seq < 0 or snap.seq != self._elements_seq:
            self._elements_seq = snap.seq
            self._emit(snap.event())

    def _pick_frames(self, now: float) -> None:
        latest = self.ring.latest()
        period = 1.0 / self.config.fps
        still = []
        for t, why in self._pending:
            # wait until a frame began after t (then every frame that ended before t is in)
            if latest is not None and latest.t >= t or now - t > 3 * period + 0.2:
                f = self.ring.latest() if why == "start" else self.ring.before(t)
                if f is not None:
                    self._keep(f, why)
            else:
                still.append((t, why))
        self._pending = still
        if latest is None or self._last_input is None:
            return
        quiet = now - self._last_input
        if not self._settled and quiet >= self.config.settle_s and latest.t > self._last_input:
            self._keep(latest, "settled")
            self._settled = True
            self._last_change_save = now
        elif self._settled and latest.content_id != self._last_kept_content and now - self._last_change_save >= self.config.change_interval_s:
            self._keep(latest, "change")
            self._last_change_save = now

    def _keep(self, f, why: str) -> None:
        if f.seq in self._kept_seqs:
            return
        self._kept_seqs.add(f.seq)
        self._last_kept_content = f.content_id
        self.encoder.submit(f, why)

    def _frame_encoded(self, f, why: str, blob: str) -> None:  # the encoder thread
        self._kept.add(blob)
        self._emit({"t": f.t, "kind": "frame", "t_end": f.t_end, "blob": blob, "width": f.width, "height": f.height, "why": why})

    # ------------------------------------------------------------ audio
    def _audio_step(self) -> None:
        if self.audio is None:
            return

        for t, data in self.audio.drain():
            if self.paused or self.denied:
                self._close_segment()
                continue
            if self._segment is None:
                path = Path(self.store.root) / "recording-audio" / f"{self.episode.id}-{len(self._audio_segments)}.wav"
                self._segment = WavSegment(path, t, self.audio.samplerate, self.audio.channels)
            self._segment.write(t, data)

    def _close_segment(self) -> None:
        if self._segment is not None:
            seg = self._segment.close_to_blob(self.store)
            self._segment = None
            self._audio_segments.append(seg)
            self.episode.meta["audio"] = list(self._audio_segments)
            self.episode.meta["audio_blobs"] = [s["blob"] for s in self._audio_segments]

    # ------------------------------------------------------------ the store
    def _emit(self, ev: dict) -> None:
        with self._batch_lock:
            self._batch.append(ev)
            self.events.append(ev)
            if ev["kind"] not in ("frame", "move", "elements"):
                self.event_count += 1

    def _flush(self) -> None:
        with self._batch_lock:
            batch, self._batch = self._batch, []
        if batch:
            self.store.append_raw_events(self.episode.id, batch)

    def _save_steps(self) -> None:
        with self._batch_lock:
            events = list(self.events)
        self.episode.steps = build_steps(events, ScreenGeometry.from_dict(self.episode.meta["screen"]), self.config.thresholds,
                                         words=self.episode.meta.get("transcript"))
        self.store.save_episode(self.episode)


def prune_unused_frames(store, ep: Episode, candidates: set[str]) -> int:
    """Delete the blobs in `candidates` that no episode refers to; returns how many went."""
    left = candidates - ep.blob_hashes()
    return store.remove_unreferenced(left, own=left)


def rereduce(store, episode_id: str, thresholds: Thresholds | None = None) -> Episode:
    """Rebuild an episode's steps from its raw events (after a crash, or with new thresholds).
    Step edits made since are replaced. Frames whose blobs are gone are skipped."""
    ep = store.load_episode(episode_id)
    if "screen" not in ep.meta:
        raise RecorderError(f"episode {episode_id} has no recorded screen geometry: it is not a recording")
    events = store.raw_events(episode_id)
    if not events:
        raise RecorderError(f"episode {episode_id} has no raw input events to reduce")
    frames = {e["blob"] for e in events if e.get("kind") == "frame" and e.get("blob")}
    present = {h for h in frames if store.has_blob(h)}
    events = [e for e in events if e.get("kind") != "frame" or e.get("blob") in present]
    th = thresholds or Thresholds.from_dict(ep.meta.get("thresholds"))
    ep.steps = build_steps(events, ScreenGeometry.from_dict(ep.meta["screen"]), th, words=ep.meta.get("transcript"))
    ep.meta["reducer_version"] = REDUCER_VERSION
    ep.meta["thresholds"] = th.to_dict()
    rec = ep.meta.setdefault("recording", {})
    if rec.get("status") == "recording":  # the recorder died: what it left is now the recording
        rec["status"] = "recovered"
        rec["events"] = sum(1 for e in events if e["kind"] not in ("frame", "move"))
    store.save_episode(ep, bump_revision=True)
    prune_unused_frames(store, ep, present)
    return ep
