"""Personal data on a screenshot: read its text (OCR), find personal data in each line with the
text recognizers, and turn each span into a box; then blur boxes into a new image.

A span's box is cut from its line's box in proportion to the widths of the characters before, in
and after it (OCR gives line boxes; per-character boxes cost three times as much). Widths are a
sans-serif font's advances (ADVANCE): counting every character as equally wide put a phone number
after narrow letters ("call her at 4155550132") one digit too far right, and its first digit
stayed legible. The box is widened by one average character on each side, for fonts whose
widths differ (serif, monospace), and kept inside the line.
Boxes are normalized (x0, y0, x1, y1 as 0..1 fractions of the image), like every coordinate
stored in an episode.
"""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from agent.redaction import RedactionError
from agent.redaction.patterns import KINDS, find_pii

PAD_CHARS = 1.0  # widen each box by this many average character widths on each side
PAD_Y = 0.15  # and by this fraction of the line height above and below
# Advance widths (thousandths of an em) of a common sans-serif screen font (Helvetica's metrics,
# which Arial, Liberation Sans and Nimbus Sans share); characters not listed count as DEFAULT_ADVANCE
# and East Asian wide ones as a full em.
ADVANCE = {
    **dict.fromkeys("0123456789abdeghnopqu#$_?L", 556), **dict.fromkeys("cksvxyzJ", 500),
    **dict.fromkeys("ilj", 222), **dict.fromkeys(" ft.,:;!/\\[]I", 278), **dict.fromkeys("r()-`", 333),
    "m": 833, "w": 722, "@": 1015, "%": 889, "&": 667, "*": 389, "'": 191, '"': 355, "|": 260, "^": 469,
    **dict.fromkeys("{}", 334), **dict.fromkeys("+=<>~", 584),
    **dict.fromkeys("ABEKPSVXY", 667), **dict.fromkeys("CDHNRU", 722), **dict.fromkeys("FTZ", 611),
    **dict.fromkeys("GOQ", 778), "M": 833, "W": 944,
}
DEFAULT_ADVANCE = 556


@dataclass(frozen=True)
class FoundRegion:
    kind: str
    rect: tuple[float, float, float, float]  # normalized
    score: float  # the OCR's confidence in the line


def decode(data: bytes):
    """An encoded image (PNG, JPEG, WebP) -> H x W x 3 BGR uint8 array."""
    import cv2
    import numpy as np

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise RedactionError(f"not a decodable image ({len(data)} bytes starting {data[:8]!r})")
    return img


def _advance(c: str) -> int:
    if c in ADVANCE:
        return ADVANCE[c]
    return 1000 if unicodedata.east_asian_width(c) in "WF" else DEFAULT_ADVANCE


def span_box(line_box, text: str, start: int, end: int, pad_chars: float = PAD_CHARS):
    """The pixel box of text[start:end] inside a line box, padded (see the module docstring)."""
    x0, y0, x1, y1 = line_box
    widths = [_advance(c) for c in text] or [DEFAULT_ADVANCE]
    scale = (x1 - x0) / sum(widths)  # pixels per thousandth of an em
    pad = pad_chars * (x1 - x0) / len(widths)
    a = max(x0, x0 + scale * sum(widths[:start]) - pad)
    b = min(x1, x0 + scale * sum(widths[:end]) + pad)
    dy = (y1 - y0) * PAD_Y
    return a, y0 - dy, b, y1 + dy


def find_regions(image, engine, kinds=KINDS) -> list[FoundRegion]:
    """Personal data visible in `image` (BGR array) as normalized boxes."""
    h, w = image.shape[:2]
    out = []
    for line in engine.read(image):
        for span in find_pii(line.text, kinds):
            a, b, c, d = span_box(line.box, line.text, span.start, span.end)
            rect = (max(0.0, a / w), max(0.0, b / h), min(1.0, c / w), min(1.0, d / h))
            if rect[2] > rect[0] and rect[3] > rect[1]:
                out.append(FoundRegion(span.kind, tuple(round(v, 5) for v in rect), round(line.score, 3)))
    return out


def check_rect(rect) -> tuple[float, float, float, float]:
    try:
        x0, y0, x1, y1 = (float(v) for v in rect)
    except (TypeError, ValueError):
        raise RedactionError(f"a box must be four numbers (x0, y0, x1, y1), got {rect!r}") from None
    if not (0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1):
        raise RedactionError(f"a box must be normalized with x0 < x1 and y0 < y1 in 0..1, got {rect!r}")
    return x0, y0, x1, y1


def blur_rects(data: bytes, rects, strength: int = 12) -> bytes:
    """Pixelate then blur each normalized rect of an encoded image; the same format comes back.
    Pixelation first: a Gaussian blur alone can leave large text legible."""
    import cv2

    img = decode(data)
    h, w = img.shape[:2]
    for rect in rects:
        x0, y0, x1, y1 = check_rect(rect)
        a, b = int(x0 * w), int(y0 * h)
        c, d = max(a + 1, int(round(x1 * w))), max(b + 1, int(round(y1 * h)))
        roi = img[b:d, a:c]
        cell = max(2, min(strength, (d - b) // 2 or 1))
        small = cv2.resize(roi, (max(1, roi.shape[1] // cell), max(1, roi.shape[0] // cell)), interpolation=cv2.INTER_AREA)
        roi = cv2.resize(small, (roi.shape[1], roi.shape[0]), interpolation=cv2.INTER_NEAREST)
        img[b:d, a:c] = cv2.GaussianBlur(roi, (0, 0), cell)
    if data[:3] == b"\xff\xd8\xff":
        ext, params = ".jpg", [cv2.IMWRITE_JPEG_QUALITY, 90]
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        ext, params = ".webp", [cv2.IMWRITE_WEBP_QUALITY, 90]
    else:
        ext, params = ".png", []
    ok, buf = cv2.imencode(ext, img, params)
    if not ok:
        raise RedactionError(f"could not re-encode the redacted screenshot as {ext}")
    return buf.tobytes()
