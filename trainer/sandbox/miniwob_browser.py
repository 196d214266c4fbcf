"""Chromium for MiniWoB++: found, started so that it is always reaped, and cut off when a call hangs.

Where Chromium is. MINIWOB_CHROME_BINARY and MINIWOB_CHROMEDRIVER name the browser and its
driver; set both or neither. With neither, they are looked for on PATH and in /usr/bin (Debian's
`chromium` and `chromium-driver` packages). Both paths go to Selenium directly, so Selenium
Manager, which would fetch driver metadata from the internet, is never asked.

Reaping. chromedriver and every Chromium process it starts live in one process group, led by a
watchdog whose stdin pipe closes when this process ends, by `close()` or by any signal, SIGKILL
included; the watchdog then kills the whole group (trainer.sandbox.chromium, shared with the
games). A call that hangs, a reset stuck in MiniWoB's `core.endEpisode` say, is cut by
`Deadline`, which kills the group the same way.

The miniwob package's own Selenium instance and environment (miniwob 1.1.0, pinned) are used
unchanged except where the driver comes from: `_Instance.create_driver` takes it from `Browser`.
"""
from __future__ import annotations

import os
import re
import subprocess
import threading
from functools import lru_cache

from trainer.errors import TrainerError
from trainer.sandbox.chromium import BINARY_NAMES, FALLBACK_DIRS, group_processes  # noqa: F401 (re-exported)
from trainer.sandbox.chromium import end_watchdog as _end_watchdog
from trainer.sandbox.chromium import find_executable as _find
from trainer.sandbox.chromium import kill_group as _kill_group
from trainer.sandbox.chromium import start_watchdog as _start_watchdog

BINARY_ENV, DRIVER_ENV = "MINIWOB_CHROME_BINARY", "MINIWOB_CHROMEDRIVER"
DRIVER_NAMES = ("chromedriver", "chromium.chromedriver")
CHROME_FLAGS = ("headless", "disable-gpu", "no-sandbox", "disable-dev-shm-usage")  # miniwob's, plus /dev/shm off
TASK_WIDTH, TASK_HEIGHT = 160, 210  # MiniWoB's task area in CSS pixels (miniwob.constants), also the screenshot


class MiniWoBError(TrainerError, RuntimeError):
    """MiniWoB++ cannot run or a call failed; the message says what and with which value."""


class MiniWoBTimeout(MiniWoBError):
    """A call into Chromium did not finish in time; Chromium was killed."""


# ------------------------------------------------------------ where Chromium is
def chromium_paths(environ=None) -> tuple[str, str]:
    """(browser, chromedriver): from the two variables (both or neither), else found on this
    machine. Raises MiniWoBError saying what is missing."""
    env = os.environ if environ is None else environ
    binary, driver = env.get(BINARY_ENV, ""), env.get(DRIVER_ENV, "")
    if bool(binary) != bool(driver):
        have, missing = (BINARY_ENV, DRIVER_ENV) if binary else (DRIVER_ENV, BINARY_ENV)
        raise MiniWoBError(f"{have} is set ({binary or driver!r}) but {missing} is not: set both or neither "
                           f"(neither: chromium and chromedriver are looked for on PATH and in /usr/bin)")
    if binary:
        for var, path in ((BINARY_ENV, binary), (DRIVER_ENV, driver)):
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise MiniWoBError(f"{var}={path!r} is not an executable file")
        return binary, driver
    binary, driver = _find(BINARY_NAMES), _find(DRIVER_NAMES)
    if not binary:
        raise MiniWoBError("chromium is not installed (apt-get install chromium chromium-driver, "
                           f"or set {BINARY_ENV} and {DRIVER_ENV})")
    if not driver:
        raise MiniWoBError(f"chromedriver is not installed (apt-get install chromium-driver, or set {DRIVER_ENV} "
                           f"and {BINARY_ENV})")
    return binary, driver


@lru_cache(maxsize=8)
def _major_version(path: str) -> int | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d+)\.\d+\.\d+", out)
    return int(m.group(1)) if m else None


def check_versions(binary: str, driver: str) -> str | None:
    """None when chromedriver can drive this browser (same major version), else why not."""
    b, d = _major_version(binary), _major_version(driver)
    if b is None:
        return f"{binary} --version did not answer with a version"
    if d is None:
        return f"{driver} --version did not answer with a version"
    if b != d:
        return f"{binary} is Chromium {b} but {driver} is for {d}: install matching versions"
    return None


