"""Importing the recorder has no side effects: no platform back end, no Qt, no thread, no display
needed. Checked in a fresh interpreter with no DISPLAY, where pynput would fail at import."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import ROOT

MODULES = ["agent.recorder", "agent.recorder.reduce", "agent.recorder.session", "agent.recorder.screen", "agent.recorder.input",
           "agent.recorder.encoder", "agent.recorder.audio", "agent.recorder.privacy", "agent.recorder.transcribe",
           "agent.recorder.review", "agent.recorder.cli", "agent.recorder.errors"]
HEAVY = ["pynput", "mss", "cv2", "sounddevice", "transformers", "torch", "PySide6", "Xlib", "numpy"]


def test_import_has_no_side_effects(tmp_path):
    code = f"""
import json, sys, threading, os
before = set(os.listdir('.'))
import importlib
for m in {MODULES!r}:
    importlib.import_module(m)
import agent.recorder as r
r.Thresholds, r.REDUCER_VERSION  # lazy exports resolve
print(json.dumps({{"heavy": [m for m in {HEAVY!r} if m in sys.modules], "threads": threading.active_count(),
                  "new_files": sorted(set(os.listdir('.')) - before)}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res == {"heavy": [], "threads": 1, "new_files": []}


def test_unknown_attribute_is_an_attribute_error():
    import agent.recorder

    try:
        agent.recorder.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")
