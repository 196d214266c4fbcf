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

from agent.model_files import (MANIFEST_FILE, ModelDownload, ModelFilesError, check_manifest, model_manifest,
                               pulled_record)

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
    from trainer.server_thread import start_in_thread

    bt = start_in_thread(tmp_path / "backend", models={"chunk_bytes": MIB})
    tokens = {role: bt.store.add_user(role[:3] + "1", role) for role in ("annotator", "supervisor", "admin")}
    bt.announce_model("v0003", {"path": str(model_dir), "mean_success": 0.3})
    yield bt, tokens
    bt.stop()


def test_a_model_pulled_over_sync_has_the_same_hash_and_loads(backend, model_dir, tmp_path):
    from agent.vlm import load_vlm
    from agent.sync.model_pull import pull_model

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
             for h, n in zip(f["chunks"], [min(MIB, f["size"] - k * MIB) for k in range(len(f["chunks"]))])}
    assert res["fetched"] == total["bytes"] - sum(sizes[h] for h in kept[1:])


def test_a_model_changed_on_the_backend_is_refused_and_nothing_is_installed(backend, model_dir, tmp_path):
    from agent.sync.model_pull import pull_model
    from agent.sync.session import RequestRefused

    bt, tokens = backend
    bt.store  # the shelf describes the model on the first request; then its weights change on disk
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
    from trainer.server_thread import start_in_thread

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
    from trainer.backend_store import BackendStore

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
