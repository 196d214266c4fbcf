"""Element lists on the Linux desktop, from a real accessibility bus: a private D-Bus session
with at-spi2-core (installed by packaging/install.sh), a real Qt window (tests/elements_target.py,
its AT-SPI bridge on xcb) on Xvfb, real input by xdotool. The reader's boxes are the widgets' own
geometry in screenshot pixels; a recording stores, beside each pre-action frame, the list as it
was before that action; the desktop executor puts the list on its frames and a click at an
element's centre hits it."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from agent.schema import ScreenGeometry
from tests.conftest import ROOT
from tests.elements_target import EMAIL, SECRET
from tests.test_recorder_e2e import xdo

pytestmark = pytest.mark.desktop
TARGET = ROOT / "tests" / "elements_target.py"


@pytest.fixture
def a11y_bus(xdisplay, monkeypatch):
    """A private D-Bus session (started after DISPLAY is set, so the accessibility bus it starts
    on demand is this display's); skips only where that bus cannot start at all."""
    if not (shutil.which("dbus-daemon") and os.path.exists("/usr/libexec/at-spi-bus-launcher")):
        pytest.fail("dbus-daemon or at-spi2-core is missing: run `bash packaging/install.sh --test`")
    proc = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    address = proc.stdout.readline().strip()  # the registry daemon prints to this pipe too: one line only
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", address)
    monkeypatch.delenv("AT_SPI_BUS_ADDRESS", raising=False)
    try:
        from agent.host.password_focus import a11y_bus_address

        a11y_bus_address(enable_bridges=True)  # applications started from now on expose their trees
    except Exception as e:  # the only reason to skip: no accessibility bus here
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(5)
        pytest.skip(f"the accessibility bus cannot start here: {type(e).__name__}: {e}")
    yield address
    os.killpg(proc.pid, signal.SIGTERM)  # the bus and what it activated (the a11y bus, the registry)
    proc.wait(5)


@pytest.fixture
def window(a11y_bus):
    """The target window, started after the bus; yields (process, {widget: [x, y, w, h]})."""
    proc = subprocess.Popen([sys.executable, str(TARGET)], env={**os.environ, "QT_QPA_PLATFORM": "xcb"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line:
        pytest.fail(f"the target window did not come up: {proc.stderr.read()[-2000:]}")
    yield proc, json.loads(line)
    proc.terminate()
    proc.wait(5)


def said(proc, timeout: float = 10.0) -> dict:
    """The window's next JSON line (what it did), or a failure when it says nothing in time."""
    import select

    if not select.select([proc.stdout], [], [], timeout)[0]:
        pytest.fail(f"the target window said nothing within {timeout:g} s")
    return json.loads(proc.stdout.readline())


def centre(box) -> tuple[int, int]:
    x, y, w, h = box
    return x + w // 2, y + h // 2


def by_name(elements, name):
    return next(e for e in elements if e.name == name)


def read_until(reader, geometry, ok, timeout=10.0):
    """Read until ok(reading) (the bridge registers a moment after the window shows)."""
    deadline = time.monotonic() + timeout
    while True:
        r = reader.read(geometry)
        if ok(r) or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_the_reader_lists_the_active_window_in_screenshot_pixels(window):
    from agent.host.atspi_elements import AtspiElements
    from agent.host.focused_window import FocusedWindow

    proc, boxes = window
    # a HiDPI monitor whose origin is not the screen's: screenshot pixels = (screen - origin) * 2
    g = ScreenGeometry(logical_width=800, logical_height=600, physical_width=1600, physical_height=1200,
                       scale_factor=2.0, origin_x=100, origin_y=50)
    xdo("mousemove", *centre(boxes["email"]))  # X focus follows the pointer (no window manager): not active yet
    plain = AtspiElements()
    r = read_until(plain, g, lambda r: r.source != "none: no application on the accessibility bus")
    assert r.elements is None and r.source == "none: no active window on the accessibility bus"
    focus = FocusedWindow()
    by_focus = AtspiElements(focused_pid=focus.focused_pid)  # the fallback: the focused X window's owner
    r = read_until(by_focus, g, lambda r: r.elements)
    assert r.source == "atspi" and by_name(r.elements, "Save").role == "button"
    focus.close()
    by_focus.close()

    xdo("click", 1)  # now Qt's window is the active one
    r = read_until(plain, g, lambda r: r.elements and "focused" in by_name(r.elements, "Email").states)
    els = r.elements

    def expect(name):
        x, y, w, h = boxes[name]
        return ((x - 100) * 2, (y - 50) * 2, (x + w - 100) * 2, (y + h - 50) * 2)

    assert by_name(els, "Save").box == expect("save") and by_name(els, "Save").role == "button"
    dark = by_name(els, "Dark mode")
    assert dark.role == "checkbox" and "checked" in dark.states
    assert by_name(els, "Small").role == "radio" and "checked" not in by_name(els, "Small").states
    email = by_name(els, "Email")
    assert (email.role, email.value, email.box) == ("text_field", EMAIL, expect("email"))
    pw = by_name(els, "Password")
    assert pw.role == "text_field" and "password" in pw.states and pw.value is None  # never read
    assert all(SECRET not in (e.value or "") + e.name for e in els)
    volume = by_name(els, "Volume")
    assert (volume.role, volume.value) == ("slider", "30 of 0-100")
    assert by_name(els, "Disabled").states == ("disabled",)
    # 2000 rows: the first ones are read, and only those inside the list's viewport are listed
    rows = [e for e in els if e.role == "list_item"]
    x, y, w, h = boxes["rows"]
    assert rows and rows[0].name == "row 0" and len(rows) < 12
    assert all(e.box[3] <= (y + h - 50) * 2 for e in rows)
    assert r.truncated == "cut at 150 children of one node"
    # hidden regions (the app's own control strip painted out) are left out
    r = plain.read(g, hidden=[boxes["save"]])
    assert "Save" not in [e.name for e in r.elements] and "Dark mode" in [e.name for e in r.elements]
    plain.close()


def test_a_time_budget_and_node_limit_bound_a_reading(window):
    from agent.host.atspi_elements import AtspiElements, Limits

    proc, boxes = window
    g = ScreenGeometry.simple(1920, 1080)
    xdo("mousemove", *centre(boxes["email"]), "click", 1)
    full = read_until(AtspiElements(), g, lambda r: r.elements)
    small = AtspiElements(Limits(max_nodes=4))
    r = small.read(g)
    assert r.truncated == "cut at 4 nodes" and len(r.elements) < len(full.elements)
    tight = AtspiElements(Limits(budget_s=0.05))
    t0 = time.monotonic()
    r = tight.read(g)
    assert time.monotonic() - t0 < 0.5  # the budget holds (the 2000-row list alone takes longer)
    assert r.truncated == "cut by the 0.05 s time budget" or r.source.startswith("none: the accessibility bus did not answer")


def test_a_recording_stores_each_actions_list_from_before_it(window, store):
    from agent.recorder.session import RecorderConfig, RecordingSession, rereduce

    proc, boxes = window
    session = RecordingSession(store, "switch dark mode off and save", RecorderConfig(fps=10))
    session.start()
    try:
        assert session.elements.available, session.elements.reason
        xdo("mousemove", *centre(boxes["dark"]))
        time.sleep(1.0)  # an annotator takes a moment: a list is read (the window under the pointer's)
        xdo("click", "--delay", 0, 1)
        assert said(proc) == {"dark": False}  # the click reached the check box
        time.sleep(1.0)  # the next list is read after this click's effect
        xdo("mousemove", *centre(boxes["save"]), "click", "--delay", 0, 1)
        assert said(proc) == {"clicked": "save"}
        time.sleep(0.6)
    finally:
        ep = session.stop()
    assert ep.meta["elements"] == {"how": "atspi"}
    clicks = [s for s in ep.steps if s.action.name == "click"]
    assert len(clicks) == 2, [s.action for s in ep.steps]
    first, second = (s.observation for s in clicks)
    assert first.elements_source == second.elements_source == "atspi"
    # before the first click the box was checked; before the second, it was not
    assert "checked" in by_name(first.elements, "Dark mode").states
    assert "checked" not in by_name(second.elements, "Dark mode").states
    # each click lies inside the box of the element it hit, in the stored screenshot's pixels
    for step, name in zip(clicks, ("Dark mode", "Save"), strict=True):
        x, y = step.action.args["start_box"]
        e = by_name(step.observation.elements, name)
        assert e.contains(x * step.observation.width, y * step.observation.height), (e, step.action)
        assert (step.observation.width, step.observation.height) == (1920, 1080)
    assert by_name(first.elements, "Password").value is None
    # the raw events keep the lists: re-reduction gives the same steps' lists back
    raw = [e for e in store.raw_events(ep.id) if e["kind"] == "elements"]
    assert raw and all(e["t_end"] >= e["t"] for e in raw)
    again = rereduce(store, ep.id)
    assert [s.observation.elements for s in again.steps] == [s.observation.elements for s in ep.steps]
    assert store.load_episode(ep.id).steps[0].observation.elements == first.elements  # stored as read


def test_secret_typing_takes_the_fields_value_out_of_later_lists(window, store):
    """What is typed with secret typing on is in the field afterwards: its value is not kept."""
    from agent.recorder.session import RecorderConfig, RecordingSession

    proc, boxes = window
    session = RecordingSession(store, "type a secret", RecorderConfig(fps=10))
    session.start()
    try:
        xdo("mousemove", *centre(boxes["email"]))
        time.sleep(0.8)
        xdo("click", "--delay", 0, 1)
        time.sleep(0.8)
        session.set_secret(True)
        xdo("key", "End")
        xdo("type", "--delay", 30, "x9")
        time.sleep(0.8)
        session.set_secret(False)
        xdo("mousemove", *centre(boxes["save"]), "click", "--delay", 0, 1)
        time.sleep(0.6)
    finally:
        ep = session.stop()
    last = ep.steps[-1].observation
    assert ep.steps[-1].action.name == "click" and last.elements_source == "atspi"
    email = by_name(last.elements, "Email")
    assert email.value is None and "x9" not in json.dumps(ep.to_dict())
    assert by_name(ep.steps[0].observation.elements, "Email").value == EMAIL  # before any secret: kept


def test_the_desktop_executor_puts_the_list_on_its_frames(window):
    from agent.executors.desktop import DesktopExecutor
    from agent.schema import Action

    proc, boxes = window
    ex = DesktopExecutor(settle=0.3)
    try:
        xdo("mousemove", *centre(boxes["email"]), "click", 1)
        deadline = time.monotonic() + 10
        frame = ex.observe()
        while not frame.elements and time.monotonic() < deadline:
            time.sleep(0.1)
            frame = ex.observe()
        assert frame.elements_source == "atspi" and frame.size == (1920, 1080)
        dark = by_name(frame.elements, "Dark mode")
        assert "checked" in dark.states
        # the agent clicks the element's centre, as the pointer writes it: the check box gets it
        cx, cy = dark.center
        frame, *_ = ex.step(Action("click", {"start_box": (cx / 1920, cy / 1080)}))
        assert said(proc) == {"dark": False}
        deadline = time.monotonic() + 5
        while "checked" in by_name(frame.elements, "Dark mode").states and time.monotonic() < deadline:
            frame = ex.observe()
        assert "checked" not in by_name(frame.elements, "Dark mode").states
    finally:
        ex.close()


def test_without_an_accessibility_bus_the_reason_is_given(monkeypatch, xdisplay, store):
    from agent.executors.desktop import DesktopExecutor
    from agent.host.atspi_elements import AtspiElements
    from agent.recorder.session import RecorderConfig, RecordingSession

    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    monkeypatch.delenv("AT_SPI_BUS_ADDRESS", raising=False)
    r = AtspiElements().read(ScreenGeometry.simple(640, 480))
    assert r.elements is None and r.source.startswith("none: no accessibility bus (this session has no D-Bus")
    ex = DesktopExecutor(password_fields=False)
    try:
        frame = ex.observe()
        assert frame.elements is None and frame.elements_source == r.source
    finally:
        ex.close()
    session = RecordingSession(store, "click once", RecorderConfig(fps=5, password_fields=False))
    session.start()
    try:
        xdo("mousemove", 500, 500, "click", "--delay", 0, 1)
        time.sleep(0.5)
    finally:
        ep = session.stop()
    assert ep.meta["elements"]["how"] == r.source
    assert ep.steps and all(s.observation.elements is None and s.observation.elements_source == r.source for s in ep.steps)


def test_screen_boxes_become_screenshot_pixels_cut_to_the_monitor_and_container():
    from agent.elements import Element
    from agent.host.atspi_elements import _names_from_labels, screen_box_to_shot

    g = ScreenGeometry(logical_width=1280, logical_height=800, physical_width=2560, physical_height=1600,
                       scale_factor=2.0, origin_x=1920, origin_y=0)  # a HiDPI monitor right of a 1920 px one
    assert screen_box_to_shot(1930, 10, 100, 20, g) == (20, 20, 220, 60)
    assert screen_box_to_shot(1900, 10, 40, 20, g) == (0, 20, 40, 60)  # cut at the monitor's left edge
    assert screen_box_to_shot(100, 10, 40, 20, g) is None  # on the other monitor
    assert screen_box_to_shot(1930, 10, 100, 20, g, clip=(1920, 0, 1940, 15)) == (20, 20, 40, 30)  # a list's viewport
    assert screen_box_to_shot(1930, 10, 0, 20, g) is None
    # an unnamed row takes the name of the label inside it; the label is not listed again
    keyed = [((0, 1), Element("list_item", "", (0, 0, 50, 10))), ((0, 1, 0), Element("label", "Inbox", (2, 0, 40, 10))),
             ((0, 2), Element("label", "Other", (0, 20, 50, 30)))]
    assert [(e.role, e.name) for e in _names_from_labels(keyed)] == [("list_item", "Inbox"), ("label", "Other")]
