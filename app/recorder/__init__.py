"""The recorder: capture core (input, screen, audio), reduction to actions, privacy, think-aloud.

No Qt here (the CLI records headless; app/record_view.py wraps it), and importing the package
or any of its modules has no side effects: pynput, mss, OpenCV, sounddevice and transformers are
imported when a recording or a transcription starts (tests/test_recorder_import.py checks).

    from app.recorder import RecordingSession, RecorderConfig
    session = RecordingSession(store, "Rename the file", RecorderConfig(fps=8))
    session.start(); ...; episode = session.stop()
"""
from __future__ import annotations

_EXPORTS = {
    "RecordingSession": "app.recorder.session",
    "RecorderConfig": "app.recorder.session",
    "rereduce": "app.recorder.session",
    "RecorderError": "app.recorder.errors",
    "Thresholds": "app.recorder.reduce",
    "REDUCER_VERSION": "app.recorder.reduce",
    "reduce_actions": "app.recorder.reduce",
    "build_steps": "app.recorder.reduce",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'app.recorder' has no attribute {name!r}")
