"""A screenshot scaled to fit (aspect kept) with the step's action drawn on it, and point editing.

Points go normalized -> screenshot pixels through agent.coords.normalized_to_image (the transform
the executor's coordinate chain starts from), then screenshot pixels -> widget pixels by the
scale and offset of the fitted pixmap rectangle. Both directions are pure functions below.

With an element list shown (set_elements, set_elements_shown), each element's box is outlined
with its index in the list, and the one under the pointer is filled and named.
"""
from __future__ import annotations

import math

from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QFont, QFontMetricsF, QPainter, QPainterPath, QPen, QPixmap, QPolygonF
from PySide6.QtWidgets import QSizePolicy, QWidget

from agent import coords
from agent.actions import REGISTRY
from agent.schema import Action
from agent.wording import visible_text

Rect = tuple[float, float, float, float]  # x, y, width, height in widget pixels

ONE_POINT = ("click", "left_double", "right_single", "long_press", "scroll")
COLORS = {
    "click": "#e5383b",
    "left_double": "#f77f00",
    "right_single": "#9b5de5",
    "long_press": "#d00070",
    "drag": "#1f7ae0",
    "scroll": "#079a6c",
    "finished": "#2b9348",
    "call_user": "#e09f3e",
}
DRAG_THRESHOLD = 4  # widget pixels a press must move to count as press-and-drag


# ---------------------------------------------------------------- pure geometry
def fit_rect(image_w: float, image_h: float, area_w: float, area_h: float, margin: float = 0.0) -> Rect:
    """The largest rectangle of the image's aspect that fits the area (minus margin), centred."""
    if image_w <= 0 or image_h <= 0:
        raise ValueError(f"image size must be positive, got {image_w}x{image_h}")
    aw, ah = max(1.0, area_w - 2 * margin), max(1.0, area_h - 2 * margin)
    scale = min(aw / image_w, ah / image_h)
    w, h = image_w * scale, image_h * scale
    return ((area_w - w) / 2, (area_h - h) / 2, w, h)


def normalized_to_widget(point, image_w: int, image_h: int, rect: Rect) -> tuple[float, float]:
    """Normalized screenshot point -> widget coordinates, given where the pixmap is drawn."""
    ix, iy = coords.normalized_to_image(point, image_w, image_h)
    return (rect[0] + ix * rect[2] / image_w, rect[1] + iy * rect[3] / image_h)


def element_at(elements, x: float, y: float) -> int | None:
    """The index of the smallest element whose box (screenshot pixels) holds the point, or None."""
    best, area = None, None
    for i, e in enumerate(elements or ()):
        if e.contains(x, y):
            a = (e.box[2] - e.box[0]) * (e.box[3] - e.box[1])
            if area is None or a < area:
                best, area = i, a
    return best


def element_line(index: int, e) -> str:
    """How the hovered element is named: as the model reads it, in screenshot pixels."""
    tail = "".join(f" {s}" for s in e.states) + (f" value '{e.value}'" if e.value else "")
    return f"[{index}] {e.role} '{e.name}' ({e.box[0]},{e.box[1]},{e.box[2]},{e.box[3]}){tail}"


def widget_to_normalized(pos, image_w: int, image_h: int, rect: Rect) -> tuple[float, float] | None:
    """Widget coordinates -> normalized screenshot point; None outside the drawn pixmap."""
    x, y = pos
    if not (rect[0] <= x <= rect[0] + rect[2] and rect[1] <= y <= rect[1] + rect[3]):
        return None
    ix = (x - rect[0]) * image_w / rect[2]
    iy = (y - rect[1]) * image_h / rect[3]
    return coords.image_to_normalized((ix, iy), image_w, image_h)


