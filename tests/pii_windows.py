"""Labeled screenshots of real Qt windows showing synthetic personal data, for the redaction
tests and benchmark: forms with names, e-mails, phones, card numbers, IBANs, IP addresses and
API keys among ordinary text (dates, prices, order numbers, versions), in several fonts and
pixel sizes. Each value sits in its own QLabel, so its box on the screenshot is known exactly.

    shot = render_window(seed=3, size=(1920, 1080), px=13, family="DejaVu Sans")
    shot.png, shot.truth  # [(kind, (x0, y0, x1, y1) normalized)], kind 'name' included
"""
from __future__ import annotations

import random
from dataclasses import dataclass

FIRST = ["Jane", "Maria", "Robert", "Olivia", "Ahmed", "Chen", "Lukas", "Sofia", "Kwame", "Priya", "Tomás", "Emma"]
LAST = ["Doe", "Garcia", "Smith", "Brown", "Khan", "Wei", "Müller", "Rossi", "Mensah", "Patel", "Silva", "Novak"]
DOMAINS = ["example.com", "mail.example.org", "corp.example.net", "uni-example.edu"]
CARD_PREFIXES = ["4", "51", "55", "37", "6011"]
DISTRACTORS = [
    "Invoice date 2024-03-15", "Total: 1,249.99 EUR", "Order #48213", "Version 3.10.2", "Due in 14 days",
    "Meeting notes for tomorrow", "Page 2 of 17", "Screen 1920x1080", "Quantity 250 units", "Updated at 12:45",
    "Build 20240315", "Room 4.12", "ZIP 10115", "Ref: INV-2024-0042", "Balance 3 400.00",
]
FAMILIES = ["DejaVu Sans", "DejaVu Serif", "DejaVu Sans Mono", "Nimbus Sans"]
SIZES = [11, 13, 16, 20]


def luhn_digit(partial: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(partial)):
        d = int(ch)
        if i % 2 == 0:
            d *= 2
            d -= 9 if d > 9 else 0
        total += d
    return str((10 - total % 10) % 10)


def fake_card(rng: random.Random) -> str:
    prefix = rng.choice(CARD_PREFIXES)
    n = 15 if prefix == "37" else 16
    body = prefix + "".join(rng.choice("0123456789") for _ in range(n - 1 - len(prefix)))
    digits = body + luhn_digit(body)
    groups = [digits[:4], digits[4:10], digits[10:]] if n == 15 else [digits[i:i + 4] for i in range(0, 16, 4)]
    return rng.choice([" ", "-", " "]).join(groups)


def fake_iban(rng: random.Random) -> str:
    bban = "".join(rng.choice("0123456789") for _ in range(18))
    check = 98 - int("".join(str(int(c, 36)) for c in bban + "DE00")) % 97
    s = f"DE{check:02d}{bban}"
    return " ".join(s[i:i + 4] for i in range(0, len(s), 4))


def fake_phone(rng: random.Random) -> str:
    d = lambda n: "".join(rng.choice("0123456789") for _ in range(n))
    return rng.choice([
        f"+1 ({rng.randint(201, 989)}) 555-{d(4)}", f"+44 20 {d(4)} {d(4)}", f"+49 30 {d(7)}",
        f"({rng.randint(201, 989)}) 555-{d(4)}", f"0{rng.randint(20, 89)} {d(4)} {d(4)}", f"+33 6 {d(2)} {d(2)} {d(2)} {d(2)}",
    ])


def fake_values(rng: random.Random) -> dict:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    user = f"{first}.{last}".lower().replace("ü", "ue").replace("á", "a")
    key = "sk-live-" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789") for _ in range(24))
    return {
        "name": f"{first} {last}", "email": f"{user}{rng.randint(1, 99)}@{rng.choice(DOMAINS)}", "phone": fake_phone(rng),
        "card": fake_card(rng), "iban": fake_iban(rng), "ip": f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}",
        "key": key,
    }


LABELS = {"name": "Name", "email": "E-mail", "phone": "Phone", "card": "Card number", "iban": "IBAN", "ip": "Server", "key": "API key"}


@dataclass
class Shot:
    png: bytes
    truth: list  # [(kind, (x0, y0, x1, y1) normalized)]
    values: dict  # kind -> [value, ...]
    px: int
    family: str


