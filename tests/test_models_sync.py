"""Models reach the apps through the sync protocol: a real backend on loopback ships the shipped
default model in SHA-256-named chunks to `pull_model`, which checks every chunk and file; only
roles allowed to read models get it; an interrupted download resumes with what it lacks; a
corrupted chunk or a file changed under the backend is refused; a model too large to ship is
offered as the endpoint the backend names; a model recorded by another process is pushed."""
from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from agent.storage.model_files import (
    MANIFEST_FILE,
    ModelDownload,
    ModelFilesError,
    check_manifest,
    model_manifest,
    pulled_record,
)

MIB = 2**20


@pytest.fixture
def model_dir(tmp_path):
    from trainer.flywheel.iteration import SHIPPED_MODEL

    d = tmp_path / "served" / "v0003"
    shutil.copytree(SHIPPED_MODEL, d)
    return d


@pytest.fixture
def backend(tmp_path, model_dir):
    """A backend that announced model_dir as v0003, shipping it in 1 MiB chunks."""
    from trainer.backend.server_thread import start_in_thread

    bt = start_in_thread(tmp_path / "backend", models={"chunk_bytes": MIB})
    tokens = {role: bt.store.add_user(role[:3] + "1", role) for role in ("annotator", "supervisor", "admin")}
    bt.announce_model("v0003", {"path": str(model_dir), "mean_success": 0.3})
    yield bt, tokens
    bt.stop()


