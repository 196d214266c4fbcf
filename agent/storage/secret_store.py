"""Tokens at rest: the sync token a person saves and the embedded backend's admin token.

They go to the operating system's keyring where there is a usable one (the `keyring` package:
macOS Keychain, Windows Credential Locker, the Secret Service of a Linux desktop session), else
to `<data>/secrets.json`, readable by its owner only (mode 0600), never into `tandem.db`, which
is copied around with the data. A token an older version left in the store's settings is moved
out on first read.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

SERVICE = "tandem"
FILE_NAME = "secrets.json"


class SecretStore:
    """get/set/delete named secrets of one data folder."""

    def __init__(self, root, *, use_keyring: bool = True):
        self.root = Path(root)
        self.path = self.root / FILE_NAME
        self._keyring = _usable_keyring() if use_keyring else None
        self.where = "the system keyring" if self._keyring else f"{self.path} (mode 0600)"

    def _name(self, key: str) -> str:
        return f"{self.root.resolve()}:{key}"  # one keyring holds every data folder's secrets

    def get(self, key: str, store=None) -> str | None:
        """The secret, or None. With the data folder's Store, a plaintext copy in its settings
        (left by an older version) is moved here and removed there."""
        value = self._get(key)
        if value is None and store is not None:
            legacy = store.get_setting(key)
            if legacy:
                self.set(key, legacy)
                store.set_setting(key, None)
                value = legacy
        return value

    def _get(self, key: str) -> str | None:
        if self._keyring is not None:
            try:
                return self._keyring.get_password(SERVICE, self._name(key))
            except Exception:  # a locked or vanished keyring: fall back to the file
                self._keyring = None
        return self._read().get(key)

    def set(self, key: str, value: str | None) -> None:
        if value is None:
            self.delete(key)
            return
        if self._keyring is not None:
            try:
                self._keyring.set_password(SERVICE, self._name(key), value)
                return
            except Exception:
                self._keyring = None
                self.where = f"{self.path} (mode 0600)"
        data = self._read()
        data[key] = value
        self._write(data)

    def delete(self, key: str) -> None:
        if self._keyring is not None:
            try:
                self._keyring.delete_password(SERVICE, self._name(key))
            except Exception:  # not there is fine
                pass
        data = self._read()
        if data.pop(key, None) is not None:
            self._write(data)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def _write(self, data: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, not even briefly
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def _usable_keyring():
    """The keyring backend when a real one is configured (its priority above 0), else None."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    try:
        k = keyring.get_keyring()
    except Exception:
        return None
    if isinstance(k, fail.Keyring) or getattr(k, "priority", 0) <= 0:
        return None
    return k


def saved_secret(store, key: str) -> str | None:
    """A secret of the Store's data folder (migrated out of its settings when an older version
    left it there)."""
    return SecretStore(store.root).get(key, store)
