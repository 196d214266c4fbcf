"""Is a password field focused? Asked of the platform's accessibility layer. Qt-free.

On Linux that is AT-SPI 2, over D-Bus (jeepney): toolkits with an accessibility bridge (GTK, Qt,
Chromium, Firefox, LibreOffice) announce focus changes on the accessibility bus, and the
focused object's role tells a password entry (ROLE_PASSWORD_TEXT) from any other. While one has
the focus, the recorder stores keystrokes only as a placeholder, as with secret typing, and the
desktop executor marks its observation (`password_focused`), so the gate asks before the agent types.

Starting the watcher also sets org.a11y.Status.IsEnabled, which is what a screen reader does:
applications started afterwards turn their accessibility bridges on (most read it at start-up).
Where there is no accessibility bus (no D-Bus session, at-spi2-core missing, another OS),
`available` is False and `reason` says why; the recording keeps that in its privacy metadata,
and secret typing (the hotkey) still works.
"""
from __future__ import annotations

import bisect
import os
import threading

from agent.schema import monotonic

ROLE_PASSWORD_TEXT = 40  # AtspiRole: ATSPI_ROLE_PASSWORD_TEXT
FOCUS_EVENT = "object:state-changed:focused"


class PasswordFocus:
    """Watches focus changes in a background thread; `active_at(t)` answers for a time t on
    agent.schema's monotonic clock (the input events' clock)."""

    def __init__(self, enable_bridges: bool = True, clock=None):
        self.clock = clock or monotonic
        self.enable_bridges = enable_bridges
        self.available = False
        self.reason = "not started"
        self._times: list[float] = [float("-inf")]
        self._states: list[bool] = [False]
        self._focused: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn = None

    # ------------------------------------------------------------ answers
    @property
    def active(self) -> bool:
        with self._lock:
            return self._states[-1]

    def active_at(self, t: float) -> bool:
        """Was a password field focused at time t?"""
        with self._lock:
            return self._states[bisect.bisect_right(self._times, t) - 1]

    def _set(self, on: bool, t: float) -> None:
        with self._lock:
            if on != self._states[-1]:
                self._times.append(t)
                self._states.append(on)

    # ------------------------------------------------------------ life cycle
    def start(self, timeout: float = 5.0) -> PasswordFocus:
        """Connect and subscribe; never raises (see `available` and `reason`)."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="tandem-a11y", daemon=True)
        self._thread.start()
        ready.wait(timeout)
        if not ready.is_set():
            self.reason = f"the accessibility bus did not answer within {timeout:.0f} s"
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(3)
        if self._conn is not None:
            try:
                self._conn.close()
            except OSError:
                pass
            self._conn = None

    # ------------------------------------------------------------ the watcher thread
    def _run(self, ready: threading.Event) -> None:
        try:
            conn, rule = self._subscribe()
        except Exception as e:  # any failure means "the platform does not tell"
            if isinstance(e, KeyError) and "DBUS_SESSION_BUS_ADDRESS" in str(e):
                self.reason = "no accessibility bus (this session has no D-Bus: DBUS_SESSION_BUS_ADDRESS is not set)"
            else:
                self.reason = f"no accessibility bus ({type(e).__name__}: {e})"
            ready.set()
            return
        self.available, self.reason = True, "AT-SPI"
        ready.set()
        from jeepney.low_level import HeaderFields

        with conn.filter(rule, bufsize=256) as queue:
            while not self._stop.is_set():
                try:
                    msg = conn.recv_until_filtered(queue, timeout=0.2)
                except TimeoutError:
                    continue
                except (OSError, ValueError) as e:  # the bus went away: fail closed is impossible, say so
                    self.available, self.reason = False, f"the accessibility bus closed: {e}"
                    self._set(False, self.clock())
                    return
                t = self.clock()
                detail, gained = msg.body[0], msg.body[1]
                if detail != "focused":
                    continue
                who = (msg.header.fields.get(HeaderFields.sender), msg.header.fields.get(HeaderFields.path))
                if gained:
                    self._focused = who
                    self._set(self._role(conn, *who) == ROLE_PASSWORD_TEXT, t)
                elif who == self._focused:
                    self._focused = None
                    self._set(False, t)

    def _subscribe(self):
        from jeepney import DBusAddress, MatchRule, message_bus, new_method_call
        from jeepney.io.blocking import Proxy, open_dbus_connection

        conn = open_dbus_connection(bus=a11y_bus_address(self.enable_bridges))
        self._conn = conn
        rule = MatchRule(type="signal", interface="org.a11y.atspi.Event.Object", member="StateChanged")
        Proxy(message_bus, conn).AddMatch(rule)
        # applications emit only the events someone registered for
        registry = DBusAddress("/org/a11y/atspi/registry", bus_name="org.a11y.atspi.Registry",
                               interface="org.a11y.atspi.Registry")
        try:
            conn.send_and_get_reply(new_method_call(registry, "RegisterEvent", "sass", (FOCUS_EVENT, [], "")), timeout=3)
        except Exception:  # at-spi2-core before 2.46 takes the event name alone
            conn.send_and_get_reply(new_method_call(registry, "RegisterEvent", "s", (FOCUS_EVENT,)), timeout=3)
        return conn, rule

    @staticmethod
    def _role(conn, sender: str | None, path: str | None) -> int | None:
        from jeepney import DBusAddress, new_method_call

        if not sender or not path:
            return None
        try:
            obj = DBusAddress(path, bus_name=sender, interface="org.a11y.atspi.Accessible")
            return int(conn.send_and_get_reply(new_method_call(obj, "GetRole"), timeout=1).body[0])
        except Exception:  # the object may be gone already
            return None


def a11y_bus_address(enable_bridges: bool = True) -> str:
    """The accessibility bus's address ($AT_SPI_BUS_ADDRESS, else asked of the session bus's
    org.a11y.Bus). enable_bridges sets org.a11y.Status.IsEnabled, as a screen reader does. Raises
    (KeyError without DBUS_SESSION_BUS_ADDRESS, OSError, a D-Bus error) where there is no bus."""
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection

    address = os.environ.get("AT_SPI_BUS_ADDRESS")
    if address:
        return address
    session = open_dbus_connection(bus="SESSION", enable_fds=False)
    try:
        bus = DBusAddress("/org/a11y/bus", bus_name="org.a11y.Bus", interface="org.a11y.Bus")
        address = session.send_and_get_reply(new_method_call(bus, "GetAddress"), timeout=3).body[0]
        if enable_bridges:
            props = DBusAddress("/org/a11y/bus", bus_name="org.a11y.Bus", interface="org.freedesktop.DBus.Properties")
            session.send_and_get_reply(new_method_call(props, "Set", "ssv", ("org.a11y.Status", "IsEnabled", ("b", True))),
                                       timeout=3)
    finally:
        session.close()
    return address
