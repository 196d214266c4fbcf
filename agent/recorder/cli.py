"""`python main.py record`: record a demonstration headless, re-reduce one, or transcribe one.

    python main.py record --instruction "Rename report.txt to final.txt" --fps 8 --duration 120
    python main.py record --rereduce EPISODE_ID          # rebuild steps from the raw events
    python main.py record --transcribe EPISODE_ID --asr-model /models/whisper-small

Recording runs until Ctrl+C, SIGTERM or --duration, then leaves a complete episode (kind
"recording") in the store. The first line on stdout is {"episode": ID, "status": "recording"};
the last is a summary. Control hotkeys while recording: Ctrl+Alt+Shift+P pause/resume,
Ctrl+Alt+Shift+S secret typing on/off, Ctrl+Alt+Shift+N mark a note (typed notes need the app).
"""
from __future__ import annotations

import json
import signal
import sys
import threading

from agent.cli_common import open_store
from agent.recorder.errors import RecorderError
from agent.recorder.privacy import DEFAULT_DENYLIST
from agent.recorder.session import RecorderConfig, RecordingSession, rereduce
from agent.recorder.transcribe import transcribe_episode


def register(sub, common) -> None:
    p = sub.add_parser("record", parents=[common], help="record a demonstration (screen, input, optional microphone) headless",
                       description=__doc__, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--instruction", help="the task being demonstrated (required to record)")
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl+C or SIGTERM)")
    p.add_argument("--fps", type=float, default=8.0, help="screen capture rate cap (default 8)")
    p.add_argument("--format", dest="image_format", choices=("jpeg", "webp", "png"), default="jpeg")
    p.add_argument("--quality", type=int, default=80, help="JPEG/WebP quality 1..100 (default 80)")
    p.add_argument("--audio", action="store_true", help="record the microphone (think-aloud)")
    p.add_argument("--audio-device", help="PortAudio input device name or index (default: the system default)")
    p.add_argument("--deny", action="append", default=[], metavar="TEXT",
                   help="also drop frames and keys while a window whose title or app contains TEXT is focused (repeatable)")
    p.add_argument("--asr-model", metavar="PATH", help="a local Whisper-class model folder: transcribe the audio at stop")
    p.add_argument("--rereduce", metavar="EPISODE_ID", help="rebuild an episode's steps from its raw events and exit")
    p.add_argument("--transcribe", metavar="EPISODE_ID", help="transcribe a recording's audio with --asr-model and exit")
    p.add_argument("--producer", help="the annotator's name, stored with the episode")
    p.set_defaults(func=cmd_record)


def _say(obj) -> None:
    print(json.dumps(obj), flush=True)


def cmd_record(args) -> int:
    from agent.storage.store import NotFound, StoreError  # lazy: sqlite_utils: this module stays light

    try:
        if args.rereduce:
            with open_store(args) as store:
                ep = rereduce(store, args.rereduce)
                _say({"episode": ep.id, "status": "rereduced", "steps": len(ep.steps)})
            return 0
        if args.transcribe:
            if not args.asr_model:
                print("error: --transcribe needs --asr-model PATH (a local Whisper-class model folder)", file=sys.stderr)
                return 2

            with open_store(args) as store:
                ep = transcribe_episode(store, args.transcribe, args.asr_model)
                _say({"episode": ep.id, "status": "transcribed", "words": len(ep.meta.get("transcript", []))})
            return 0
        if not args.instruction:
            print("error: record needs --instruction TEXT (or --rereduce / --transcribe EPISODE_ID)", file=sys.stderr)
            return 2
        if args.duration is not None and args.duration <= 0:
            print(f"error: --duration must be positive, got {args.duration}", file=sys.stderr)
            return 2
        return _record(args)
    except (RecorderError, StoreError, NotFound) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _record(args) -> int:
    device = args.audio_device
    if device is not None and device.isdigit():
        device = int(device)
    cfg = RecorderConfig(fps=args.fps, image_format=args.image_format, quality=args.quality, audio=args.audio,
                         audio_device=device, denylist=tuple(DEFAULT_DENYLIST) + tuple(args.deny), producer=args.producer)
    stop = threading.Event()
    old = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with open_store(args) as store:
        session = RecordingSession(store, args.instruction, cfg,
                                   on_control=lambda name, t: print(f"[{name}]", file=sys.stderr, flush=True))
        ep = session.start()
        for w in session.warnings:
            print(f"warning: {w}", file=sys.stderr, flush=True)
        _say({"episode": ep.id, "status": "recording", "screen": ep.meta["screen"]})
        try:
            stop.wait(args.duration)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, old)
        ep = session.stop()
        if args.asr_model and ep.meta.get("audio"):
            ep = transcribe_episode(store, ep.id, args.asr_model)
        rec = ep.meta["recording"]
        _say({"episode": ep.id, "status": rec["status"], "steps": len(ep.steps), "events": rec["events"],
              "duration_s": rec["duration_s"], "achieved_fps": rec["achieved_fps"],
              "error": str(session.error) if session.error else None})
    return 0
