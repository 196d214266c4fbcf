"""Think-aloud: typed notes and spoken words attached to steps by time; the microphone recorded
on the recording's clock through a real PulseAudio virtual microphone; transcription through a
real transformers Whisper pipeline — a tiny one built here with random weights and a locally
made tokenizer and feature extractor (nothing downloaded), fed speech made by espeak-ng. Its
words are nonsense; what is tested is the code path and where the words land."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import time
import wave

import pytest

from agent.schema import Action, Episode, Observation, ScreenGeometry, Step


def make_tiny_whisper(out):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration, WhisperTokenizer

    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
                "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"] + [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["open the file and click the save button", "type the name then press enter"] * 10, trainer)
    tok.add_special_tokens(specials)
    tok.save(str(out / "tokenizer.json"))
    eot = "<|endoftext|>"
    t = WhisperTokenizer(tokenizer_file=str(out / "tokenizer.json"), unk_token=eot, bos_token=eot, eos_token=eot, pad_token=eot)
    t.save_pretrained(out)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(out)
    ids = t.convert_tokens_to_ids
    cfg = WhisperConfig(vocab_size=len(t), num_mel_bins=80, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                        decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=1500,
                        max_target_positions=64, pad_token_id=ids(eot), bos_token_id=ids(eot), eos_token_id=ids(eot),
                        decoder_start_token_id=ids("<|startoftranscript|>"), begin_suppress_tokens=None, suppress_tokens=None)
    torch.manual_seed(0)
    m = WhisperForConditionalGeneration(cfg)
    gc = m.generation_config
    gc._from_model_config = False  # otherwise reloading rebuilds it from the model config, losing the fields below
    gc.decoder_start_token_id = ids("<|startoftranscript|>")
    gc.no_timestamps_token_id = ids("<|notimestamps|>")
    gc.lang_to_id = {"<|en|>": ids("<|en|>")}
    gc.task_to_id = {"transcribe": ids("<|transcribe|>"), "translate": ids("<|translate|>")}
    gc.is_multilingual = True
    gc.alignment_heads = [[0, 0], [0, 1]]  # word timestamps come from these cross-attention heads
    gc.max_length = 24
    m.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny_whisper(tmp_path_factory):
    return make_tiny_whisper(tmp_path_factory.mktemp("tiny-whisper"))


def espeak(text: str, path) -> bytes:
    if not shutil.which("espeak-ng"):
        pytest.fail("espeak-ng is not installed: apt-get install -y espeak-ng")
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    return path.read_bytes()


def steps_at(windows):
    geo = ScreenGeometry.simple(100, 100)
    return [Step(i, Observation(None, 100, 100, geo), "", Action("wait"), t_start=a, t_end=b) for i, (a, b) in enumerate(windows)]


def test_spoken_words_attach_by_time_and_replace_an_old_transcript():
    from agent.recorder.transcribe import attach_spoken

    steps = steps_at([(10, 11), (13, 14), (20, 21)])
    steps[1].thought = "typed note"
    words = [{"text": "first", "t0": 9.0}, {"text": "I'll", "t0": 12.0}, {"text": "save", "t0": 13.5},
             {"text": "late", "t0": 30.0}]
    attach_spoken(steps, words)
    assert [s.thought for s in steps] == ["first", "typed note I'll save", "late"]
    attach_spoken(steps, [{"text": "again", "t0": 12.5}])  # re-transcription replaces, keeps typed text
    assert [s.thought for s in steps] == ["", "typed note again", ""]
    assert "spoken" not in steps[0].info and steps[1].info["spoken"] == "again"


def test_transcribe_episode_with_a_tiny_local_whisper(tiny_whisper, store, tmp_path):
    from agent.recorder.errors import RecorderError
    from agent.recorder.transcribe import transcribe_episode

    wav = espeak("open the file, then click save", tmp_path / "speech.wav")
    with wave.open(io.BytesIO(wav)) as w:
        duration = w.getnframes() / w.getframerate()
    blob = store.put_blob(wav)
    ep = Episode("say things", meta={"audio": [{"blob": blob, "t0": 100.0, "sample_rate": 22050, "channels": 1}],
                                     "audio_blobs": [blob]})
    ep.steps = steps_at([(100.2, 100.5), (100.9, 101.2), (101.5, 101.6)])
    store.save_episode(ep)
    ep = transcribe_episode(store, ep.id, tiny_whisper)
    words = ep.meta["transcript"]
    assert words, "the pipeline returned no words"
    assert all(100.0 <= w["t0"] <= w["t1"] <= 100.0 + 30 for w in words)  # on the recording's clock
    assert min(w["t0"] for w in words) < 100.0 + duration
    # each word sits in the step whose window (previous end, own end] holds its time
    ends = [s.t_end for s in ep.steps]
    expected = [0, 0, 0]
    for w in words:
        expected[next((i for i, e in enumerate(ends) if w["t0"] <= e), 2)] += 1
    got = [len(s.info.get("spoken", "").split()) if s.info.get("spoken") else 0 for s in ep.steps]
    assert sum(got) >= len(words) - sum(" " in w["text"] for w in words) and sum(got) > 0
    assert [g > 0 for g in got] == [e > 0 for e in expected]
    assert store.load_episode(ep.id).meta["asr_model"] == str(tiny_whisper)
    with pytest.raises(RecorderError, match="not a directory"):
        transcribe_episode(store, ep.id, tmp_path / "no-such-model")


@pytest.fixture
def virtual_mic(tmp_path):
    """A private PulseAudio server with a null sink whose monitor is remapped as the default
    source (Qt and PortAudio do not offer monitor sources as inputs)."""
    if not shutil.which("pulseaudio"):
        pytest.fail("pulseaudio is not installed: apt-get install -y pulseaudio pulseaudio-utils libasound2-plugins libportaudio2")
    rt = tmp_path / "pulse"
    rt.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(rt), "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        ["pulseaudio", "--daemonize=no", "--exit-idle-time=-1", "-n", "--disable-shm=yes",
         "--load=module-native-protocol-unix", "--load=module-null-sink sink_name=vsink",
         "--load=module-remap-source master=vsink.monitor source_name=vmic"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    sock = rt / "pulse" / "native"
    deadline = time.time() + 10
    while not sock.exists():
        if proc.poll() is not None or time.time() > deadline:
            pytest.fail("pulseaudio did not start")
        time.sleep(0.05)
    subprocess.run(["pactl", "set-default-source", "vmic"], env=env, check=True)
    old = {k: os.environ.get(k) for k in ("PULSE_SERVER", "XDG_RUNTIME_DIR")}
    os.environ["PULSE_SERVER"] = f"unix:{sock}"
    os.environ["XDG_RUNTIME_DIR"] = str(rt)
    yield env
    for k, v in old.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    proc.terminate()
    proc.wait(5)


def test_microphone_recorded_on_the_recording_clock(xdisplay, virtual_mic, store, tmp_path):
    import numpy as np

    from agent.recorder.audio import wav_to_float
    from agent.recorder.session import RecorderConfig, RecordingSession
    from agent.schema import monotonic

    wav = tmp_path / "speech.wav"
    espeak("click the button", wav)
    session = RecordingSession(store, "talk while working", RecorderConfig(fps=5, audio=True, audio_device="pulse"))
    session.start()
    time.sleep(0.5)
    t_play = monotonic()
    # a low playback latency: the virtual mic hears the sound when the null sink renders it
    play = subprocess.Popen(["paplay", "--device=vsink", "--latency-msec=20", str(wav)], env=virtual_mic)
    levels = []
    while play.poll() is None:
        levels.append(session.stats()["audio_level"])
        time.sleep(0.05)
    assert play.returncode == 0
    subprocess.run(["xdotool", "mousemove", "500", "500", "click", "--delay", "0", "1"], check=True)
    time.sleep(0.5)
    session.add_note("that was the button", t=monotonic())
    ep = session.stop()
    seg = ep.meta["audio"][0]
    assert ep.meta["audio_blobs"] == [seg["blob"]] and seg["blob"] in ep.blob_hashes()
    x, rate = wav_to_float(store.get_blob(seg["blob"]))
    loud = np.flatnonzero(np.abs(x) > 0.05)
    assert loud.size > rate // 20, "the speech did not reach the recording"
    onset = seg["t0"] + loud[0] / rate
    # the first loud sample lands after it was played and within a second: through this virtual
    # microphone it is ~0.6 s late (null-sink rendering and the fresh server; 0.15 s on a warm one)
    assert t_play < onset < t_play + 1.0
    assert max(levels) > 0.1  # the level meter moved
    assert [s.action.name for s in ep.steps] == ["click"] and ep.steps[0].thought == "that was the button"


def test_a_microphone_that_cannot_open_leaves_no_episode_behind(xdisplay, store):
    """Before, a failed microphone start left a 0-step episode in status 'recording' in the Library."""
    from agent.recorder.errors import RecorderError
    from agent.recorder.session import RecorderConfig, RecordingSession

    session = RecordingSession(store, "talk while working", RecorderConfig(fps=5, audio=True, audio_device=12345))
    with pytest.raises(RecorderError, match="cannot (open microphone 12345|record audio)"):
        session.start()
    assert store.list_episodes() == []
    assert session.screen is not None and not session.screen.is_alive()  # capture stopped too