# ------------------------------------------------------------ a browser that is always reaped
class Browser:
    """One headless Chromium under chromedriver, in a process group its watchdog kills when this
    process ends. `kill()` ends it at once (any thread may call it); `close()` asks politely first."""

    def __init__(self, driver, service, watchdog):
        self.driver, self.service, self.watchdog = driver, service, watchdog
        self._killed = False

    @classmethod
    def launch(cls, *, headless: bool = True, app_url: str | None = None, timeout: float = 60.0) -> Browser:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        binary, driver_path = chromium_paths()
        watchdog = _start_watchdog()
        options = webdriver.ChromeOptions()
        for flag in CHROME_FLAGS if headless else ():
            options.add_argument(flag)
        if app_url:
            options.add_argument(f"app={app_url}")
        options.binary_location = binary
        kw = {"popen_kw": {"process_group": watchdog.pid}} if watchdog else {}
        service = Service(executable_path=driver_path, **kw)
        stop = (lambda: _kill_group(watchdog)) if watchdog else (lambda: None)
        try:
            with Deadline(timeout, f"starting Chromium ({binary} under {driver_path})", stop):
                driver = webdriver.Chrome(service=service, options=options)
        except MiniWoBTimeout:
            _end_watchdog(watchdog)
            raise
        except Exception as e:
            _end_watchdog(watchdog)
            why = check_versions(binary, driver_path)
            raise MiniWoBError(f"Chromium did not start ({binary} under {driver_path}): "
                               f"{why or str(e).strip().splitlines()[0]}") from e
        return cls(driver, service, watchdog)

    @property
    def pgid(self) -> int | None:
        """The process group of chromedriver and Chromium (None where there is no watchdog)."""
        return self.watchdog.pid if self.watchdog else None

    def kill(self) -> None:
        """Kill chromedriver and every Chromium process now, and reap our children. Idempotent."""
        if self._killed:
            return
        self._killed = True
        if self.watchdog:
            _end_watchdog(self.watchdog)
        else:
            proc = getattr(self.service, "process", None)
            if proc is not None and proc.poll() is None:
                proc.kill()
        proc = getattr(self.service, "process", None)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def close(self, timeout: float = 10.0) -> None:
        """End the WebDriver session (within `timeout` seconds), then kill whatever is left."""
        if self._killed:
            return
        try:
            with Deadline(timeout, "closing Chromium", self.kill):
                self.driver.quit()
        except Exception:  # the browser goes either way; kill() below reaps it
            pass
        finally:
            self.kill()


class Deadline:
    """`with Deadline(seconds, what, on_expire):` runs the block; if it has not finished after
    `seconds`, `on_expire()` is called from a timer thread (killing the browser, so the blocked
    call returns with an error), and leaving the block raises MiniWoBTimeout naming `what`."""

    def __init__(self, seconds: float | None, what: str, on_expire):
        self.seconds, self.what, self.on_expire = seconds, what, on_expire
        self.expired = False
        self._timer = None

    def _fire(self) -> None:
        self.expired = True
        self.on_expire()

    def __enter__(self):
        if self.seconds:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if self._timer is not None:
            self._timer.cancel()
        if self.expired:
            raise MiniWoBTimeout(f"{self.what} did not finish within {self.seconds:g} s; Chromium was killed") from exc
        return False


# ------------------------------------------------------------ miniwob's instance on a Browser
def make_environment(task: str, action_space_config, launch_timeout: float = 60.0):
    """A miniwob MiniWoBEnvironment for `task` whose Chromium is a reaped `Browser`."""
    return _classes()[1](subdomain=task, action_space_config=action_space_config, launch_timeout=launch_timeout)


@lru_cache(maxsize=1)
def _classes():
    from miniwob.environment import MiniWoBEnvironment
    from miniwob.selenium_instance import SeleniumInstance

    class _Instance(SeleniumInstance):
        browser = None
        launch_timeout = 60.0

        def create_driver(self):  # miniwob 1.1.0's, but the driver comes from Browser.launch
            self.browser = Browser.launch(headless=self.headless, app_url=None if self.headless else self.url,
                                          timeout=self.launch_timeout)
            self.driver = self.browser.driver
            try:
                self.driver.implicitly_wait(5)
                self.driver.set_page_load_timeout(30)  # WebDriver's default is 300 s
                self._open()
            except BaseException:
                self.browser.kill()
                raise

        def _open(self):
            from selenium.webdriver.common.by import By
            from selenium.webdriver.support import expected_conditions as EC
            from selenium.webdriver.support.wait import WebDriverWait

            if self.headless:
                self.driver.get(self.url)
            WebDriverWait(self.driver, 5).until(EC.element_to_be_clickable((By.ID, self.SYNC_SCREEN_ID)))
            self.inner_width, self.inner_height = self.driver.execute_script(
                "return [window.innerWidth, window.innerHeight];")

        def load(self, subdomain: str) -> None:
            """Another task in the same browser: a page load, no new Chromium."""
            import urllib.parse

            from miniwob.fields import get_field_extractor
            from miniwob.selenium_instance import DEFAULT_BASE_URL

            self.url = urllib.parse.urljoin(DEFAULT_BASE_URL, f"{subdomain}.html")
            self.field_extractor = get_field_extractor(subdomain)
            self.cached_fields = []
            self._open()

        def close(self):
            if self.browser is not None:
                self.browser.close()
            self.died = True

    class _Environment(MiniWoBEnvironment):
        def __init__(self, *, launch_timeout: float, **kw):
            self.launch_timeout = launch_timeout
            super().__init__(**kw)

        def _hard_reset_instance(self):
            if getattr(self, "instance", None):
                self.instance.close()
            self.instance = _Instance(index=0, **self.instance_kwargs)
            self.instance.launch_timeout = self.launch_timeout
            self.instance.start()  # = create_driver: miniwob's instance runs without a thread here

        def load(self, subdomain: str) -> None:
            self.subdomain = self.instance_kwargs["subdomain"] = subdomain
            self.instance.load(subdomain)

    return _Instance, _Environment
