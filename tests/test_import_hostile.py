"""Importing untrusted files: an episode JSON cannot pull in files outside its folder, a zip bomb
is refused before it inflates, unreferenced blobs are not written, malformed members give an
error naming them, and a refused file leaves the store as it was. Real files, a real store."""
from __future__ import annotations

import json
import zipfile

import pytest
from factories import make_episode, screenshot_png

from agent.storage.bundle import ImportError_, import_file, write_bundle
from agent.storage.store import Store, sha256


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data") as s:
        yield s


def _episode_json(tmp_path, store, screenshot_ref):
    src = Store(tmp_path / "src")
    ep = make_episode(src, n_steps=1)
    src.close()
    doc = ep.to_dict()
    doc["steps"][0]["observation"]["screenshot"] = screenshot_ref
    folder = tmp_path / "upload"
    folder.mkdir(exist_ok=True)
    path = folder / "episode.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("where", ["absolute", "parent", "symlink"])
def test_episode_json_cannot_name_files_outside_its_folder(tmp_path, store, where):
    secret = tmp_path / "secret.png"
    secret.write_bytes(screenshot_png(40, 30, label="private"))  # even a real image is refused
    if where == "absolute":
        ref = str(secret)
    elif where == "parent":
        ref = "../secret.png"
    else:
        (tmp_path / "upload").mkdir()
        (tmp_path / "upload" / "shot.png").symlink_to(secret)
        ref = "shot.png"
    path = _episode_json(tmp_path, store, ref)
    with pytest.raises(ImportError_, match="outside the JSON file's folder"):
        import_file(store, path)
    assert store.counts()["episodes"] == 0 and not list(store.blob_dir.rglob("*/*"))


def test_episode_json_refuses_a_non_image_file(tmp_path, store):
    path = _episode_json(tmp_path, store, "notes.txt")
    (path.parent / "notes.txt").write_text("API_KEY=hunter2\n")
    with pytest.raises(ImportError_, match="not an image file"):
        import_file(store, path)
    assert store.counts()["episodes"] == 0


def test_episode_json_with_its_screenshot_beside_it_imports(tmp_path, store):
    path = _episode_json(tmp_path, store, "shots/one.png")
    (path.parent / "shots").mkdir()
    png = screenshot_png(40, 30, label="mine")
    (path.parent / "shots" / "one.png").write_bytes(png)
    assert import_file(store, path)["episodes"] == 1
    assert store.get_blob(sha256(png)) == png


def test_zip_bomb_is_refused_before_it_inflates(tmp_path, store):
    """A member of 300 MB of zeros deflates to ~300 KB; its header says so, and even a reader
    that trusted no header would stop at the ratio limit."""
    bomb = tmp_path / "bomb.zip"
    fake = "0" * 64
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open(f"blobs/{fake}", "w", force_zip64=True) as f:
            chunk = b"\0" * (1 << 20)
            for _ in range(300):
                f.write(chunk)
        z.writestr("episodes/x.json", json.dumps({"id": "x"}))
    assert bomb.stat().st_size < 2 * 2**20
    with pytest.raises(ImportError_):
        import_file(store, bomb)
    assert store.counts()["episodes"] == 0 and not list(store.blob_dir.rglob("*/*"))
    # the blob itself, wanted by an episode, is refused by its inflated size
    src = Store(tmp_path / "src")
    ep = make_episode(src, n_steps=1)
    want = next(iter(ep.blob_hashes()))
    src.close()
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"episodes/{ep.id}.json", json.dumps(ep.to_dict()))
        with z.open(f"blobs/{want}", "w", force_zip64=True) as f:
            for _ in range(300):
                f.write(b"\0" * (1 << 20))
    with pytest.raises(ImportError_, match="compression bomb|over the limit"):
        import_file(store, bomb)
    assert store.counts()["episodes"] == 0


def _bundle_of_one(tmp_path, n_steps=1):
    """A real bundle of one episode made by write_bundle, and the episode."""
    src = Store(tmp_path / "src")
    ep = make_episode(src, n_steps=n_steps)
    bundle = tmp_path / "b.zip"
    write_bundle(src, bundle, [ep.id])
    src.close()
    return bundle, ep


