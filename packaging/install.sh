#!/usr/bin/env bash
# Installs what Tandem needs on Debian/Ubuntu (or any machine with pip; the apt part is skipped
# where apt-get is missing). `--test` adds what the test suite needs (Xvfb, xdotool, espeak-ng, and
# MiniWoB++: the miniwob package from requirements-test.txt, headless chromium and chromium-driver).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"

# Qt's xcb platform plugin and audio need these system libraries.
debs=(libxcb-icccm4 libxcb-keysyms1 libxcb-xinerama0 libxcb-cursor0 libxkbcommon-x11-0 libegl1 libgl1
      libfontconfig1 libdbus-1-3 libpulse0 libportaudio2 xdotool scrot
      dbus-daemon at-spi2-core)  # the accessibility bus: the recorder asks it whether a password field is focused
[ $want_test -eq 1 ] && debs+=(xvfb espeak-ng sox pulseaudio pulseaudio-utils libasound2-plugins xterm  # xterm: the gate's terminal test
                              chromium chromium-driver)  # MiniWoB++ (trainer/sandbox/miniwob_env.py)
if command -v apt-get >/dev/null; then
  missing=()
  for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
  if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

PY="${PYTHON:-python3}"
# torch first, from its exact pin: a bare `torch` would pull a multi-GB CUDA build.
"$PY" -m pip install -q "$(grep '^torch==' "$here/requirements.txt")"
if [ $want_test -eq 1 ]; then
  "$PY" -m pip install -q -r "$here/requirements-test.txt"
else
  "$PY" -m pip install -q -r "$here/requirements.txt"
fi
# pyautogui's python3-Xlib 0.15 and pynput's python-xlib 0.33 share the Xlib/ folder; keep 0.33.
"$PY" -c "import Xlib,sys; sys.exit(0 if Xlib.__version__ >= (0, 17) else 1)" 2>/dev/null \
  || "$PY" -m pip install -q --force-reinstall --no-deps "$(grep '^python-xlib==' "$here/requirements.txt")"
echo "Tandem: dependencies installed"
