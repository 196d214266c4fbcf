"""Tokens at rest: never in tandem.db, a 0600 file where there is no system keyring, moved out
of the settings where an older version left them; backend tokens expire."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import pytest

from agent.storage.secret_store import SecretStore, saved_secret
from agent.storage.store import Store
from tests.conftest import ROOT


def test_secrets_go_to_an_owner_only_file_without_a_keyring(tmp_path):
    s = SecretStore(tmp_path, use_keyring=False)
    s.set("sync.token", "tdm_abc_secret")
    mode = stat.S_IMODE(os.stat(tmp_path / "secrets.json").st_mode)
    assert mode == 0o600
    assert SecretStore(tmp_path, use_keyring=False).get("sync.token") == "tdm_abc_secret"
    s.set("sync.token", None)
    assert s.get("sync.token") is None


def test_a_token_an_older_version_left_in_the_settings_is_moved_out(tmp_path):
    with Store(tmp_path) as store:
        store.set_setting("sync.token", "tdm_old_plain")
        assert saved_secret(store, "sync.token") == "tdm_old_plain"
        assert store.get_setting("sync.token") is None
        assert saved_secret(store, "sync.token") == "tdm_old_plain"  # from the secret store now


def test_sync_save_keeps_the_token_out_of_the_database(tmp_path):
    """`sync --save` against a real backend: the token lands in the secret store, not tandem.db."""
    from trainer.backend.server_thread import start_in_thread

    backend = start_in_thread(tmp_path / "backend")
    token = backend.store.add_user("ann", "annotator")
    data = tmp_path / "d"
    try:
        r = subprocess.run([sys.executable, str(ROOT / "main.py"), "sync", "--server", backend.url, "--token", token,
                            "--save", "--timeout", "20", "--data", str(data)], capture_output=True, text=True, timeout=120)
    finally:
        backend.stop()
    assert r.returncode == 0, r.stderr
    assert "token saved in" in r.stderr
    with Store(data) as store:
        assert store.get_setting("sync.token") is None
        assert saved_secret(store, "sync.token") == token
    assert token.encode() not in (data / "tandem.db").read_bytes()


def test_backend_tokens_expire(tmp_path, monkeypatch):
    from trainer.backend import store as bs

    store = bs.BackendStore(tmp_path / "b")
    try:
        short = store.add_user("temp", "annotator", days=1)
        never = store.add_user("root", "admin", days=0)
        user = store.authenticate(short)
        assert store.sessions_still_valid([user]) == [True]
        later = time.time() + 2 * 86400
        monkeypatch.setattr(bs.time, "time", lambda: later)
        with pytest.raises(bs.BackendError, match="expired on"):
            store.authenticate(short)
        assert store.sessions_still_valid([user]) == [False]  # a live session is cut by the sweep
        assert store.authenticate(never).role == "admin"
        with pytest.raises(bs.BackendError, match=">= 0 days"):
            store.add_user("x", "annotator", days=-1)
    finally:
        store.close()
