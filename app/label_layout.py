"""Where the tag that names a box on an image goes: fully inside the image, and where there is
room clear of the other tags and boxes (a region of personal data near an edge, or two regions
on neighbouring lines, otherwise got a tag cut off at the edge or drawn over its neighbour's).

Pure geometry, no Qt: rectangles are (x0, y0, x1, y1) in one pixel space, y downwards. Greedy:
each box in turn takes the first of its candidate places (right of it, left, below, above, then
further out) that overlaps nothing placed so far, else the place that overlaps least.
"""
from __future__ import annotations

Rect = tuple[float, float, float, float]  # x0, y0, x1, y1

OVER_LABEL = 100.0  # a tag over another tag hides a name; over a box it only hides some pixels
OVER_BOX = 1.0


def _area(a: Rect, b: Rect) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


def _inside(x: float, y: float, w: float, h: float, bounds: Rect) -> Rect:
    """The w x h rectangle at (x, y), moved (and, when larger than bounds, shrunk) into bounds."""
    w, h = min(w, bounds[2] - bounds[0]), min(h, bounds[3] - bounds[1])
    x = min(max(x, bounds[0]), bounds[2] - w)
    y = min(max(y, bounds[1]), bounds[3] - h)
    return (x, y, x + w, y + h)


def _candidates(box: Rect, w: float, h: float, gap: float) -> list[tuple[float, float]]:
    x0, y0, x1, y1 = box
    right, left = x1 + gap, x0 - gap - w
    below, above = y1 + gap, y0 - gap - h
    near = [(right, y0), (left, y0), (x0, below), (x0, above), (x1 - w, below), (x1 - w, above)]
    # further out, for a crowded column of boxes: beside the box one and two tag heights down or up
    far = [(x, y0 + k * (h + gap)) for k in (1, -1, 2, -2) for x in (right, left)]
    return near + far + [(x0, y0)]  # last: over its own box's corner


def place_labels(boxes: list[Rect], sizes: list[tuple[float, float]], bounds: Rect, gap: float = 3.0) -> list[Rect]:
    """A tag rectangle for each box (same order); sizes are the tags' (width, height). Every
    rectangle lies within bounds; none overlaps another tag unless no candidate place could
    avoid it. A tag wider or taller than bounds is shrunk to fit (the caller elides its text)."""
    if len(boxes) != len(sizes):
        raise ValueError(f"{len(boxes)} boxes but {len(sizes)} tag sizes")
    placed: list[Rect] = []
    for i, (box, (w, h)) in enumerate(zip(boxes, sizes, strict=True)):
        others = boxes[:i] + boxes[i + 1:]
        best, best_cost = None, None
        for x, y in _candidates(box, w, h, gap):
            r = _inside(x, y, w, h, bounds)
            cost = (OVER_LABEL * sum(_area(r, p) for p in placed) + OVER_BOX * sum(_area(r, b) for b in others)
                     + OVER_BOX * _area(r, box))  # over its own box: it hides what it names
            if best_cost is None or cost < best_cost:
                best, best_cost = r, cost
            if cost == 0:
                break
        placed.append(best)
    return placed
