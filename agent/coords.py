"""Coordinate spaces, as pure functions.

Three spaces meet here:
- model space: what a model writes. UI-TARS-1.5 (Qwen2.5-VL) writes absolute pixels of the
  screenshot after `smart_resize`; UI-TARS-1.0 and many other models write 0..1000 relative.
- normalized: fractions of the screenshot (0..1). This is what the schema stores.
- screen: the OS input space (logical pixels, global: monitor origin included), what the
  executor clicks and what the UI's click preview draws.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from agent.errors import TandemError

if TYPE_CHECKING:  # a type only: agent.schema imports elements, which import this module
    from agent.schema import ScreenGeometry

IMAGE_FACTOR = 28
MIN_PIXELS = 100 * 28 * 28
MAX_PIXELS = 16384 * 28 * 28
MAX_RATIO = 200

SMART_RESIZE = "smart-resize"
RELATIVE_1000 = "relative1000"
SPACES = (SMART_RESIZE, RELATIVE_1000)


class CoordinateError(TandemError, ValueError):
    pass


def smart_resize(
    height: int,
    width: int,
    factor: int = IMAGE_FACTOR,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    max_ratio: float = MAX_RATIO,
) -> tuple[int, int]:
    """The image size Qwen2.5-VL sees: both sides multiples of `factor`, the area within
    [min_pixels, max_pixels], the aspect ratio kept as close as possible. Returns (h, w)."""
    if height <= 0 or width <= 0:
        raise CoordinateError(f"image size must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > max_ratio:
        raise CoordinateError(
            f"aspect ratio must be at most {max_ratio}, got {max(height, width) / min(height, width):.1f} ({width}x{height})"
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def model_extent(space: str, image_width: int, image_height: int) -> tuple[int, int]:
    """The (width, height) that model-space coordinates span for a screenshot of this size."""
    if space == SMART_RESIZE:
        h, w = smart_resize(image_height, image_width)
        return w, h
    if space == RELATIVE_1000:
        return 1000, 1000
    raise CoordinateError(f"unknown coordinate space {space!r}; expected one of {', '.join(SPACES)}")


def model_to_normalized(point, space: str, image_width: int, image_height: int) -> tuple[float, float]:
    w, h = model_extent(space, image_width, image_height)
    x, y = point
    if not (0 <= x <= w and 0 <= y <= h):
        raise CoordinateError(f"point ({x:g}, {y:g}) lies outside the {space} extent {w}x{h}")
    return (x / w, y / h)


def normalized_to_model(point, space: str, image_width: int, image_height: int) -> tuple[int, int]:
    w, h = model_extent(space, image_width, image_height)
    return (min(w, max(0, round(point[0] * w))), min(h, max(0, round(point[1] * h))))


def normalized_to_screen(point, geometry: ScreenGeometry) -> tuple[int, int]:
    """Normalized screenshot fractions -> integer screen pixels in the OS input space."""
    x = geometry.origin_x + point[0] * geometry.logical_width
    y = geometry.origin_y + point[1] * geometry.logical_height
    # keep the point on this monitor: a fraction of exactly 1.0 is the last pixel
    x = min(geometry.origin_x + geometry.logical_width - 1, max(geometry.origin_x, math.floor(x)))
    y = min(geometry.origin_y + geometry.logical_height - 1, max(geometry.origin_y, math.floor(y)))
    return int(x), int(y)


def screen_to_normalized(point, geometry: ScreenGeometry) -> tuple[float, float]:
    """Screen pixels -> normalized fractions (the pixel's centre, so the round trip is exact)."""
    x = (point[0] - geometry.origin_x + 0.5) / geometry.logical_width
    y = (point[1] - geometry.origin_y + 0.5) / geometry.logical_height
    if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        raise CoordinateError(f"screen point {tuple(point)} lies outside the monitor {geometry.to_dict()}")
    return (x, y)


def model_to_screen(point, space: str, image_width: int, image_height: int, geometry: ScreenGeometry):
    return normalized_to_screen(model_to_normalized(point, space, image_width, image_height), geometry)


def screen_to_model(point, space: str, image_width: int, image_height: int, geometry: ScreenGeometry):
    return normalized_to_model(screen_to_normalized(point, geometry), space, image_width, image_height)


def normalized_to_image(point, image_width: int, image_height: int) -> tuple[float, float]:
    """Normalized -> screenshot pixel coordinates (floats), for drawing on the screenshot."""
    return (point[0] * image_width, point[1] * image_height)


def image_to_normalized(point, image_width: int, image_height: int) -> tuple[float, float]:
    return (min(1.0, max(0.0, point[0] / image_width)), min(1.0, max(0.0, point[1] / image_height)))
