"""The sync backend: the websocket server, its store, the model shelf, the server thread, the
connection budget and the `backend` command."""
