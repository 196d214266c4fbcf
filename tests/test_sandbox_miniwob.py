"""The MiniWoB++ adapter: key mapping always; a real episode where miniwob and chromium exist."""
from __future__ import annotations

import pytest

from trainer.sandbox.miniwob_env import available, miniwob_key


def test_key_mapping():
    assert miniwob_key("ctrl a") == "C-a"
    assert miniwob_key("enter") == "<Enter>"
    assert miniwob_key("ctrl+shift+tab") == "C-S-<Tab>"
    with pytest.raises(ValueError, match="ctrl"):
        miniwob_key("ctrl")


def test_click_test_episode():
    missing = available()
    if missing:
        pytest.skip(f"MiniWoB++ not available here: {missing}")
    from agent.schema import Action
    from trainer.sandbox.miniwob_env import MiniWoBEnv

    env = MiniWoBEnv("click-test")
    try:
        obs, info = env.reset(seed=0)
        assert obs["screenshot"].ndim == 3 and "Click" in info["instruction"]
        _, _, term, trunc, _ = env.step(Action("click", {"start_box": (0.5, 0.5)}))
        assert isinstance(term, bool) and isinstance(trunc, bool)
    finally:
        env.close()
