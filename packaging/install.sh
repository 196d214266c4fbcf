#!/usr/bin/env bash
# Installs Tandem from this checkout into a virtual environment, never into the system Python
# (a stock Debian/Ubuntu Python refuses `pip install` there: PEP 668, EXTERNALLY-MANAGED), plus
# the system libraries it needs on Debian/Ubuntu (skipped where apt-get is missing).
#
#   bash packaging/install.sh          the app and the trainer: `pip install -e .[train,android]`
#   bash packaging/install.sh --test   and what the test suite needs: `.[test]`, Xvfb, xdotool,
#                                      espeak-ng, and MiniWoB++'s chromium-driver (chromium itself is
#                                      in the base list: the browser games need it)
#
# The environment is $TANDEM_VENV, else .venv in the checkout; the checkout is installed editable,
# so the code you run is the code here. Launchers: .venv/bin/tandem (the same as
# `python main.py`), linked from ~/.local/bin/tandem. $PYTHON picks the interpreter that makes
# the environment (default python3, 3.11 or newer).
#
# torch: installed first from its exact pin in requirements.txt, because a bare `torch` pulls a
# multi-GB CUDA build. On Linux x86-64 PyPI's torch==2.13.0 *is* the CUDA build; for the CPU one
# set TANDEM_TORCH_INDEX=https://download.pytorch.org/whl/cpu (pip then reads torch from there).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
want_test=0
[ "${1:-}" = "--test" ] && want_test=1
PY="${PYTHON:-python3}"
VENV="${TANDEM_VENV:-$here/.venv}"

SUDO=""
[ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"

# Qt's xcb platform plugin and audio need these system libraries.
debs=(libxcb-icccm4 libxcb-keysyms1 libxcb-xinerama0 libxcb-cursor0 libxkbcommon-x11-0 libegl1 libgl1
      libfontconfig1 libdbus-1-3 libpulse0 libportaudio2 xdotool scrot
      dbus-daemon at-spi2-core  # the accessibility bus: is a password field focused, and the active window's element list
      chromium)  # the browser games (trainer/sandbox/games: `sandbox eval --suite games`), driven over DevTools
[ $want_test -eq 1 ] && debs+=(xvfb espeak-ng sox pulseaudio pulseaudio-utils libasound2-plugins xterm  # xterm: the gate's terminal test
                              chromium-driver)  # MiniWoB++ (trainer/sandbox/miniwob_env.py), with the chromium above
if command -v apt-get >/dev/null; then
  missing=()
  for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
  if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
fi

if [ ! -x "$VENV/bin/python" ] && ! "$PY" -m venv "$VENV"; then
  # Debian's python3 makes virtual environments only with python3-venv (ensurepip) installed
  command -v apt-get >/dev/null || exit 1
  rm -rf "$VENV"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends python3-venv
  "$PY" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install -q)
torch_pin="$(grep -o '^torch==[^ ]*' "$here/requirements.txt")"
if [ -n "${TANDEM_TORCH_INDEX:-}" ]; then
  "${pip[@]}" --index-url "$TANDEM_TORCH_INDEX" "$torch_pin"
else
  "${pip[@]}" "$torch_pin"
fi
extras="train,android"
[ $want_test -eq 1 ] && extras="test"
"${pip[@]}" -e "$here[$extras]"
# pyautogui's python3-Xlib 0.15 and pynput's python-xlib 0.33 share the Xlib/ folder; keep 0.33.
"$VENV/bin/python" -c "import Xlib,sys; sys.exit(0 if Xlib.__version__ >= (0, 17) else 1)" 2>/dev/null \
  || "${pip[@]}" --force-reinstall --no-deps "$(grep -o '^python-xlib==[^ ]*' "$here/requirements.txt")"

mkdir -p "$HOME/.local/bin"
ln -sf "$VENV/bin/tandem" "$HOME/.local/bin/tandem"
echo "Tandem: installed into $VENV; run $VENV/bin/tandem (linked from ~/.local/bin/tandem)"