def render_window(seed: int, size=(1920, 1080), px: int = 13, family: str = "DejaVu Sans", records: int | None = None) -> Shot:
    """A form window filled with `records` rows of personal data and distractors; needs a
    QApplication (the offscreen platform is enough)."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QPoint, Qt
    from PySide6.QtGui import QFont
    from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

    rng = random.Random(seed)
    w, h = size
    win = QWidget()
    win.setWindowTitle("Customer records")
    win.setStyleSheet("background: white; color: #202124;")
    font = QFont(family)
    font.setPixelSize(px)
    win.setFont(font)
    grid = QGridLayout(win)
    grid.setHorizontalSpacing(px * 2)
    grid.setVerticalSpacing(max(4, px // 2))
    row_h = int(px * 1.9)
    n = records or max(1, (h - 40) // (row_h * 4))
    values_labels = []
    values = {k: [] for k in LABELS}
    kinds = list(LABELS)
    row = 0
    for _ in range(n):
        vals = fake_values(rng)
        picked = rng.sample(kinds, 4)
        for c, kind in enumerate(picked):
            grid.addWidget(QLabel(LABELS[kind] + ":"), row + c // 2, (c % 2) * 3)
            lab = QLabel(vals[kind])
            lab.setTextInteractionFlags(Qt.TextSelectableByMouse)
            grid.addWidget(lab, row + c // 2, (c % 2) * 3 + 1)
            values_labels.append((kind, lab))
            values[kind].append(vals[kind])
        grid.addWidget(QLabel(rng.choice(DISTRACTORS)), row, 2)
        grid.addWidget(QLabel(rng.choice(DISTRACTORS)), row + 1, 5)
        row += 2
    grid.setRowStretch(row, 1)
    win.resize(w, h)
    win.setAttribute(Qt.WA_DontShowOnScreen, True)
    win.show()
    win.layout().activate()
    pix = win.grab()
    truth = []
    for kind, lab in values_labels:
        fm = lab.fontMetrics()  # the font the label was drawn with
        top_left = lab.mapTo(win, QPoint(0, 0))
        cr = lab.contentsRect()
        tw, th = fm.horizontalAdvance(lab.text()), fm.height()
        x0 = top_left.x() + cr.x()
        y0 = top_left.y() + cr.y() + (cr.height() - th) / 2
        if x0 + tw <= w and y0 + th <= h and x0 >= 0 and y0 >= 0:
            truth.append((kind, (x0 / w, y0 / h, (x0 + tw) / w, (y0 + th) / h)))
    buf = QBuffer()
    buf.open(QIODevice.WriteOnly)
    pix.toImage().save(buf, "PNG")
    win.close()
    win.deleteLater()
    return Shot(bytes(QByteArray(buf.data())), truth, values, px, family)


def score(truth, found, cover: float = 0.9, size=(1920, 1080)) -> dict:
    """Per kind: (true regions covered >= `cover` by the union of found boxes, true regions) and
    (found boxes whose centre lies on a true region of any kind, found boxes)."""
    import numpy as np

    w, h = size
    union = np.zeros((h, w), bool)
    truth_mask = np.zeros((h, w), bool)
    px = lambda r: (int(r[0] * w), int(r[1] * h), max(int(r[0] * w) + 1, int(round(r[2] * w))), max(int(r[1] * h) + 1, int(round(r[3] * h))))
    for _, rect in found:
        a, b, c, d = px(rect)
        union[b:d, a:c] = True
    for _, rect in truth:
        a, b, c, d = px(rect)
        truth_mask[b:d, a:c] = True
    out = {}
    for kind, rect in truth:
        a, b, c, d = px(rect)
        rec = out.setdefault(kind, {"covered": 0, "truth": 0, "right": 0, "found": 0})
        rec["truth"] += 1
        rec["covered"] += bool(union[b:d, a:c].mean() >= cover)
    for kind, rect in found:
        cx, cy = min(w - 1, int((rect[0] + rect[2]) / 2 * w)), min(h - 1, int((rect[1] + rect[3]) / 2 * h))
        rec = out.setdefault(kind, {"covered": 0, "truth": 0, "right": 0, "found": 0})
        rec["found"] += 1
        rec["right"] += bool(truth_mask[cy, cx])
    return out


def render_lines(lines, size=(1100, 420), px: int = 16, family: str = "DejaVu Sans") -> bytes:
    """A plain window showing `lines` one under another (the recording tests' window)."""
    from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt
    from PySide6.QtGui import QFont
    from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

    win = QWidget()
    win.setStyleSheet("background: white; color: #202124;")
    font = QFont(family)
    font.setPixelSize(px)
    win.setFont(font)
    lay = QVBoxLayout(win)
    for text in lines:
        lay.addWidget(QLabel(text))
    lay.addStretch(1)
    win.resize(*size)
    win.setAttribute(Qt.WA_DontShowOnScreen, True)
    win.show()
    win.layout().activate()
    buf = QBuffer()
    buf.open(QIODevice.WriteOnly)
    win.grab().toImage().save(buf, "PNG")
    win.close()
    win.deleteLater()
    return bytes(QByteArray(buf.data()))