def test_unreferenced_blobs_are_not_written(tmp_path, store):
    bundle, ep = _bundle_of_one(tmp_path, n_steps=2)
    with zipfile.ZipFile(bundle, "a") as z:
        for k in range(50):
            data = f"junk {k}".encode()
            z.writestr(f"blobs/{sha256(data)}", data)
    res = import_file(store, bundle)
    assert res["episodes"] == 1 and res["blobs"] == len(ep.blob_hashes())
    assert len(list(store.blob_dir.rglob("*/*"))) == len(ep.blob_hashes())


def test_a_bundle_with_one_bad_episode_imports_nothing(tmp_path, store):
    bundle, _ = _bundle_of_one(tmp_path)
    with zipfile.ZipFile(bundle, "a") as z:
        z.writestr("episodes/zz-bad.json", json.dumps({"id": "bad", "steps": "not a list"}))
    with pytest.raises(ImportError_, match="zz-bad.json"):
        import_file(store, bundle)
    assert store.counts()["episodes"] == 0


@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe not utf-8", "not UTF-8"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"{not json", "not valid JSON"),
])
def test_malformed_members_are_named(tmp_path, store, content, needle):
    bundle = tmp_path / "b.zip"
    with zipfile.ZipFile(bundle, "w") as z:
        z.writestr("episodes/e1.json", content)
    with pytest.raises(ImportError_, match=needle):
        import_file(store, bundle)
    path = tmp_path / "e.json"
    path.write_bytes(content)
    with pytest.raises(ImportError_, match=needle):
        import_file(store, path)


def test_encrypted_member_is_refused_by_name(tmp_path, store):
    bundle = tmp_path / "b.zip"
    with zipfile.ZipFile(bundle, "w") as z:
        z.writestr("episodes/e1.json", b"{}")
    raw = bytearray(bundle.read_bytes())
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):  # set the encrypted flag in both headers
        at = raw.find(sig)
        flag_at = at + (6 if sig == b"PK\x03\x04" else 8)
        raw[flag_at] |= 0x1
    bundle.write_bytes(bytes(raw))
    with pytest.raises(ImportError_, match="e1.json is encrypted"):
        import_file(store, bundle)


def _blob_files(store):
    return [p for p in store.blob_dir.rglob("*") if p.is_file()]


def test_a_repeated_step_index_is_refused_first_and_leaves_no_blob(tmp_path, store):
    """The second episode of a bundle repeats a step index: refused by name before anything is
    written (it ended in a raw sqlite3.IntegrityError with 2 orphan blobs, and `check` failed)."""
    src = Store(tmp_path / "src")
    one, two = make_episode(src, n_steps=2), make_episode(src, n_steps=2)
    bundle = tmp_path / "b.zip"
    write_bundle(src, bundle, [one.id, two.id])
    src.close()
    doc = two.to_dict()
    doc["steps"][1]["index"] = 0
    with zipfile.ZipFile(bundle, "a") as z:
        z.writestr(f"episodes/{two.id}.json", json.dumps(doc))  # the later member of that name is the one read
    with pytest.raises(ImportError_, match=f"episodes/{two.id}.json: not a valid episode .*step index 0 appears twice"):
        import_file(store, bundle)
    assert store.counts()["episodes"] == 0 and _blob_files(store) == [] and store.check() == []


def test_a_refusal_while_saving_removes_the_blobs_it_wrote(tmp_path, store):
    """Whatever goes wrong after the blobs are written (here: the episodes' table is locked by
    another connection), the import leaves no blob behind and says why in one line."""
    import sqlite3

    bundle, ep = _bundle_of_one(tmp_path, n_steps=2)
    other = sqlite3.connect(store.root / "tandem.db", timeout=0)
    other.execute("BEGIN EXCLUSIVE")
    store.db.conn.execute("PRAGMA busy_timeout = 50")
    try:
        with pytest.raises(ImportError_, match=f"{bundle}: nothing was imported: database is locked"):
            import_file(store, bundle)
    finally:
        other.rollback()
        other.close()
    assert store.counts()["episodes"] == 0 and _blob_files(store) == [] and store.check() == []


