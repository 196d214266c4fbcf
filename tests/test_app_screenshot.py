"""The real window on a real X server (Xvfb): packaging/screenshot_app.py opens it on a sample
store with a click step selected and grabs the screen. It runs in a subprocess because this
pytest process already holds an offscreen QApplication."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
CLICK_RED = (0xE5, 0x38, 0x3B)  # app.screenshot_canvas.COLORS["click"]


@pytest.mark.desktop
def test_main_window_screenshot(xdisplay, tmp_path):
    out = Path("/tmp/tandem_main_window.png")
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "DISPLAY": xdisplay, "TANDEM_DATA": str(tmp_path / "unused")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "screenshot_app.py"), str(out), "--size", "1600x1000"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["platform"] == "xcb" and info["action"] == "click"
    img = Image.open(out).convert("RGB")
    assert img.size == (1600, 1000)
    assert len(img.getcolors(1 << 20) or []) > 200  # a drawn window, not a blank grab
    # the click marker is drawn where the canvas maps the stored point
    x, y = info["click_screen"]
    near = [img.getpixel((x + dx, y + dy)) for dx in range(-2, 3) for dy in range(-2, 3)]
    assert any(sum(abs(a - b) for a, b in zip(px, CLICK_RED, strict=True)) < 60 for px in near), near
