"""Coordinate conversion: smart_resize against reference values, and screen -> model -> screen
round trips for random screen sizes, scales and monitor origins."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import coords
from agent.schema import ScreenGeometry


@pytest.mark.parametrize(
    "h,w,expected",
    [
        (1080, 1920, (1092, 1932)),
        (800, 1280, (812, 1288)),
        (2160, 3840, (2156, 3836)),  # 77*28, 137*28: within max_pixels
        (100, 100, (280, 280)),  # too small: scaled up to min_pixels
        (28, 28, (280, 280)),
    ],
)
def test_smart_resize_reference(h, w, expected):
    assert coords.smart_resize(h, w) == expected


def test_smart_resize_limits():
    h, w = coords.smart_resize(10000, 10000)
    assert h % 28 == 0 and w % 28 == 0 and h * w <= coords.MAX_PIXELS
    h, w = coords.smart_resize(50, 50)
    assert h * w >= coords.MIN_PIXELS
    with pytest.raises(coords.CoordinateError, match="aspect ratio"):
        coords.smart_resize(10, 2500)
    with pytest.raises(coords.CoordinateError, match="positive"):
        coords.smart_resize(0, 100)


def test_model_to_screen_known_points():
    g = ScreenGeometry.simple(1920, 1080)
    # the resized image is 1932x1092: its centre is the screen's centre
    assert coords.model_to_screen((966, 546), coords.SMART_RESIZE, 1920, 1080, g) == (960, 540)
    assert coords.model_to_screen((500, 500), coords.RELATIVE_1000, 1920, 1080, g) == (960, 540)
    # HiDPI: a 2880x1800 screenshot of a 1440x900 logical screen at scale 2
    g2 = ScreenGeometry.simple(2880, 1800, scale=2.0)
    assert g2.logical_width == 1440
    assert coords.model_to_screen((500, 500), coords.RELATIVE_1000, 2880, 1800, g2) == (720, 450)
    # a second monitor to the right
    g3 = ScreenGeometry.simple(1920, 1080, origin=(1920, 0))
    assert coords.model_to_screen((0, 0), coords.RELATIVE_1000, 1920, 1080, g3) == (1920, 0)
    assert coords.model_to_screen((1000, 1000), coords.RELATIVE_1000, 1920, 1080, g3) == (3839, 1079)


def test_out_of_extent_raises_coordinate_error():
    with pytest.raises(coords.CoordinateError, match="outside"):
        coords.model_to_normalized((2000, 10), coords.SMART_RESIZE, 1920, 1080)
    with pytest.raises(coords.CoordinateError, match="outside the monitor"):
        coords.screen_to_normalized((5000, 10), ScreenGeometry.simple(1920, 1080))
    with pytest.raises(coords.CoordinateError, match="unknown coordinate space"):
        coords.model_extent("pixels", 10, 10)


@st.composite
def screens(draw):
    scale = draw(st.sampled_from([1.0, 1.25, 1.5, 1.75, 2.0, 3.0]))
    lw = draw(st.integers(320, 3840))
    lh = draw(st.integers(240, 2400))
    assume_ratio = max(lw, lh) / min(lw, lh) <= 200
    assert assume_ratio
    pw, ph = round(lw * scale), round(lh * scale)
    ox = draw(st.sampled_from([0, -1920, 1920, 2560]))
    oy = draw(st.sampled_from([0, -1080, 1440]))
    g = ScreenGeometry(lw, lh, pw, ph, scale, ox, oy)
    x = draw(st.integers(ox, ox + lw - 1))
    y = draw(st.integers(oy, oy + lh - 1))
    return g, (x, y)


@settings(max_examples=500, deadline=None)
@given(screens())
def test_screen_model_screen_round_trip_smart_resize(data):
    g, pt = data
    model = coords.screen_to_model(pt, coords.SMART_RESIZE, g.physical_width, g.physical_height, g)
    back = coords.model_to_screen(model, coords.SMART_RESIZE, g.physical_width, g.physical_height, g)
    assert abs(back[0] - pt[0]) <= 1 and abs(back[1] - pt[1]) <= 1, (g, pt, model, back)


@settings(max_examples=300, deadline=None)
@given(screens())
def test_screen_model_screen_round_trip_relative1000(data):
    g, pt = data
    model = coords.screen_to_model(pt, coords.RELATIVE_1000, g.physical_width, g.physical_height, g)
    back = coords.model_to_screen(model, coords.RELATIVE_1000, g.physical_width, g.physical_height, g)
    # 1000 bins: the error is at most half a bin, plus the pixel grid
    tol_x = g.logical_width / 1000 / 2 + 1
    tol_y = g.logical_height / 1000 / 2 + 1
    assert abs(back[0] - pt[0]) <= tol_x and abs(back[1] - pt[1]) <= tol_y


@settings(max_examples=300, deadline=None)
@given(screens())
def test_screen_normalized_screen_is_exact(data):
    g, pt = data
    assert coords.normalized_to_screen(coords.screen_to_normalized(pt, g), g) == pt
