"""Hooks into the host system: accessibility elements, the focused window, password focus, terminal
processes and the kill switch."""