def test_a_model_pulled_over_sync_has_the_same_hash_and_loads(backend, model_dir, tmp_path):
    from agent.sync.model_pull import pull_model
    from agent.vlm.model import load_vlm

    bt, tokens = backend
    seen = []
    res = pull_model(bt.url, tokens["supervisor"], tmp_path / "C" / "models", progress=lambda d, t: seen.append((d, t)))
    want = model_manifest(model_dir)
    assert res["version"] == "v0003" and res["hash"] == want["hash"] and res["fetched"] == want["bytes"]
    got = tmp_path / "C" / "models" / "v0003"
    assert model_manifest(got)["hash"] == want["hash"]  # every file, byte for byte
    assert (got / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert pulled_record(got)["source"] == bt.url and not (tmp_path / "C" / "models" / "v0003.partial").exists()
    assert seen[-1] == (want["bytes"], want["bytes"]) and len(seen) > 2  # progress as chunks arrive
    model, _ = load_vlm(got, device="cpu")  # a working checkpoint, not just bytes
    assert sum(p.numel() for p in model.parameters()) > 0
    # asking again fetches nothing
    again = pull_model(bt.url, tokens["supervisor"], tmp_path / "C" / "models")
    assert again["already"] and again["fetched"] == 0


def test_only_roles_that_may_read_models_get_them(backend, tmp_path):
    from agent.sync.model_pull import pull_model
    from agent.sync.session import RequestRefused

    bt, tokens = backend
    with pytest.raises(RequestRefused, match="role 'annotator' may not download models"):
        pull_model(bt.url, tokens["annotator"], tmp_path / "models")
    with pytest.raises(RequestRefused, match="no model version 'v9999' was announced"):
        pull_model(bt.url, tokens["admin"], tmp_path / "models", "v9999")
    assert not any((tmp_path / "models").iterdir())


def test_an_interrupted_download_resumes_with_what_it_lacks(backend, model_dir, tmp_path, monkeypatch):
    import agent.sync.model_pull as mp

    bt, tokens = backend
    monkeypatch.setattr(mp, "WINDOW", 1)
    dest = tmp_path / "models"

    class Cut(Exception):
        pass

    def cut_after_three(done, total):
        cut_after_three.calls += 1
        if cut_after_three.calls > 3:  # the first call is before any chunk
            raise Cut()
    cut_after_three.calls = 0
    with pytest.raises(Cut):
        mp.pull_model(bt.url, tokens["supervisor"], dest, progress=cut_after_three)
    partial = dest / "v0003.partial" / "chunks"
    kept = sorted(p.name for p in partial.iterdir())
    assert len(kept) == 3 and not (dest / "v0003").exists()
    # one kept chunk is damaged on disk meanwhile: it is checked again and fetched again
    (partial / kept[0]).write_bytes(b"garbage")
    res = mp.pull_model(bt.url, tokens["supervisor"], dest)
    total = model_manifest(model_dir)
    assert res["resumed_chunks"] == 2 and res["hash"] == total["hash"]
    sizes = {h: n for f in check_manifest(model_manifest(model_dir, MIB))["files"]
             for h, n in zip(f["chunks"], [min(MIB, f["size"] - k * MIB) for k in range(len(f["chunks"]))], strict=True)}
    assert res["fetched"] == total["bytes"] - sum(sizes[h] for h in kept[1:])


def test_a_model_changed_on_the_backend_is_refused_and_nothing_is_installed(backend, model_dir, tmp_path):
    from agent.sync.model_pull import pull_model
    from agent.sync.session import RequestRefused

    bt, tokens = backend
    # the shelf describes the model on the first request; then its weights change on disk
    asyncio.run(_describe(bt.url, tokens["supervisor"]))
    weights = model_dir / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(RequestRefused, match="changed on the backend since it was described"):
        pull_model(bt.url, tokens["supervisor"], tmp_path / "models")
    assert not (tmp_path / "models" / "v0003").exists()
    # described again, the changed model arrives whole and with its new hash
    res = pull_model(bt.url, tokens["supervisor"], tmp_path / "models")
    assert res["hash"] == model_manifest(model_dir)["hash"]


async def _describe(url, token):
    from agent.sync.session import Session

    s = await Session.open(url, token)
    try:
        return (await s.request("get_model")).body
    finally:
        await s.close()


def test_corrupt_chunks_and_hostile_manifests_are_refused(model_dir, tmp_path):
    m = model_manifest(model_dir, MIB)
    dl = ModelDownload(m, tmp_path / "out" / "v1")
    h = dl.missing()[0]
    with pytest.raises(ModelFilesError, match=f"chunk {h} is corrupt"):
        dl.add(h, b"not the chunk")
    with pytest.raises(ModelFilesError, match="not part of this model"):
        dl.add("0" * 64, b"")
    with pytest.raises(ModelFilesError, match="chunks are still missing"):
        dl.finish()
    for bad_path in ("../escape", "/etc/passwd", "a/../../b", ".hidden", "dir\\win"):
        hostile = json.loads(json.dumps(m))
        hostile["files"][0]["path"] = bad_path
        with pytest.raises(ModelFilesError, match="unsafe or repeated file path"):
            check_manifest(hostile)
    forged = json.loads(json.dumps(m))
    forged["files"][0]["sha256"] = "0" * 64  # the model hash no longer matches
    with pytest.raises(ModelFilesError, match="hash does not match its files"):
        check_manifest(forged)
    short = json.loads(json.dumps(m))
    big = max(short["files"], key=lambda f: f["size"])
    big["chunks"] = big["chunks"][:-1]
    with pytest.raises(ModelFilesError, match="chunk hashes for"):
        check_manifest(short)
    with pytest.raises(ModelFilesError, match="not a model folder"):
        model_manifest(tmp_path)
    # our own record beside the files is not part of the model
    (model_dir / MANIFEST_FILE).write_text("{}")
    assert model_manifest(model_dir)["hash"] == m["hash"]


def test_a_model_too_large_to_ship_is_offered_as_the_backends_endpoint(tmp_path, model_dir):
    from agent.sync.model_pull import pull_model
    from agent.sync.session import RequestRefused
    from trainer.backend.server_thread import start_in_thread

    endpoint = {"url": "http://gpu-box:8000/v1", "model": "tandem-v0003"}
    for kw, expect in (({"max_bytes": MIB, "endpoint": endpoint}, "endpoint"), ({"max_bytes": MIB}, "refused")):
        bt = start_in_thread(tmp_path / f"backend-{expect}", models=kw)
        try:
            token = bt.store.add_user("sup", "supervisor")
            bt.announce_model("v0003", {"path": str(model_dir)})
            if expect == "endpoint":
                res = pull_model(bt.url, token, tmp_path / "models")
                assert res["endpoint"] == endpoint and "path" not in res
            else:
                with pytest.raises(RequestRefused, match="more than this backend ships .* no endpoint serves it"):
                    pull_model(bt.url, token, tmp_path / "models")
        finally:
            bt.stop()
    assert not (tmp_path / "models" / "v0003").exists()


def test_a_model_recorded_by_another_process_reaches_connected_clients(backend):
    """`flywheel run --data B` on the backend's folder records its model in the store; the running
    backend notices and pushes it, as it does an announcement over the wire."""
    from agent import protocol as P
    from agent.sync.session import Session
    from trainer.backend.store import BackendStore

    bt, tokens = backend

    async def listen():
        s = await Session.open(bt.url, tokens["supervisor"])
        try:
            first = await s.next_event(10)  # the current model, on connect
            other = BackendStore(bt.store.root)  # another process's view of the same folder
            try:
                other.announce_model("v0004", {"path": "/elsewhere"})
            finally:
                other.close()
            return first, await s.next_event(10)
        finally:
            await s.close()

    first, pushed = asyncio.run(listen())
    assert isinstance(first, P.ModelVersion) and first.version == "v0003"
    assert isinstance(pushed, P.ModelVersion) and pushed.version == "v0004"


# ---------------------------------------------------------------- a hostile backend
def forged_model(files: dict[str, bytes], chunk_bytes: int = 64) -> tuple[dict, dict[str, bytes]]:
    """A manifest a hostile backend makes up for `files` (any names), consistent with itself, and
    its chunks by hash."""
    import hashlib

    from agent.storage.model_files import model_hash

    entries, chunks = [], {}
    for path, data in files.items():
        pieces = [data[k:k + chunk_bytes] for k in range(0, len(data), chunk_bytes)]
        chunks.update({hashlib.sha256(p).hexdigest(): p for p in pieces})
        entries.append({"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "chunks": [hashlib.sha256(p).hexdigest() for p in pieces]})
    return ({"files": entries, "bytes": sum(len(d) for d in files.values()), "hash": model_hash(entries),
             "chunk_bytes": chunk_bytes}, chunks)


TINY = {"config.json": b'{"model_type": "tiny"}', "weights.bin": bytes((7 * i + i // 256) % 256 for i in range(512))}


@pytest.fixture
def data_folder(tmp_path):
    """A supervisor's data folder (a real store) and an unrelated folder beside it, with files to lose."""
    from agent.storage.store import Store

    data, victim = tmp_path / "data", tmp_path / "victim"
    Store(data).close()
    victim.mkdir()
    for f in (data / "keep.txt", data / "blobs" / "keep.txt", victim / "precious.txt"):
        f.parent.mkdir(exist_ok=True)
        f.write_text("keep me")
    return data, victim


def _intact(data, victim=None) -> bool:
    """Every file the data_folder fixture made is still there."""
    kept = [data / "keep.txt", data / "blobs" / "keep.txt"] + ([victim / "precious.txt"] if victim else [])
    return (data / "tandem.db").is_file() and all(f.is_file() and f.read_text() == "keep me" for f in kept)


@pytest.mark.parametrize("version", ["..", "../victim", "VICTIM", "v1/../..", "."])
def test_a_model_version_that_is_a_path_is_refused_before_anything_is_touched(data_folder, version):
    """The `model` reply's version names the folder a pull writes and first removes: `..` deleted
    the whole data folder, an absolute one replaced an unrelated folder."""
    from agent.sync.model_pull import pull_model
    from agent.sync.session import SyncError
    from tests.hostile_backend import HostileBackend, model_server

    data, victim = data_folder
    version = str(victim) if version == "VICTIM" else version
    manifest, chunks = forged_model(TINY)
    with HostileBackend(model_server(version, manifest, chunks)) as hb:
        with pytest.raises(SyncError, match="the server's reply is invalid: model: field 'version' must be a model "
                                            "version name") as e:
            pull_model(hb.url, "token", data / "models")
    assert "\n" not in str(e.value)
    assert _intact(data, victim) and sorted(p.name for p in victim.iterdir()) == ["precious.txt"]
    assert not any((data / "models").iterdir()) and not (data.parent / "data.partial").exists()
    assert [ev.type for ev in hb.asked] == ["get_model"]  # not one chunk asked for


def test_announced_versions_that_are_paths_never_reach_the_app(data_folder):
    """`model_version` pushed to apps ("Use model ..") and a version asked for by name (the app's
    button, `models pull --version`) are checked as names too."""
    from agent import protocol as P
    from agent.sync.model_pull import pull_model
    from agent.sync.session import Session
    from tests.hostile_backend import HostileBackend, frame

    data, _ = data_folder
    greeting = [frame("model_version", version="..", info={}), frame("model_version", version="/etc", info={}),
                frame("model_version", version="v0005", info={})]

    async def heard():
        s = await Session.open(hb.url, "token")
        try:
            events = [await s.next_event(10) for _ in range(3)]
        finally:
            await s.close()
        return events

    with HostileBackend(lambda ev: [], greeting=greeting) as hb:
        events = asyncio.run(heard())
        assert [ev.version for ev in events if isinstance(ev, P.ModelVersion)] == ["v0005"]
        assert all("must be a model version name" in ev.reason for ev in events if isinstance(ev, P.ProtocolError))
        for bad in ("..", "/etc", "a/b", "x" * 65):
            with pytest.raises(ModelFilesError, match="not a model version name"):
                pull_model(hb.url, "token", data / "models", bad)
        assert not [ev for ev in hb.asked if ev.type == "get_model"]
    assert _intact(data)


def test_models_pull_cli_says_what_was_refused_in_one_line(data_folder):
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.hostile_backend import HostileBackend, model_server

    data, victim = data_folder
    manifest, chunks = forged_model(TINY)
    with HostileBackend(model_server("..", manifest, chunks)) as hb:
        for extra, says in (([], "the server's reply is invalid: model: field 'version' must be a model version name"),
                            (["--version", str(victim)], f"not a model version name: '{victim}'")):
            p = subprocess.run([sys.executable, str(ROOT / "main.py"), "models", "pull", "--data", str(data),
                                "--server", hb.url, "--token", "t", *extra], capture_output=True, text=True, cwd=ROOT,
                               timeout=120)
            assert p.returncode == 1 and p.stderr.count("\n") == 1 and p.stderr.startswith("models pull: "), p.stderr
            assert says in p.stderr
    assert _intact(data, victim) and not any((data / "models").iterdir())


def test_a_manifest_with_a_repeated_chunk_or_larger_than_the_limit_is_refused(backend, tmp_path):
    """One 64-byte chunk listed 128 times would be written 128 times (one 8 MiB chunk so: 1 GiB);
    a model larger than this machine's limit is refused before a chunk is fetched."""
    from agent.storage.store import Store
    from agent.sync.model_pull import DEFAULT_MAX_PULL_BYTES, max_pull_bytes, pull_model
    from tests.hostile_backend import HostileBackend, model_server

    manifest, chunks = forged_model({**TINY, "weights.bin": b"w" * 64 * 128})
    assert len(manifest["files"][1]["chunks"]) == 128 and len(chunks) == 2
    dest = tmp_path / "models"
    with HostileBackend(model_server("v0001", manifest, chunks)) as hb:
        with pytest.raises(ModelFilesError, match=r"weights.bin: chunk [0-9a-f]{64} is listed more than once"):
            pull_model(hb.url, "token", dest)
        assert not [ev for ev in hb.asked if ev.type == "get_model_chunk"]
    assert not any(dest.iterdir())

    bt, tokens = backend
    with pytest.raises(ModelFilesError, match=r"the model is 0.01 GiB, more than this machine takes \(0.00 GiB\)"):
        pull_model(bt.url, tokens["supervisor"], dest, max_bytes=MIB)
    assert not any(dest.iterdir())
    store = Store(tmp_path / "C")
    try:
        assert max_pull_bytes(store) == DEFAULT_MAX_PULL_BYTES
        store.set_setting("models.max_gib", 0.5)
        assert max_pull_bytes(store) == 2**29
    finally:
        store.close()


@pytest.mark.parametrize("files, says", [
    ({"weights\x00.bin": b"w" * 100}, "unsafe or repeated file path in the model manifest: 'weights\\x00.bin'"),
    ({"w" * 5000: b"w" * 100}, "file path too long in the model manifest (5000 characters"),
    ({"a": b"file a", "a/b": b"file a/b"}, "names 'a' both as a file and as a folder"),
    ({"a/b/c": b"deep", "a/b": b"file a/b"}, "names 'a/b' both as a file and as a folder"),
    ({"a//b": b"not normal"}, "unsafe or repeated file path"),
])
def test_hostile_file_names_end_in_one_clear_error_and_leave_nothing(tmp_path, files, says):
    from agent.sync.model_pull import pull_model
    from tests.hostile_backend import HostileBackend, model_server

    manifest, chunks = forged_model({"config.json": b"{}", **files})
    dest = tmp_path / "models"
    with HostileBackend(model_server("v0001", manifest, chunks)) as hb:
        with pytest.raises(ModelFilesError) as e:
            pull_model(hb.url, "token", dest)
    assert says in str(e.value) and "\n" not in str(e.value) and len(str(e.value)) < 300
    assert not any(dest.iterdir())  # no .partial folder


@pytest.mark.parametrize("how", ["silent", "forged"])
def test_a_chunk_that_never_arrives_times_out_by_name_and_is_retried(tmp_path, how):
    """A server that never sends a chunk ends each try after `timeout` with the chunk named; one that
    sends bytes that do not match its hash ends it at once. The pull is tried again, and what
    arrived is kept."""
    from agent import protocol as P
    from agent.sync.model_pull import pull_model
    from agent.sync.session import SyncError
    from tests.hostile_backend import HostileBackend, model_server

    manifest, chunks = forged_model(TINY)
    bad = manifest["files"][1]["chunks"][2]

    def chunk(h):
        if h != bad:
            return [P.encode_blob(h, chunks[h])]
        return [] if how == "silent" else [P.encode_blob(h, b"forged bytes")]

    dest = tmp_path / "models"
    with HostileBackend(model_server("v0001", manifest, chunks, chunk=chunk)) as hb:
        says = (f"chunk {bad} of model v0001 did not arrive from the server within 0.5 s" if how == "silent"
                else f"refused what the server sent: blob {bad} does not match its content")
        with pytest.raises(SyncError, match=says):
            pull_model(hb.url, "token", dest, timeout=0.5)
        asked = [ev.body["hash"] for ev in hb.asked if ev.type == "get_model_chunk"]
    assert asked.count(bad) == 3 and len(asked) == len(chunks) + 2  # three tries; the rest fetched once
    assert sorted(p.name for p in (dest / "v0001.partial" / "chunks").iterdir()) == sorted(set(chunks) - {bad})


def test_a_backend_that_never_answers_is_named_and_retried(tmp_path):
    from agent.sync.model_pull import pull_model
    from agent.sync.session import SyncError
    from tests.hostile_backend import HostileBackend

    with HostileBackend(lambda ev: []) as hb:
        with pytest.raises(SyncError, match="no reply to get_model from the server within 0.5 s"):
            pull_model(hb.url, "token", tmp_path / "models", timeout=0.5)
    assert [ev.type for ev in hb.asked] == ["get_model"] * 3 and not any((tmp_path / "models").iterdir())


@pytest.mark.parametrize("link", ["files", "chunks", ""])
def test_a_partial_folder_holding_a_link_is_not_written_through(backend, model_dir, tmp_path, link):
    """`<version>.partial/files` (or chunks/, or the .partial folder itself) left as a link: the
    pull wrote the model through it and installed the link as models/<version>."""
    from agent.sync.model_pull import pull_model

    bt, tokens = backend
    dest, elsewhere = tmp_path / "C" / "models", tmp_path / "elsewhere"
    partial = dest / "v0003.partial"
    elsewhere.mkdir()
    (partial / link if link else partial).parent.mkdir(parents=True, exist_ok=True)
    (partial / link if link else partial).symlink_to(elsewhere, target_is_directory=True)
    res = pull_model(bt.url, tokens["supervisor"], dest)
    got = dest / "v0003"
    assert not got.is_symlink() and got.is_dir() and res["path"] == str(got)
    assert model_manifest(got)["hash"] == model_manifest(model_dir)["hash"]
    assert list(elsewhere.iterdir()) == [] and not partial.exists()


def test_clients_are_not_told_where_the_backend_keeps_its_models(backend, model_dir):
    """model_version (pushed to everyone, annotators too) and the model reply carry the model's
    info without the backend's folder."""
    from agent import protocol as P
    from agent.sync.session import Session
    from trainer.backend.store import BackendError

    bt, tokens = backend

    async def told(token, ask):
        s = await Session.open(bt.url, token)
        try:
            return (await s.request("get_model")).body if ask else await s.next_event(10)
        finally:
            await s.close()

    pushed = asyncio.run(told(tokens["annotator"], False))
    assert isinstance(pushed, P.ModelVersion) and pushed.info == {"mean_success": 0.3}
    reply = asyncio.run(told(tokens["supervisor"], True))
    assert reply["info"] == {"mean_success": 0.3} and str(model_dir) not in json.dumps(reply)
    with pytest.raises(BackendError, match="not a model version name: '../x'"):
        bt.store.announce_model("../x", {"path": str(model_dir)})
    # one an older release let through stays in the table, and is never pushed
    bt.store.store.upsert("models", {"version": "..", "info": "{}", "announced_at": 2e9}, pk="version")
    assert bt.store.latest_model()[0] == "v0003"
    pushed = asyncio.run(told(tokens["annotator"], False))
    assert isinstance(pushed, P.ModelVersion) and pushed.version == "v0003"


def test_the_flywheel_registers_only_version_names(store, model_dir):
    from trainer.flywheel import FlywheelError
    from trainer.flywheel.registry import Registry

    reg = Registry(store)
    for bad in ("../v1", "/tmp/v1", "v1/v2", ""):
        with pytest.raises(FlywheelError, match="not a model version name"):
            reg.register(model_dir, version=bad or " ")
    assert reg.register(model_dir).version == "v0000" and [v.version for v in reg.versions()] == ["v0000"]