@pytest.mark.parametrize("kind", ["bundle", "json", "jsonl"])
def test_json_that_would_parse_into_gigabytes_is_refused_before_parsing(tmp_path, store, kind):
    """40 MB of `[{}, {}, ...]` (a 532 KB zip) parsed into 1.1 GB; it is refused by its count of
    values, which is read off the text."""
    import random

    rnd = random.Random(0)  # whitespace that deflate cannot squeeze past the ratio limit, as in the attack
    block = b"".join(b"{}," + b" " * rnd.randrange(3) for _ in range(250_000))
    doc = b"[" + block * 40 + b"{}]"
    if kind == "bundle":
        path = tmp_path / "b.zip"
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("episodes/e.json", doc)
        assert path.stat().st_size * 100 > len(doc) > 38 * 2**20
    else:
        path = tmp_path / f"e.{kind}"
        path.write_bytes(doc if kind == "json" else b"{}\n" * (4 * 2**20))
    with pytest.raises(ImportError_, match="holds more than 1000000 JSON values"):
        import_file(store, path)
    assert store.counts()["episodes"] == 0


@pytest.mark.parametrize("field", ["instruction", "meta"])
def test_a_lone_surrogate_is_refused_by_name(tmp_path, store, field):
    """"\\ud800" in JSON decodes to a lone surrogate, which is not text: refused at import (in the
    instruction it ended in a raw traceback; in meta it later crashed sync's content hash)."""
    path = _episode_json(tmp_path, store, "shot.png")
    (path.parent / "shot.png").write_bytes(screenshot_png(40, 30))
    text = path.read_text()
    doc = json.loads(text)
    if field == "instruction":
        doc["instruction"] = "Press OK \ud800"
    else:
        doc["meta"] = {"note": ["fine", "x\udfffy"]}
    path.write_text(json.dumps(doc))  # ASCII JSON with the escape, as a hostile file has it
    where = "instruction" if field == "instruction" else r"meta\.note\[1\]"
    with pytest.raises(ImportError_, match=rf"{where} holds a lone UTF-16 surrogate, which is not text"):
        import_file(store, path)
    assert store.counts()["episodes"] == 0 and _blob_files(store) == []


# ---------------------------------------------------------------- fuzzing

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                            max_leaves=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(_json_values, st.fixed_dictionaries({"steps": _json_values}), st.fixed_dictionaries({"id": st.text(max_size=8), "steps": st.lists(
    st.fixed_dictionaries({"index": st.integers(), "observation": st.dictionaries(
        st.sampled_from(["screenshot", "post_screenshot", "width"]), st.text(max_size=30), max_size=3)}), max_size=3)})))
def test_fuzzed_episode_json_is_imported_or_refused_by_name(tmp_path_factory, doc):
    tmp = tmp_path_factory.mktemp("fz")
    with Store(tmp / "data") as store:
        path = tmp / "e.json"
        path.write_text(json.dumps(doc))
        try:
            import_file(store, path)
        except ImportError_ as e:
            assert str(path) in str(e)
            assert store.counts()["episodes"] == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(members=st.lists(st.tuples(st.sampled_from(["episodes/a.json", "episodes/b.json", "blobs/" + "a" * 64,
                                                   "blobs/x", "other.txt"]),
                                  st.binary(max_size=200) | _json_values.map(lambda v: json.dumps(v).encode())),
                        max_size=5),
       flip=st.integers(min_value=0, max_value=400))
def test_fuzzed_bundles_are_imported_or_refused_by_name(tmp_path_factory, members, flip):
    tmp = tmp_path_factory.mktemp("fz")
    bundle = tmp / "b.zip"
    with zipfile.ZipFile(bundle, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            z.writestr(name, data)
    raw = bytearray(bundle.read_bytes())
    if raw and flip < len(raw):
        raw[flip] ^= 0x5A  # a damaged byte somewhere: headers, data or the directory
    bundle.write_bytes(bytes(raw))
    with Store(tmp / "data") as store:
        try:
            import_file(store, bundle)
        except ImportError_ as e:
            assert str(bundle) in str(e) or "no such file" in str(e)
            assert store.counts()["episodes"] == 0
