"""Sync between the app and a backend: the outbox (local store), the asyncio client, the
embedded backend, and (only in qt_bridge and status_widget) the Qt side. Importing this package
imports nothing heavy."""
SERVER_URL_KEY = "sync.server_url"  # settings: a configured server; absent -> embedded backend
TOKEN_KEY = "sync.token"
