"""The microphone, recorded continuously with sounddevice (PortAudio), on the recording's clock.

The stream's callback only copies the block, stamps it and enqueues it; the session writes it
to a WAV segment. Each block's time is the monotonic time of its first sample: PortAudio's ADC
time of the block mapped onto time.monotonic through the offset between the two clocks measured
in the callback (or, where a backend gives no ADC time, the callback time minus the block's
length). A segment starts at its first block; its `t0` is what maps words back onto steps.
sounddevice is imported in start() (it loads PortAudio).
"""
from __future__ import annotations

import io
import math
import queue
import wave
from pathlib import Path

from agent.recorder.errors import RecorderError
from agent.schema import monotonic


def _rescan(sd) -> None:
    """PortAudio lists devices once, when it starts: start it again so a microphone plugged in
    (or a sound server started) since then is seen. Only while no stream of ours is open."""
    try:
        sd._terminate()
        sd._initialize()
    except Exception:  # a private API: without it the old list stays
        pass


def input_devices() -> list[tuple[int, str]]:
    """(PortAudio index, name) of every device that can record; [] when there is none or no
    PortAudio at all (the app then offers no microphone)."""
    try:
        import sounddevice as sd

        _rescan(sd)
        return [(i, d["name"]) for i, d in enumerate(sd.query_devices()) if d.get("max_input_channels", 0) > 0]
    except Exception:  # ImportError/OSError without PortAudio, PortAudioError
        return []


class AudioCapture:
    def __init__(self, samplerate: int = 16000, channels: int = 1, device=None, blocksize: int = 1600):
        self.samplerate, self.channels, self.device, self.blocksize = int(samplerate), int(channels), device, int(blocksize)
        self.blocks: queue.SimpleQueue = queue.SimpleQueue()  # (t_first_sample, int16 bytes)
        self.level = 0.0  # RMS of the last block, 0..1, for a level meter
        self.overflows = 0
        self._stream = None

    def start(self) -> AudioCapture:
        try:
            import sounddevice as sd
        except (ImportError, OSError) as e:
            raise RecorderError(f"cannot record audio: sounddevice/PortAudio is not available ({e})") from None
        import numpy as np

        _rescan(sd)

        def callback(indata, frames, time_info, status):
            now = monotonic()
            if status.input_overflow:
                self.overflows += 1
            adc = getattr(time_info, "inputBufferAdcTime", 0.0) or 0.0
            cur = getattr(time_info, "currentTime", 0.0) or 0.0
            t = now - (cur - adc) if adc and cur else now - frames / self.samplerate
            data = indata.copy()
            self.level = min(1.0, float(np.sqrt(np.mean((data.astype(np.float32) / 32768.0) ** 2))) * 4)
            self.blocks.put((t, data.tobytes()))

        try:
            self._stream = sd.InputStream(samplerate=self.samplerate, channels=self.channels, dtype="int16",
                                          device=self.device, blocksize=self.blocksize, callback=callback)
            self._stream.start()
        except Exception as e:  # PortAudioError, ValueError for a bad device
            self._stream = None
            which = "the default microphone" if self.device is None else f"microphone {self.device!r}"
            if not input_devices():
                raise RecorderError(f"cannot open {which}: this computer has no microphone that PortAudio can see") from None
            raise RecorderError(f"cannot open {which}: {e}") from None
        return self

    def stop(self) -> None:
        if self._stream is not None:
            try:
                self._stream.stop()
                self._stream.close()
            finally:
                self._stream = None

    def drain(self) -> list[tuple[float, bytes]]:
        out = []
        while True:
            try:
                out.append(self.blocks.get_nowait())
            except queue.Empty:
                return out


class WavSegment:
    """One continuous stretch of audio, written to a WAV file as it comes (a crash leaves the
    samples on disk), turned into a store blob when closed."""

    def __init__(self, path: Path, t0: float, samplerate: int, channels: int):
        self.path, self.t0, self.samplerate, self.channels = Path(path), t0, samplerate, channels
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._w = wave.open(str(self.path), "wb")
        self._w.setnchannels(channels)
        self._w.setsampwidth(2)
        self._w.setframerate(samplerate)
        self.frames = 0

    def write(self, t: float, data: bytes) -> None:
        # fill a gap (a dropped block) with silence so sample times stay on the clock
        expected = self.t0 + self.frames / self.samplerate
        gap = int(round((t - expected) * self.samplerate))
        if gap > self.samplerate // 10:
            self._w.writeframes(b"\x00\x00" * self.channels * gap)
            self.frames += gap
        self._w.writeframes(data)
        self.frames += len(data) // (2 * self.channels)

    def close_to_blob(self, store) -> dict:
        self._w.close()
        data = self.path.read_bytes()
        blob = store.put_blob(data)
        self.path.unlink(missing_ok=True)
        return {"blob": blob, "t0": self.t0, "sample_rate": self.samplerate, "channels": self.channels,
                "duration_s": round(self.frames / self.samplerate, 3)}


def wav_to_float(data: bytes):
    """WAV bytes (16-bit PCM) -> (mono float32 array in -1..1, sample rate)."""
    import numpy as np

    try:
        with wave.open(io.BytesIO(data), "rb") as w:
            if w.getsampwidth() != 2:
                raise RecorderError(f"expected 16-bit PCM audio, got {8 * w.getsampwidth()}-bit")
            rate, ch = w.getframerate(), w.getnchannels()
            pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    except (wave.Error, EOFError) as e:
        raise RecorderError(f"not a readable WAV file: {e}") from None
    x = pcm.astype(np.float32).reshape(-1, ch).mean(axis=1) / 32768.0
    return x, rate


def resample(x, rate: int, target: int):
    """Linear-interpolation resampling (ASR models want 16 kHz)."""
    import numpy as np

    if rate == target or len(x) == 0:
        return x
    n = int(math.floor(len(x) * target / rate))
    return np.interp(np.arange(n) * (rate / target), np.arange(len(x)), x).astype(np.float32)
