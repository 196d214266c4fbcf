#!/usr/bin/env bash
# Shipped inside the bundle (dist/tandem/): adds Tandem to this user's application menu and
# PATH, pointing at the folder this script is in. Run it again after moving the folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
data="${XDG_DATA_HOME:-$HOME/.local/share}"
mkdir -p "$data/applications" "$data/icons/hicolor/256x256/apps" "$HOME/.local/bin"
install -m 644 "$here/tandem.png" "$data/icons/hicolor/256x256/apps/tandem.png"
sed "s|^Exec=.*|Exec=\"$here/tandem\"|" "$here/tandem.desktop" > "$data/applications/tandem.desktop"
ln -sf "$here/tandem" "$HOME/.local/bin/tandem"
echo "Tandem: added to the application menu; run it as 'tandem' ($HOME/.local/bin)"
