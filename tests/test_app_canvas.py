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


# ---------------------------------------------------------------- the privacy review's box tags
IMAGE = (0.0, 0.0, 800.0, 500.0)


def _overlap(a, b) -> bool:
    return min(a[2], b[2]) > max(a[0], b[0]) and min(a[3], b[3]) > max(a[1], b[1])


def _inside(r, bounds=IMAGE) -> bool:
    return bounds[0] <= r[0] <= r[2] <= bounds[2] and bounds[1] <= r[1] <= r[3] <= bounds[3]


def test_tags_at_the_image_edges_flip_inside_and_keep_clear_of_their_box():
    from app.label_layout import place_labels

    boxes = [(700, 10, 800, 30), (10, 480, 200, 500), (600, 470, 800, 500), (0, 0, 120, 20), (790, 200, 800, 260)]
    tags = place_labels(boxes, [(60, 16)] * len(boxes), IMAGE)
    assert all(_inside(t) for t in tags), tags
    assert not any(_overlap(t, b) for t, b in zip(tags, boxes, strict=True)), tags  # never over the text it names
    assert not any(_overlap(a, b) for i, a in enumerate(tags) for b in tags[i + 1:]), tags
    assert tags[3][0] == 123  # room on the right: it stays beside its box, as before


def test_tags_of_a_crowded_column_at_the_right_edge_do_not_overlap():
    """Eight regions on neighbouring lines (a form), pitch 16 px, tags 18 px tall, flush with
    the right edge: to the right there is no room, and stacked tags would cover each other."""
    from app.label_layout import place_labels

    boxes = [(560, 100 + 16 * i, 800, 114 + 16 * i) for i in range(8)]
    sizes = [(70 + 5 * i, 18) for i in range(8)]
    tags = place_labels(boxes, sizes, IMAGE)
    assert all(_inside(t) for t in tags), tags
    assert not any(_overlap(a, b) for i, a in enumerate(tags) for b in tags[i + 1:]), tags
    assert [round(t[2] - t[0]) for t in tags] == [w for w, _ in sizes]  # full size: nothing cut


def test_tags_always_stay_inside_the_image():
    import random

    from app.label_layout import place_labels

    rng = random.Random(7)
    for _ in range(200):
        boxes = []
        for _ in range(rng.randint(1, 25)):
            x0, y0 = rng.uniform(0, 790), rng.uniform(0, 490)
            boxes.append((x0, y0, rng.uniform(x0 + 1, 800), rng.uniform(y0 + 1, min(500, y0 + 40))))
        sizes = [(rng.uniform(20, 900), rng.uniform(8, 30)) for _ in boxes]  # some wider than the image
        assert all(_inside(t) for t in place_labels(boxes, sizes, IMAGE))
    with pytest.raises(ValueError, match="2 boxes but 1 tag sizes"):
        place_labels([(0, 0, 1, 1)] * 2, [(5, 5)], IMAGE)
