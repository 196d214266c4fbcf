"""Pure pieces of the step viewer: the screenshot<->widget mapping, summaries, provenance."""
from __future__ import annotations

import pytest

from agent import coords
from agent.schema import Action, Provenance, ScreenGeometry
from agent.wording import action_summary, visible_text
from app.screenshot_canvas import fit_rect, normalized_to_widget, widget_to_normalized


def test_fit_rect_keeps_aspect_and_centres():
    # a 16:10 image in a wide area: full height, centred horizontally
    x, y, w, h = fit_rect(1280, 800, 1000, 400)
    assert (w, h) == (640, 400)
    assert (x, y) == (180, 0)
    # in a tall area: full width, centred vertically
    x, y, w, h = fit_rect(1280, 800, 640, 1000)
    assert (x, w, h) == (0, 640, 400) and y == 300
    # margin on every side
    x, y, w, h = fit_rect(100, 100, 220, 120, margin=10)
    assert (w, h) == (100, 100) and (x, y) == (60, 10)


def test_fit_rect_rejects_empty_image():
    with pytest.raises(ValueError, match="positive"):
        fit_rect(0, 10, 100, 100)


@pytest.mark.parametrize("point", [(0.0, 0.0), (1.0, 1.0), (0.25, 0.75), (0.123, 0.987)])
def test_normalized_widget_round_trip(point):
    rect = fit_rect(1280, 800, 900, 700, margin=6)
    wx, wy = normalized_to_widget(point, 1280, 800, rect)
    assert rect[0] - 1e-9 <= wx <= rect[0] + rect[2] + 1e-9
    back = widget_to_normalized((wx, wy), 1280, 800, rect)
    assert back == pytest.approx(point, abs=1e-9)


def test_widget_mapping_matches_the_executor_transform():
    """Drawn at 1:1 at the origin, the widget pixel of a point is the screen pixel the
    executor clicks (normalized_to_screen floors the same image coordinate)."""
    geo = ScreenGeometry.simple(1280, 800)
    rect = (0.0, 0.0, 1280.0, 800.0)
    for p in [(0.5, 0.5), (70 / 320, 40 / 200), (0.999, 0.001), (0.3333, 0.6667)]:
        wx, wy = normalized_to_widget(p, 1280, 800, rect)
        assert (int(wx), int(wy)) == coords.normalized_to_screen(p, geo)


def test_widget_mapping_scales_with_the_pixmap():
    rect = (100.0, 50.0, 640.0, 400.0)  # a 1280x800 screenshot shown at half size
    assert normalized_to_widget((0.5, 0.25), 1280, 800, rect) == (420.0, 150.0)
    assert widget_to_normalized((99.0, 60.0), 1280, 800, rect) is None  # left of the pixmap
    assert widget_to_normalized((420.0, 451.0), 1280, 800, rect) is None  # below it


def test_action_summary_uses_screenshot_pixels():
    assert action_summary(Action("click", {"start_box": (0.5, 0.25)}), 320, 200) == "click 160,50"
    assert action_summary(Action("drag", {"start_box": (0.1, 0.9), "end_box": (0.8, 0.9)}), 100, 100) == "drag 10,90 → 80,90"
    assert action_summary(Action("type", {"content": "hi\n"}), 10, 10) == "type “hi⏎”"
    assert action_summary(Action("scroll", {"direction": "down"}), 10, 10) == "scroll down"
    assert visible_text("x" * 100, 10) == "x" * 9 + "…"


def test_edit_of_agent_step_becomes_correction_with_proposal():
    old = Action("click", {"start_box": (0.1, 0.1)})
    new = Action("click", {"start_box": (0.2, 0.2)})
    agent = Provenance("agent", policy_version="v3")
    p = agent.after_edit("t", old, "t", new)
    assert p.source == "corrected" and p.proposal_action == old and p.proposal_thought == "t"
    assert p.policy_version == "v3" and p.decision == "edit"
    # unchanged: nothing to record
    assert agent.after_edit("t", old, "t", old) is agent
    # human stays human; a correction keeps its first proposal
    assert Provenance("human").after_edit("t", old, "u", new).source == "human"
    corr = Provenance("corrected", proposal_action=Action("click", {"start_box": (0.9, 0.9)}))
    assert corr.after_edit("t", old, "u", new).proposal_action.args["start_box"] == (0.9, 0.9)
