"""Builders of realistic episodes for tests: real PNG screenshots (drawn with PIL), real blobs."""
from __future__ import annotations

import io

from PIL import Image, ImageDraw

from agent.schema import Action, Episode, Observation, Provenance, ScreenGeometry, Step


def screenshot_png(width=320, height=200, label="screen", color=(230, 235, 240)) -> bytes:
    img = Image.new("RGB", (width, height), color)
    d = ImageDraw.Draw(img)
    d.rectangle([20, 20, 120, 60], outline=(0, 0, 0), fill=(200, 210, 255))
    d.text((30, 32), "OK", fill=(0, 0, 0))
    d.text((10, height - 20), label, fill=(60, 60, 60))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def make_episode(store, n_steps=3, *, width=320, height=200, scale=1.0, kind="recording", instruction="Press OK then type hello") -> Episode:
    geometry = ScreenGeometry.simple(width, height, scale)
    steps = []
    actions = [
        ("I should press OK.", Action("click", {"start_box": (70 / width, 40 / height)})),
        ("Now type the greeting.", Action("type", {"content": "hello\n"})),
        ("Scroll down to see more.", Action("scroll", {"start_box": (0.5, 0.5), "direction": "down"})),
        ("Drag the slider.", Action("drag", {"start_box": (0.1, 0.9), "end_box": (0.8, 0.9)})),
        ("Done.", Action("finished", {"content": "all done"})),
    ]
    for i in range(n_steps):
        thought, action = actions[i % len(actions)]
        h = store.put_blob(screenshot_png(width, height, label=f"step {i}"))
        steps.append(
            Step(
                index=i,
                observation=Observation(screenshot=h, width=width, height=height, geometry=geometry, time=float(i)),
                thought=thought,
                action=action,
                provenance=Provenance("human"),
                t_start=float(i),
                t_end=float(i) + 0.2,
            )
        )
    ep = Episode(instruction=instruction, kind=kind, steps=steps)
    store.save_episode(ep)
    return ep


def blob_debris(store):
    """What a writer killed long ago leaves in a blob folder, beside what one writing now has:
    (a blob whose pin expired, a temp file untouched for longer than the grace period, a temp
    file written a moment ago). gc() must remove the first two and keep the third."""
    import os
    import time

    import agent.storage.store as st

    orphan = store.put_blob(b"left by a writer killed yesterday")
    store.execute("UPDATE blob_pins SET at = ? WHERE hash = ?", [time.time() - st.PIN_SECONDS - 60, orphan])
    stale, fresh = store.blob_dir / "ab" / f"{st.TEMP_PREFIX}killed", store.blob_dir / "cd" / f"{st.TEMP_PREFIX}writing"
    for p in (stale, fresh):
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"half a screenshot")
    then = time.time() - st.TEMP_GRACE_SECONDS - 60
    os.utime(stale, (then, then))
    return orphan, stale, fresh


def check_fix(data) -> list[str]:
    """The command line of `python main.py check --fix` on the folder `data`, to run in a process
    of its own (as a person runs it beside a recording app or a running backend)."""
    import sys
    from pathlib import Path

    return [sys.executable, str(Path(__file__).resolve().parents[1] / "main.py"), "--data", str(data), "check", "--fix"]
