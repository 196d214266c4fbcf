"""The step viewer's element overlay on real widgets (offscreen Qt) and a real store: a toggle
outlines the step's element list with each element's index, the hovered one is filled and named;
a step without a list says why and has nothing to show."""
from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint
from PySide6.QtGui import QColor

from agent.elements import Element
from app.screenshot_canvas import element_at
from app.step_view import StepViewer
from tests.factories import make_episode

ELEMENTS = [Element("button", "Save", (12, 40, 84, 68)),
            Element("checkbox", "Dark mode", (12, 76, 120, 104), ("checked",)),
            Element("list_item", "Inbox", (150, 20, 310, 190)),
            Element("button", "Delete", (200, 60, 260, 90), ("disabled",))]  # inside the list item: smaller wins


@pytest.fixture
def viewer(qtbot, store):
    ep = make_episode(store, 2)
    ep.steps[0].observation.elements, ep.steps[0].observation.elements_source = list(ELEMENTS), "atspi"
    ep.steps[1].observation.elements_source = "none: no accessibility bus (this session has no D-Bus)"
    store.save_episode(ep, bump_revision=True)
    v = StepViewer(store)
    qtbot.addWidget(v)
    v.resize(1300, 800)
    v.show()
    qtbot.waitExposed(v)
    v.load_episode(ep.id)
    return v


def hover(qtbot, canvas, x, y):
    """Move the pointer over screenshot pixel (x, y)."""
    wx, wy, w, h = canvas.image_rect()
    qtbot.mouseMove(canvas, QPoint(round(wx + x * w / 320), round(wy + y * h / 200)))


def near(color: QColor, hex_: str, tol: int = 40) -> bool:
    want = QColor(hex_)
    return all(abs(a - b) <= tol for a, b in ((color.red(), want.red()), (color.green(), want.green()), (color.blue(), want.blue())))


def test_the_toggle_outlines_the_list_and_names_the_hovered_element(qtbot, viewer):
    canvas, btn = viewer.canvas, viewer.elements_btn
    assert btn.isEnabled() and btn.text() == "Elements (4)" and "atspi" in btn.toolTip()
    assert not canvas.elements_shown()
    hover(qtbot, canvas, 48, 54)
    assert canvas.hovered_element() is None and viewer.element_info.text() == ""  # off: no hover
    btn.click()
    assert canvas.elements_shown() and canvas.hasMouseTracking()
    hover(qtbot, canvas, 40, 50)
    qtbot.waitUntil(lambda: canvas.hovered_element() == 0)
    assert viewer.element_info.text() == "[0] button 'Save' (12,40,84,68)"
    hover(qtbot, canvas, 230, 75)  # the Delete button inside the Inbox row: the smaller box
    qtbot.waitUntil(lambda: canvas.hovered_element() == 3)
    assert viewer.element_info.text() == "[3] button 'Delete' (200,60,260,90) disabled"
    hover(qtbot, canvas, 170, 150)
    qtbot.waitUntil(lambda: canvas.hovered_element() == 2)
    # drawn: the hovered box in orange, the others in teal, each with its index
    img = canvas.grab().toImage()
    dpr = img.devicePixelRatio()
    for i, colour in ((2, "#ff8c00"), (0, "#0b7285")):
        r = canvas.element_rect(i)
        x, y = round(r.left() * dpr), round(r.center().y() * dpr)
        assert near(img.pixelColor(x, y), colour), (i, img.pixelColor(x, y).name())
    hover(qtbot, canvas, 130, 180)  # over no element
    qtbot.waitUntil(lambda: canvas.hovered_element() is None)
    assert viewer.element_info.text() == "Hover a box to see its element"
    btn.click()
    assert not canvas.elements_shown() and viewer.element_info.text() == ""


def test_a_step_without_a_list_says_why(qtbot, viewer):
    viewer.elements_btn.click()  # left on while moving between steps
    viewer.select_step(1)
    btn, canvas = viewer.elements_btn, viewer.canvas
    assert not btn.isEnabled() and btn.text() == "Elements"
    assert btn.toolTip() == "No element list: no accessibility bus (this session has no D-Bus)"
    assert not canvas.elements_shown()
    hover(qtbot, canvas, 48, 54)
    assert canvas.hovered_element() is None
    viewer.select_step(0)  # back to the listed step: the overlay is on again
    assert btn.isEnabled() and canvas.elements_shown()


def test_element_at_picks_the_smallest_box_holding_the_point():
    assert element_at(ELEMENTS, 230, 75) == 3
    assert element_at(ELEMENTS, 160, 30) == 2
    assert element_at(ELEMENTS, 84, 50) is None  # x1 is exclusive
    assert element_at([], 1, 1) is None
