"""The app's side of sync: the embedded backend, the command line (submit, sync, models), and
(only in qt_bridge and status_widget) the Qt side. The Qt-free core is agent.sync. Importing this
package imports nothing heavy."""
from agent.sync import SERVER_URL_KEY, TOKEN_KEY  # the settings keys, where the app reads them

__all__ = ["SERVER_URL_KEY", "TOKEN_KEY"]
