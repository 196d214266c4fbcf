"""Spoken think-aloud -> words with times -> the steps they were said during.

A transformers automatic-speech-recognition pipeline (Whisper class) loaded from a LOCAL folder
(nothing is downloaded), asked for word timestamps. A word's time is its audio segment's `t0`
(the monotonic time of the segment's first sample, stored by the recorder) plus its offset in
the segment, so it lands on the same clock as the input events; reduce.attach_texts gives it to
the step whose window holds it. With no model configured the audio blobs stay in the episode and
this can run later (`python main.py record --transcribe ID --asr-model PATH`).
"""
from __future__ import annotations

from pathlib import Path

from agent.recorder.audio import resample, wav_to_float
from agent.recorder.errors import RecorderError
from agent.recorder.reduce import attach_texts

ASR_RATE = 16000


def load_asr(model_path: str | Path):
    """The ASR pipeline for a local model folder (RecorderError when it is not one)."""
    path = Path(model_path).expanduser()
    if not path.is_dir():
        raise RecorderError(f"--asr-model must be a local model folder; {str(path)!r} is not a directory")
    try:
        from transformers import pipeline

        return pipeline("automatic-speech-recognition", model=str(path), device=-1)
    except Exception as e:  # a broken folder: say which and why
        raise RecorderError(f"cannot load a speech-recognition model from {path}: {e}") from None


def transcribe_wav(data: bytes, asr) -> list[dict]:
    """WAV bytes -> [{'text', 'start', 'end'}] in seconds from the start of the audio."""
    x, rate = wav_to_float(data)
    if len(x) == 0:
        return []
    x = resample(x, rate, ASR_RATE)
    kwargs = {"return_timestamps": "word"}
    if len(x) > 30 * ASR_RATE:
        kwargs["chunk_length_s"] = 30
    is_whisper = "whisper" in type(asr.model).__name__.lower()
    out = asr({"raw": x, "sampling_rate": ASR_RATE}, **kwargs,
              **({"generate_kwargs": {"language": "en", "task": "transcribe"}} if is_whisper else {}))
    words = []
    for c in out.get("chunks") or []:
        text = str(c.get("text", "")).strip()
        start, end = (c.get("timestamp") or (None, None))
        if not text or start is None:
            continue
        words.append({"text": text, "start": float(start), "end": float(end if end is not None else start)})
    return words


def attach_spoken(steps, words: list[dict]) -> None:
    """Put each word (absolute times 't0') into the thought of the step whose window holds it.
    A step's earlier transcript (info['spoken']) is replaced; typed text in the thought is kept."""
    per_step = attach_texts([(s.t_start, s.t_end) for s in steps], [(w["t0"], w["text"]) for w in words])
    for s, spoken_words in zip(steps, per_step, strict=True):
        old = s.info.get("spoken", "")
        thought = s.thought
        if old and thought.endswith(old):
            thought = thought[: -len(old)].rstrip()
        spoken = " ".join(spoken_words)
        s.thought = " ".join(x for x in (thought, spoken) if x)
        if spoken:
            s.info["spoken"] = spoken
        else:
            s.info.pop("spoken", None)


def transcribe_episode(store, episode_id: str, model_path, asr=None):
    """Transcribe every audio segment of a recording, store the words in meta['transcript'] and
    in the steps' thoughts, save; returns the episode."""
    ep = store.load_episode(episode_id)
    segments = ep.meta.get("audio") or []
    if not segments:
        raise RecorderError(f"episode {episode_id} has no recorded audio to transcribe")
    asr = asr or load_asr(model_path)
    words = []
    for seg in segments:
        for w in transcribe_wav(store.get_blob(seg["blob"]), asr):
            words.append({"text": w["text"], "t0": seg["t0"] + w["start"], "t1": seg["t0"] + w["end"]})
    ep.meta["transcript"] = words
    ep.meta["asr_model"] = str(model_path)
    attach_spoken(ep.steps, words)
    store.save_episode(ep, bump_revision=True)
    return ep
