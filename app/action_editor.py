"""An editor for one action, generated from agent.actions.REGISTRY.

The combo lists the registry's actions for the episode's platform; each parameter gets a field
by its kind: points as two numbers (normalized x, y, with the screenshot pixel beside them),
text as a text box, keys as a line, a direction as a combo. Optional parameters left empty are
omitted. Exact point values are kept apart from the spin boxes, so showing a point at four
decimals never changes it.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase, QTextOption
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from agent import coords
from agent.actions import REGISTRY, SCROLL_DIRECTIONS, actions_for
from agent.schema import Action

MULTILINE = ("content", "command")  # text parameters where a newline means something
TOOL_ACTIONS = ("run_command", "read_file", "write_file")


class PointField(QWidget):
    """x and y spin boxes (0..1) over an exact (x, y) value."""

    edited = Signal()

    def __init__(self, optional: bool, parent=None):
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.setSpacing(2)
        lay = QHBoxLayout()
        outer.addLayout(lay)
        self.enabled_box = QCheckBox("set") if optional else None
        if self.enabled_box:
            self.enabled_box.setToolTip("Optional: leave unchecked to act where the pointer is")
            self.enabled_box.toggled.connect(self._toggled)
            lay.addWidget(self.enabled_box)
        self.x, self.y = QDoubleSpinBox(), QDoubleSpinBox()
        for box, axis in ((self.x, "x"), (self.y, "y")):
            box.setRange(0.0, 1.0)
            box.setDecimals(4)
            box.setSingleStep(0.005)
            box.setPrefix(f"{axis} ")
            box.setKeyboardTracking(False)
            box.valueChanged.connect(self._spun)
            box.setMinimumWidth(70)
            lay.addWidget(box, 1)
        self.pixels = QLabel()
        self.pixels.setObjectName("muted")
        outer.addWidget(self.pixels)
        self._value: tuple[float, float] | None = None
        self._image = (1, 1)
        self._quiet = False

    def set_image_size(self, w: int, h: int) -> None:
        self._image = (max(1, w), max(1, h))
        self._show()

    def value(self) -> tuple[float, float] | None:
        if self.enabled_box is not None and not self.enabled_box.isChecked():
            return None
        return self._value

    def set_value(self, v: tuple[float, float] | None) -> None:
        self._value = v if v is None else (float(v[0]), float(v[1]))
        self._quiet = True
        if self.enabled_box is not None:
            self.enabled_box.setChecked(v is not None)
        self._quiet = False
        self._show()

    def _show(self) -> None:
        self._quiet = True
        v = self._value or (0.5, 0.5)
        self.x.setValue(v[0])
        self.y.setValue(v[1])
        on = self.enabled_box is None or self.enabled_box.isChecked()
        self.x.setEnabled(on)
        self.y.setEnabled(on)
        px = coords.normalized_to_image(v, *self._image)
        self.pixels.setText(f"{px[0]:.0f}, {px[1]:.0f} px in the screenshot" if on else "")
        self._quiet = False

    def _spun(self) -> None:
        if self._quiet:
            return
        self._value = (self.x.value(), self.y.value())
        self._show()
        self.edited.emit()

    def _toggled(self, on: bool) -> None:
        if self._quiet:
            return
        if on and self._value is None:
            self._value = (0.5, 0.5)
        self._show()
        self.edited.emit()


class ActionEditor(QWidget):
    """Edits an Action; `changed` fires on every user edit, `action()` builds the current one."""

    changed = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        self.combo = QComboBox()
        self.combo.setToolTip("Action type")
        self.combo.currentIndexChanged.connect(self._type_changed)
        outer.addWidget(self.combo)
        self.form = QFormLayout()
        self.form.setFieldGrowthPolicy(QFormLayout.AllNonFixedFieldsGrow)
        self.form.setLabelAlignment(Qt.AlignRight)
        outer.addLayout(self.form)
        self.doc = QLabel()
        self.doc.setWordWrap(True)
        self.doc.setObjectName("muted")
        outer.addWidget(self.doc)
        self.fields: dict[str, QWidget] = {}
        self._values: dict = {}  # last values per parameter name, kept across type changes
        self._image = (1, 1)
        self._platform = "desktop"
        self._quiet = False

    # ------------------------------------------------------------ public
    def set_action(self, action: Action, platform: str, image_w: int, image_h: int) -> None:
        self._quiet = True
        self._image = (image_w, image_h)
        self._platform = platform
        names = [s.name for s in actions_for(platform)] or list(REGISTRY)
        if action.name in TOOL_ACTIONS:  # a run with the tools: any of them may replace the proposed one
            names += [n for n in TOOL_ACTIONS if n not in names]
        if action.name not in names:
            names.append(action.name)
        self.combo.clear()
        self.combo.addItems(names)
        self._values = dict(action.args)
        self.combo.setCurrentText(action.name)
        self._build(action.name)
        self._quiet = False

    def clear(self) -> None:
        """Show no action (an episode without steps): no type, no fields, nothing left of the last one."""
        self._quiet = True
        self.combo.clear()
        self._values = {}
        self._clear_form()
        self.doc.setText("")
        self.doc.hide()
        self._quiet = False

    def action(self) -> Action:
        name = self.combo.currentText()
        spec = REGISTRY[name]
        args = {}
        for p in spec.params:
            w = self.fields[p.name]
            if isinstance(w, PointField):
                v = w.value()
            elif isinstance(w, QComboBox):
                v = w.currentText()
            elif isinstance(w, QPlainTextEdit):
                v = w.toPlainText()
            else:
                v = w.text()
            if v is None or (not p.required and v == ""):
                continue
            args[p.name] = v
        return Action(name, args)

    def set_points(self, points: dict) -> None:
        """Set point parameters (from the canvas); fires `changed`."""
        for name, v in points.items():
            w = self.fields.get(name)
            if isinstance(w, PointField) and v is not None:
                w.set_value(v)
                self._values[name] = w.value()
        self.changed.emit()

    # ------------------------------------------------------------ building
    def _type_changed(self) -> None:
        if self._quiet or not self.combo.currentText():
            return
        self._collect()
        name = self.combo.currentText()
        spec = REGISTRY[name]
        # a new point parameter starts where it is most likely wanted: at the old point
        for p in spec.params:
            if p.kind == "point" and p.required and p.name not in self._values:
                start = self._values.get("start_box", (0.5, 0.5))
                self._values[p.name] = start if p.name == "start_box" else (min(1.0, start[0] + 0.1), start[1])
        self._build(name)
        self.changed.emit()

    def _collect(self) -> None:
        for name, w in self.fields.items():
            if isinstance(w, PointField):
                if w.value() is not None:
                    self._values[name] = w.value()
            elif isinstance(w, QComboBox):
                self._values[name] = w.currentText()
            elif isinstance(w, QPlainTextEdit):
                self._values[name] = w.toPlainText()
            else:
                self._values[name] = w.text()

    def _clear_form(self) -> None:
        while self.form.rowCount():
            self.form.removeRow(0)
        self.fields = {}

    def _build(self, name: str) -> None:
        self._clear_form()
        spec = REGISTRY[name]
        for p in spec.params:
            v = self._values.get(p.name)
            if p.kind == "point":
                w = PointField(optional=not p.required)
                w.set_image_size(*self._image)
                w.set_value(tuple(v) if isinstance(v, (tuple, list)) else None)
                w.edited.connect(self._edited)
            elif p.kind == "direction":
                w = QComboBox()
                w.addItems(SCROLL_DIRECTIONS)
                if v in SCROLL_DIRECTIONS:
                    w.setCurrentText(v)
                w.currentIndexChanged.connect(self._edited)
            elif p.kind == "text" and p.name in MULTILINE:
                w = QPlainTextEdit(str(v) if isinstance(v, str) else "")
                w.setTabChangesFocus(True)
                w.setFixedHeight(64)
                w.textChanged.connect(self._edited)
            else:
                w = QLineEdit(str(v) if isinstance(v, str) else "")
                if p.kind == "key":
                    w.setPlaceholderText("e.g. ctrl c")
                w.textEdited.connect(self._edited)
            if name in TOOL_ACTIONS and p.kind == "text":  # commands, paths and file content: monospace
                w.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
                if isinstance(w, QPlainTextEdit):
                    w.setWordWrapMode(QTextOption.WrapAnywhere)  # a command wraps as in a terminal
            label = p.name.replace("_", " ") + ("" if p.required else " (optional)")
            self.form.addRow(label, w)
            self.fields[p.name] = w
        self.doc.setText(spec.doc)
        self.doc.setVisible(bool(spec.doc))

    def _edited(self, *_):
        if not self._quiet:
            self.changed.emit()
