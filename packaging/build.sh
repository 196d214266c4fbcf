#!/usr/bin/env bash
# Builds Tandem's desktop bundle with PyInstaller: dist/tandem/, one folder holding the program
# dist/tandem/tandem (the same as `python main.py`; no Python needed where it runs), its Qt
# plugins, a .desktop entry, the icon and install-desktop-entry.sh.
#
#   bash packaging/build.sh           the annotator's and supervisor's bundle: record, review,
#                                     sync, supervise (remote runs), drive with an endpoint policy;
#                                     no torch, so no local or default model and no Train page
#   bash packaging/build.sh --train   the same with torch and transformers (1.3 GB instead of 0.5 GB)
#
# The build environment is $TANDEM_BUILD_VENV (default build/venv, build/venv-train with
# --train); the output folder's parent is $TANDEM_DIST (default dist). Other platforms: see the
# comments in packaging/tandem.spec.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
train=0
[ "${1:-}" = "--train" ] && train=1
suffix=""
[ $train -eq 1 ] && suffix="-train"
V="${TANDEM_BUILD_VENV:-$here/build/venv$suffix}"
DIST="${TANDEM_DIST:-$here/dist}"

[ -x "$V/bin/python" ] || "${PYTHON:-python3}" -m venv "$V"
pip=("$V/bin/python" -m pip install -q)
if [ $train -eq 1 ]; then
  "${pip[@]}" "$(grep -o '^torch==[^ ]*' "$here/requirements.txt")"  # the exact pin first (see install.sh)
  "${pip[@]}" "$here[train]"
else
  "${pip[@]}" "$here"
fi
"$V/bin/python" -m pip uninstall -q -y tandem  # keep its dependencies; the analysis reads this checkout
"${pip[@]}" -r "$here/packaging/requirements-build.txt"
"$V/bin/python" -c "import Xlib,sys; sys.exit(0 if Xlib.__version__ >= (0, 17) else 1)" 2>/dev/null \
  || "${pip[@]}" --force-reinstall --no-deps "$(grep -o '^python-xlib==[^ ]*' "$here/requirements.txt")"

"$V/bin/python" -m PyInstaller --noconfirm --clean --log-level WARN \
  --distpath "$DIST" --workpath "$here/build/pyinstaller$suffix" "$here/packaging/tandem.spec"
install -m 644 "$here/packaging/tandem.desktop" "$here/assets/tandem.png" "$DIST/tandem/"
install -m 755 "$here/packaging/install-desktop-entry.sh" "$DIST/tandem/"
echo "Tandem: built $DIST/tandem/tandem ($(du -sh "$DIST/tandem" | cut -f1))"
