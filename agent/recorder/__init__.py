"""The recorder: capture core (input, screen, audio), reduction to actions, privacy, think-aloud.

No Qt here (the CLI records headless; app/record_view.py wraps it), and importing the package
or any of its modules has no side effects: pynput, mss, OpenCV, sounddevice and transformers are
imported when a recording or a transcription starts (tests/test_recorder_import.py checks).

    from agent.recorder import RecordingSession, RecorderConfig
    session = RecordingSession(store, "Rename the file", RecorderConfig(fps=8))
    session.start(); ...; episode = session.stop()  # NothingRecorded: no step, nothing kept
"""
from __future__ import annotations

_EXPORTS = {
    "RecordingSession": "agent.recorder.session",
    "RecorderConfig": "agent.recorder.session",
    "rereduce": "agent.recorder.session",
    "RecorderError": "agent.recorder.errors",
    "NothingRecorded": "agent.recorder.errors",
    "Thresholds": "agent.recorder.reduce",
    "REDUCER_VERSION": "agent.recorder.reduce",
    "reduce_actions": "agent.recorder.reduce",
    "build_steps": "agent.recorder.reduce",
}


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'agent.recorder' has no attribute {name!r}")
