"""What people read: actions in pixels (never 16-digit fractions), counts with the right plural,
hotkeys as keyboards label them, a stop reason said once; and the agent's own strip painted out
of its screenshot."""
from __future__ import annotations

import numpy as np

from agent.executors.desktop import paint_out
from agent.grammar import format_for_display
from agent.schema import Action, ScreenGeometry
from agent.wording import hotkey_label, plural, stop_reason


def test_actions_are_shown_in_screen_pixels_or_short_fractions():
    click = Action("click", {"start_box": (0.45879120879120877, 0.3)})
    assert format_for_display(click, ScreenGeometry.simple(1920, 1080)) == "click(start_box='(880,324)') px"
    assert format_for_display(click) == "click(start_box='(0.459,0.3)')"
    assert format_for_display(Action("type", {"content": "hi"})) == "type(content='hi')"


def test_counts_hotkeys_and_stop_reasons_read_naturally():
    assert [plural(n, "step") for n in (0, 1, 2)] == ["0 steps", "1 step", "2 steps"]
    assert plural(1, "reply", "replies") == "1 reply" and plural(3, "reply", "replies") == "3 replies"
    assert hotkey_label("<ctrl>+<alt>+<shift>+k") == "Ctrl+Alt+Shift+K"
    assert stop_reason("stopped by alice") == "stopped by alice"  # before: "stopped by the supervisor: stopped by alice"
    assert stop_reason(None) == "stopped by the supervisor"
    assert stop_reason("wrong app.") == "stopped by the supervisor: wrong app"


def test_paint_out_covers_the_region_in_grab_pixels_at_scale_two():
    geo = ScreenGeometry(logical_width=100, logical_height=50, physical_width=200, physical_height=100, scale_factor=2.0,
                         origin_x=1000, origin_y=0)  # the second monitor, HiDPI
    pixels = np.zeros((100, 200, 3), np.uint8)
    assert paint_out(pixels, [(1010, 5, 20, 10), (0, 0, 50, 50)], geo) == 1  # the other monitor's region misses
    assert (pixels[10:30, 20:60] == 128).all() and pixels.sum() == 128 * 3 * 20 * 40
