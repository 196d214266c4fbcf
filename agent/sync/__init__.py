"""Sync with a backend, Qt-free: the outbox of episodes to upload (in the local store), the
asyncio session and client over agent.protocol, the live link of supervised runs, and models
pulled from the backend. The app's Qt side (app/sync) and the command line build on these.
Importing this package imports nothing heavy."""
SERVER_URL_KEY = "sync.server_url"  # settings: a configured server; absent -> embedded backend
TOKEN_KEY = "sync.token"