# ---------------------------------------------------------------- widget
class ScreenshotCanvas(QWidget):
    """Draws one observation and one action. Clicking moves the action's point(s):
    one-point actions take the clicked point (press and move to slide it); a drag takes
    press-and-drag start->end, or a click on the start then a click on the end."""

    pointsEdited = Signal(object)  # {param_name: (x, y) normalized}
    navigate = Signal(int)  # -1 / +1 from the Up/Down keys
    regionSelected = Signal(object)  # (x0, y0, x1, y1) normalized, in region mode; None: Esc cancelled it
    elementHovered = Signal(object)  # the index of the element under the pointer, or None

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Expanding)
        self.setMinimumSize(320, 200)
        self.setFocusPolicy(Qt.StrongFocus)
        self.setMouseTracking(False)
        self._pixmap: QPixmap | None = None
        self._scaled: QPixmap | None = None
        self._image_w, self._image_h = 16, 10
        self._action: Action | None = None
        self._proposal: Action | None = None  # the agent's original action, beside a correction
        self._missing = ""
        self._press: tuple[float, float] | None = None  # widget position of the current press
        self._pending_start: tuple[float, float] | None = None  # drag: start chosen, end awaited
        self._dragging = False
        self._region_mode = False  # press-drag-release selects a rectangle instead of moving points
        self._region: tuple[tuple[float, float], tuple[float, float]] | None = None  # widget corners
        self._elements: list = []  # agent.elements.Element, screenshot pixels
        self._elements_shown = False
        self._hovered: int | None = None

    # ------------------------------------------------------------ state
    def set_region_mode(self, on: bool) -> None:
        """In region mode a press-drag-release on the screenshot emits regionSelected."""
        self._region_mode, self._region = bool(on), None
        self.setCursor(Qt.CrossCursor if on or self._editable_points() else Qt.ArrowCursor)
        self.update()

    def region_mode(self) -> bool:
        return self._region_mode

    def set_observation(self, pixmap: QPixmap | None, image_w: int, image_h: int, missing: str = "") -> None:
        """Show a screenshot of image_w x image_h pixels; with no pixmap, an empty frame of
        that aspect and the `missing` message (points stay editable)."""
        self._pixmap = pixmap if pixmap is not None and not pixmap.isNull() else None
        self._scaled = None
        self._image_w, self._image_h = max(1, int(image_w)), max(1, int(image_h))
        self._missing = missing
        self._pending_start = None
        self.update()

    def set_action(self, action: Action | None) -> None:
        if action is None or self._action is None or action.name != self._action.name:
            self._pending_start = None
        self._action = action
        self.setCursor(Qt.CrossCursor if self._editable_points() else Qt.ArrowCursor)
        self.update()

    def set_elements(self, elements) -> None:
        """The observation's element list (None or [] : none)."""
        self._elements = list(elements or ())
        self._set_hovered(None)
        self.update()

    def set_elements_shown(self, on: bool) -> None:
        self._elements_shown = bool(on)
        self.setMouseTracking(self._elements_shown)  # hover names an element without a button held
        self._set_hovered(None)
        self.update()

    def elements_shown(self) -> bool:
        return self._elements_shown

    def hovered_element(self) -> int | None:
        return self._hovered

    def _set_hovered(self, index: int | None) -> None:
        if index != self._hovered:
            self._hovered = index
            self.elementHovered.emit(index)
            self.update()

    def _hover(self, pos) -> None:
        if not (self._elements_shown and self._elements):
            return
        x, y, w, h = self.image_rect()
        if not (x <= pos[0] <= x + w and y <= pos[1] <= y + h):
            return self._set_hovered(None)
        self._set_hovered(element_at(self._elements, (pos[0] - x) * self._image_w / w, (pos[1] - y) * self._image_h / h))

    def element_rect(self, index: int) -> QRectF:
        """Where element `index`'s box is drawn, in widget pixels."""
        x, y, w, h = self.image_rect()
        sx, sy = w / self._image_w, h / self._image_h
        x0, y0, x1, y1 = self._elements[index].box
        return QRectF(x + x0 * sx, y + y0 * sy, (x1 - x0) * sx, (y1 - y0) * sy)

    def set_proposal(self, action: Action | None) -> None:
        """The agent's original proposal, drawn dashed and grey under the corrected action."""
        self._proposal = action
        self.update()

    def image_rect(self) -> Rect:
        """Where the screenshot is drawn, in widget pixels."""
        return fit_rect(self._image_w, self._image_h, self.width(), self.height(), margin=6)

    def point_to_widget(self, point) -> tuple[float, float]:
        return normalized_to_widget(point, self._image_w, self._image_h, self.image_rect())

    def sizeHint(self) -> QSize:
        return QSize(960, 600)

    def _editable_points(self) -> list[str]:
        if self._action is None:
            return []
        spec = REGISTRY.get(self._action.name)
        return [p.name for p in spec.params if p.kind == "point"] if spec else []

    def pending_drag_start(self) -> bool:
        return self._pending_start is not None

    # ------------------------------------------------------------ input
    def _normalized(self, pos) -> tuple[float, float] | None:
        return widget_to_normalized(pos, self._image_w, self._image_h, self.image_rect())

    def mousePressEvent(self, event):
        names = self._editable_points()
        pos = (event.position().x(), event.position().y())
        if self._region_mode:
            if event.button() == Qt.LeftButton and self._normalized(pos) is not None:
                self._region = (pos, pos)
                event.accept()
            return
        if event.button() != Qt.LeftButton or not names or self._normalized(pos) is None:
            return super().mousePressEvent(event)
        self.setFocus(Qt.MouseFocusReason)
        self._press, self._dragging = pos, False
        if names == ["start_box"] or self._action.name in ONE_POINT:
            self.pointsEdited.emit({"start_box": self._normalized(pos)})
        event.accept()

    def mouseMoveEvent(self, event):
        self._hover((event.position().x(), event.position().y()))
        if self._region is not None:
            self._region = (self._region[0], (event.position().x(), event.position().y()))
            self.update()
            return
        if self._press is None:
            return
        pos = (event.position().x(), event.position().y())
        p = self._normalized(pos)
        if p is None:
            return
        if math.dist(pos, self._press) >= DRAG_THRESHOLD:
            self._dragging = True
        if self._action.name in ONE_POINT:
            self.pointsEdited.emit({"start_box": p})
        elif self._action.name == "drag" and self._dragging:
            self.pointsEdited.emit({"start_box": self._normalized(self._press), "end_box": p})
            self._pending_start = None

    def mouseReleaseEvent(self, event):
        if self._region is not None:
            start, _ = self._region
            self._region = None
            self.update()
            rect = self._normalized_rect(start, (event.position().x(), event.position().y()))
            if rect is not None:
                self.regionSelected.emit(rect)
            return
        if self._press is None:
            return super().mouseReleaseEvent(event)
        press, self._press = self._press, None
        if self._action is None or self._action.name != "drag":
            return
        pos = (event.position().x(), event.position().y())
        p = self._normalized(pos)
        if self._dragging and p is not None:
            self.pointsEdited.emit({"start_box": self._normalized(press), "end_box": p})
        elif self._pending_start is None:
            self._pending_start = press  # first click: the start; the next click is the end
        else:
            start = self._normalized(self._pending_start)
            self._pending_start = None
            self.pointsEdited.emit({"start_box": start, "end_box": p or self._normalized(press)})
        self._dragging = False
        self.update()

    def _normalized_rect(self, a, b) -> tuple[float, float, float, float] | None:
        """Two widget corners -> a normalized (x0, y0, x1, y1) clamped to the image; None when
        smaller than DRAG_THRESHOLD (a click, not a rectangle)."""
        if abs(a[0] - b[0]) < DRAG_THRESHOLD or abs(a[1] - b[1]) < DRAG_THRESHOLD:
            return None
        x, y, w, h = self.image_rect()
        xs = sorted(min(max((v - x) / w, 0.0), 1.0) for v in (a[0], b[0]))
        ys = sorted(min(max((v - y) / h, 0.0), 1.0) for v in (a[1], b[1]))
        if xs[0] >= xs[1] or ys[0] >= ys[1]:
            return None
        return (xs[0], ys[0], xs[1], ys[1])

    def keyPressEvent(self, event):
        if event.key() == Qt.Key_Escape and self._region_mode:
            self.set_region_mode(False)
            self.regionSelected.emit(None)
        elif event.key() in (Qt.Key_Up, Qt.Key_Down) and not event.modifiers():
            self.navigate.emit(-1 if event.key() == Qt.Key_Up else 1)
        elif event.key() == Qt.Key_Escape and self._pending_start is not None:
            self._pending_start = None
            self.update()
        else:
            super().keyPressEvent(event)

    # ------------------------------------------------------------ drawing
    def leaveEvent(self, event):
        self._set_hovered(None)
        super().leaveEvent(event)

    def resizeEvent(self, event):
        self._scaled = None
        super().resizeEvent(event)

    def paintEvent(self, event):
        p = QPainter(self)
        p.setRenderHint(QPainter.Antialiasing)
        p.fillRect(self.rect(), self.palette().window())
        x, y, w, h = self.image_rect()
        target = QRectF(x, y, w, h)
        if self._pixmap is not None:
            size = QSize(max(1, round(w)), max(1, round(h)))
            if self._scaled is None or self._scaled.size() != size:
                self._scaled = self._pixmap.scaled(size, Qt.IgnoreAspectRatio, Qt.SmoothTransformation)
            p.drawPixmap(target.topLeft(), self._scaled)
        else:
            p.fillRect(target, QColor("#3a3d42"))
            p.setPen(QColor("#d0d0d0"))
            p.drawText(target, Qt.AlignCenter, self._missing or "no screenshot")
        p.setPen(QPen(QColor(0, 0, 0, 60), 1))
        p.drawRect(target.adjusted(-0.5, -0.5, 0.5, 0.5))
        if self._elements_shown and self._elements:
            self._draw_elements(p, target)
        if self._proposal is not None:
            self._draw_proposal(p, self._proposal)
        if self._action is not None:
            self._draw_action(p, self._action, target)
        if self._region is not None:
            (ax, ay), (bx, by) = self._region
            p.setPen(QPen(QColor("#c92a2a"), 2, Qt.DashLine))
            p.setBrush(QColor(201, 42, 42, 50))
            p.drawRect(QRectF(QPointF(min(ax, bx), min(ay, by)), QPointF(max(ax, bx), max(ay, by))))
            p.setBrush(Qt.NoBrush)
        elif self._region_mode:
            self._label(p, target, "Drag a rectangle over what to hide", QPointF(target.center().x(), target.top() + 14),
                        "#c92a2a")
        if self._pending_start is not None:
            self._marker(p, QPointF(*self._pending_start), COLORS["drag"], 8)
            self._label(p, target, "Now click the drag's end point (Esc cancels)", QPointF(target.center().x(), target.top() + 14), "#1f7ae0")
        p.end()

    def _pt(self, point) -> QPointF:
        return QPointF(*self.point_to_widget(point))

    def _draw_action(self, p: QPainter, a: Action, target: QRectF) -> None:
        name = a.name
        color = COLORS.get(name, "#e5383b")
        start = a.args.get("start_box")
        if name in ("click", "left_double", "right_single", "long_press") and start:
            c = self._pt(start)
            self._marker(p, c, color, 13, crosshair=True)
            if name == "left_double":
                self._ring(p, c, color, 19)
                self._tag(p, c, "2×", color)
            elif name == "right_single":
                self._tag(p, c, "right", color)
            elif name == "long_press":
                self._tag(p, c, "hold", color)
        elif name == "drag" and start and a.args.get("end_box"):
            s, e = self._pt(start), self._pt(a.args["end_box"])
            self._arrow(p, s, e, color)
            self._marker(p, s, color, 8)
            self._tag(p, s, "drag", color)
        elif name == "scroll":
            c = self._pt(start) if start else target.center()
            d = a.args.get("direction", "down")
            vec = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}.get(d, (0, 1))
            length = max(40.0, min(target.width(), target.height()) * 0.12)
            self._marker(p, c, color, 7)
            self._arrow(p, c, QPointF(c.x() + vec[0] * length, c.y() + vec[1] * length), color)
            self._tag(p, c, f"scroll {d}", color)
        elif name == "type":
            self._label(p, target, "type  “" + visible_text(str(a.args.get("content", ""))) + "”", self._bottom(target))
        elif name == "hotkey":
            self._label(p, target, "⌨  " + str(a.args.get("key", "")), self._bottom(target))
        elif name in ("finished", "call_user"):
            text = "Finished" if name == "finished" else "Call user: the agent asks for help"
            content = a.args.get("content")
            if content:
                text += ": " + visible_text(str(content), 120)
            self._banner(p, target, text, color)
        else:  # wait, press_home, open_app, terminal tools: a caption of the call
            args = ", ".join(f"{k}={visible_text(str(v), 40)}" for k, v in a.args.items())
            self._label(p, target, f"{name}({args})" if args else name, self._bottom(target))

    def _draw_elements(self, p: QPainter, target: QRectF) -> None:
        """Every element's box with its index; the hovered one filled and named along the top."""
        f = QFont(self.font())
        f.setPixelSize(10)
        f.setBold(True)
        p.setFont(f)
        fm = QFontMetricsF(f)
        for i in range(len(self._elements)):
            r = self.element_rect(i)
            hovered = i == self._hovered
            p.setPen(QPen(QColor("#ff8c00" if hovered else "#0b7285"), 3 if hovered else 2))
            p.setBrush(QColor(255, 140, 0, 60) if hovered else Qt.NoBrush)
            p.drawRect(r)
            tag = QRectF(r.left(), r.top(), fm.horizontalAdvance(str(i)) + 6, fm.height() + 2)
            p.setPen(Qt.NoPen)
            p.setBrush(QColor("#ff8c00" if hovered else "#0b7285"))
            p.drawRect(tag)
            p.setPen(QColor("white"))
            p.drawText(tag, Qt.AlignCenter, str(i))
        p.setBrush(Qt.NoBrush)
        if self._hovered is not None:
            e = self._elements[self._hovered]
            self._label(p, target, element_line(self._hovered, e), QPointF(target.center().x(), target.top() + 16), "#ff8c00")

    def _draw_proposal(self, p: QPainter, a: Action) -> None:
        pts = [self._pt(v) for v in a.points()]
        if not pts:
            return
        halo = QPen(QColor(255, 255, 255, 200), 4)
        dash = QPen(QColor("#5f6368"), 2, Qt.DashLine)
        p.setBrush(Qt.NoBrush)
        for q in (halo, dash):
            p.setPen(q)
            for c in pts:
                p.drawEllipse(c, 11, 11)
            if len(pts) == 2:
                p.drawLine(pts[0], pts[1])
        self._tag(p, pts[0], "proposed", "#5f6368")

    @staticmethod
    def _bottom(target: QRectF) -> QPointF:
        return QPointF(target.center().x(), target.bottom() - 28)

    @staticmethod
    def _pens(color: str, width: float):
        return QPen(QColor(255, 255, 255, 230), width + 3, Qt.SolidLine, Qt.RoundCap), QPen(QColor(color), width, Qt.SolidLine, Qt.RoundCap)

    def _marker(self, p: QPainter, c: QPointF, color: str, r: float, crosshair: bool = False) -> None:
        halo, pen = self._pens(color, 2.5)
        for q in (halo, pen):  # a white halo under the colour reads on any background
            p.setPen(q)
            p.setBrush(Qt.NoBrush)
            p.drawEllipse(c, r, r)
            if crosshair:
                p.drawLine(QPointF(c.x() - r - 7, c.y()), QPointF(c.x() - 3, c.y()))
                p.drawLine(QPointF(c.x() + 3, c.y()), QPointF(c.x() + r + 7, c.y()))
                p.drawLine(QPointF(c.x(), c.y() - r - 7), QPointF(c.x(), c.y() - 3))
                p.drawLine(QPointF(c.x(), c.y() + 3), QPointF(c.x(), c.y() + r + 7))
        p.setPen(Qt.NoPen)
        p.setBrush(QColor(color))
        p.drawEllipse(c, 2.5, 2.5)  # the exact point

    def _ring(self, p: QPainter, c: QPointF, color: str, r: float) -> None:
        halo, pen = self._pens(color, 2)
        p.setBrush(Qt.NoBrush)
        for q in (halo, pen):
            p.setPen(q)
            p.drawEllipse(c, r, r)

    def _arrow(self, p: QPainter, s: QPointF, e: QPointF, color: str) -> None:
        ang = math.atan2(e.y() - s.y(), e.x() - s.x())
        head = 14.0
        left = QPointF(e.x() - head * math.cos(ang - 0.45), e.y() - head * math.sin(ang - 0.45))
        right = QPointF(e.x() - head * math.cos(ang + 0.45), e.y() - head * math.sin(ang + 0.45))
        halo, pen = self._pens(color, 3)
        for q in (halo, pen):
            p.setPen(q)
            p.drawLine(s, e)
        path = QPainterPath()
        path.addPolygon(QPolygonF([e, left, right, e]))
        p.setPen(QPen(QColor(255, 255, 255, 230), 2))
        p.setBrush(QColor(color))
        p.drawPath(path)

    def _tag(self, p: QPainter, c: QPointF, text: str, color: str) -> None:
        f = QFont(self.font())
        f.setPointSizeF(max(8.0, f.pointSizeF() * 0.9))
        f.setBold(True)
        p.setFont(f)
        fm = QFontMetricsF(f)
        r = QRectF(c.x() + 16, c.y() - 26, fm.horizontalAdvance(text) + 10, fm.height() + 4)
        p.setPen(Qt.NoPen)
        p.setBrush(QColor(color))
        p.drawRoundedRect(r, 4, 4)
        p.setPen(QColor("white"))
        p.drawText(r, Qt.AlignCenter, text)

    def _label(self, p: QPainter, target: QRectF, text: str, centre: QPointF, color: str = "#202124") -> None:
        f = QFont(self.font())
        f.setPointSizeF(f.pointSizeF() * 1.15)
        p.setFont(f)
        fm = QFontMetricsF(f)
        w = min(target.width() - 16, fm.horizontalAdvance(text) + 24)
        r = QRectF(centre.x() - w / 2, centre.y() - (fm.height() + 12) / 2, w, fm.height() + 12)
        bg = QColor(color)
        bg.setAlpha(225)
        p.setPen(Qt.NoPen)
        p.setBrush(bg)
        p.drawRoundedRect(r, 6, 6)
        p.setPen(QColor("white"))
        p.drawText(r.adjusted(12, 0, -12, 0), Qt.AlignCenter, fm.elidedText(text, Qt.ElideRight, r.width() - 24))

    def _banner(self, p: QPainter, target: QRectF, text: str, color: str) -> None:
        f = QFont(self.font())
        f.setPointSizeF(f.pointSizeF() * 1.25)
        f.setBold(True)
        p.setFont(f)
        fm = QFontMetricsF(f)
        r = QRectF(target.left(), target.top(), target.width(), fm.height() + 18)
        bg = QColor(color)
        bg.setAlpha(235)
        p.setPen(Qt.NoPen)
        p.setBrush(bg)
        p.drawRect(r)
        p.setPen(QColor("white"))
        p.drawText(r.adjusted(14, 0, -14, 0), Qt.AlignVCenter | Qt.AlignLeft, fm.elidedText(text, Qt.ElideRight, r.width() - 28))
