"""The local store on real files: round trips, edits, blob lifetime, integrity, and a writer
killed with SIGKILL mid-write."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from factories import blob_debris, check_fix, make_episode, screenshot_png

from agent.schema import Action, Episode, Observation, Outcome, Provenance, SchemaError, ScreenGeometry, Step
from agent.storage.store import NotFound, Store, StoreError


def test_episode_round_trip_through_sqlite(store):
    ep = make_episode(store, 5, scale=2.0)
    ep.steps[1].provenance = Provenance(
        "corrected", proposal_thought="wrong", proposal_action=Action("click", {"start_box": (0.9, 0.9)}), decision="edit"
    )
    ep.steps[4].terminated = True
    ep.outcome = Outcome(True, 1.0, "annotator")
    store.save_episode(ep)
    back = store.load_episode(ep.id)
    assert back.to_dict() == ep.to_dict()
    assert back.steps[0].observation.geometry.scale_factor == 2.0
    assert back.steps[1].provenance.proposal_action == Action("click", {"start_box": (0.9, 0.9)})
    assert back.steps[4].terminated and not back.steps[4].truncated


def test_schema_dict_round_trip_and_errors():
    g = ScreenGeometry.simple(100, 50)
    s = Step(0, Observation("a" * 64, 100, 50, g), "t", Action("wait"))
    ep = Episode("x", steps=[s])
    assert Episode.from_dict(json.loads(json.dumps(ep.to_dict()))).to_dict() == ep.to_dict()
    bad = ep.to_dict()
    bad["steps"][0]["action"] = {"name": "teleport", "args": {}}
    with pytest.raises(SchemaError, match="unknown action 'teleport'"):
        Episode.from_dict(bad)
    bad = ep.to_dict()
    bad["schema_version"] = 99
    with pytest.raises(SchemaError, match="newer"):
        Episode.from_dict(bad)
    bad = ep.to_dict()
    del bad["steps"][0]["observation"]["geometry"]
    with pytest.raises(SchemaError, match="missing field 'geometry'"):
        Episode.from_dict(bad)
    with pytest.raises(SchemaError, match="kind must be one of"):
        Episode("x", kind="dream")


def test_identical_screenshots_are_stored_once(store):
    a = store.put_blob(screenshot_png(label="same"))
    b = store.put_blob(screenshot_png(label="same"))
    assert a == b and store.counts()["blobs"] == 1


def test_edit_step_bumps_revision(store):
    ep = make_episode(store, 3)
    s = store.load_episode(ep.id).steps[0]
    s.thought = "edited"
    store.update_step(ep.id, s)
    back = store.load_episode(ep.id)
    assert back.steps[0].thought == "edited" and back.revision == 1


def test_delete_step_renumbers_and_removes_its_blob(store):
    ep = make_episode(store, 3)
    gone = ep.steps[1].observation.screenshot
    store.delete_step(ep.id, 1)
    back = store.load_episode(ep.id)
    assert [s.index for s in back.steps] == [0, 1]
    assert back.steps[1].thought == ep.steps[2].thought
    assert not store.has_blob(gone)
    assert store.check() == []


def test_delete_episode_keeps_blobs_shared_with_others(store):
    a = make_episode(store, 2)
    b = make_episode(store, 2)  # the factory draws the same images: blobs are shared
    shared = a.steps[0].observation.screenshot
    assert shared == b.steps[0].observation.screenshot
    assert store.delete_episode(a.id) == 0
    assert store.has_blob(shared)
    assert store.delete_episode(b.id) == 2
    assert not store.has_blob(shared)
    assert store.counts()["blobs"] == 0
    with pytest.raises(NotFound):
        store.load_episode(a.id)


def test_a_blob_written_for_an_unsaved_episode_survives_a_concurrent_removal(store, tmp_path):
    """The race the three old copies of blob deletion had: a recorder writes a screenshot that is
    already on disk (put_blob skips the write), another part of the app (or another process)
    deletes the last episode that used it, then the recorder saves its episode. The file must
    still be there; once nothing refers to it, it goes."""
    old = make_episode(store, 1)
    shot = old.steps[0].observation.screenshot
    again = store.put_blob(screenshot_png(320, 200, label="step 0"))  # the recorder, before its save
    assert again == shot
    gone = subprocess.run(  # another process deletes the old episode meanwhile
        [sys.executable, "-c", "import sys; from agent.storage.store import Store; "
         "print(Store(sys.argv[1]).delete_episode(sys.argv[2]))", str(store.root), old.id],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert gone.stdout.strip() == "0", gone.stderr  # it removed no blob: the screenshot is pinned
    assert store.has_blob(shot)
    new = make_episode(store, 1)  # the recorder's save refers to it
    assert store.load_episode(new.id).steps[0].observation.screenshot == shot
    assert store.check() == []
    # referenced, then not: removed at once (a deleted step's screenshot does not linger)
    store.delete_step(new.id, 0)
    assert not store.has_blob(shot)
    # a frame the caller wrote itself and decided not to keep is removed despite its pin
    mine = store.put_blob(b"frame the recorder dropped")
    assert store.remove_unreferenced({mine}) == 0 and store.has_blob(mine)
    assert store.remove_unreferenced({mine}, own={mine}) == 1 and not store.has_blob(mine)


def test_an_old_pin_no_longer_protects_a_blob(store, monkeypatch):
    import agent.storage.store as st

    h = store.put_blob(b"abandoned")
    monkeypatch.setattr(st, "PIN_SECONDS", 0.0)
    assert store.remove_unreferenced({h}) == 1 and not store.has_blob(h)


def test_check_fix_while_recording_deletes_nothing_referenced_or_pinned(store):
    """A recording in progress: the recorder's encoder (agent.recorder.encoder, the real thread)
    keeps writing frames into the store while `check --fix` runs in another process. Its frames
    are on disk and pinned but no episode refers to them until the recording is saved; a finished
    episode refers to its own. check --fix removes only what a killed writer left long ago."""
    import numpy as np

    from agent.recorder.encoder import FrameEncoder
    from agent.recorder.screen import Frame

    done = make_episode(store, 2)
    recording = Episode("Record a task")
    store.save_episode(recording)  # as RecordingSession does when it starts: no steps yet
    orphan, stale, fresh = blob_debris(store)
    frames = []
    encoder = FrameEncoder(store, lambda frame, why, blob: frames.append(blob), fmt="png")
    encoder.start()
    rng = np.random.default_rng(0)

    def grab(k):
        raw = rng.integers(0, 255, (48, 64, 4), dtype=np.uint8).tobytes()
        encoder.submit(Frame(k, float(k), float(k), raw, 64, 48, k), "change")

    for k in range(5):
        grab(k)
    deadline = time.time() + 30
    while len(frames) < 5 and time.time() < deadline:
        time.sleep(0.01)
    fixer = subprocess.Popen(check_fix(store.root), stdout=subprocess.PIPE, text=True)
    k = 5
    while fixer.poll() is None:  # the recorder goes on capturing while check --fix runs
        grab(k)
        k += 1
        time.sleep(0.02)
    out = fixer.stdout.read()
    encoder.finish()
    assert fixer.returncode == 0, out
    assert "removed 2 unused file(s)" in out and "store is sound" in out, out
    assert len(frames) == k and len(set(frames)) == k
    assert all(store.has_blob(h) for h in frames) and all(store.has_blob(h) for h in done.blob_hashes())
    assert fresh.exists() and not stale.exists() and not store.has_blob(orphan)
    # the recording is saved: every frame it refers to is there
    g = ScreenGeometry.simple(64, 48)
    recording.steps = [Step(i, Observation(h, 64, 48, g), "", Action("wait")) for i, h in enumerate(frames)]
    store.save_episode(recording)
    again = subprocess.run(check_fix(store.root), capture_output=True, text=True, timeout=120)
    assert store.check() == [] and again.returncode == 0 and again.stdout == "removed 0 unused file(s)\nstore is sound\n"


def test_save_refuses_missing_blobs(store):
    g = ScreenGeometry.simple(10, 10)
    ep = Episode("x", steps=[Step(0, Observation("b" * 64, 10, 10, g), "", Action("wait"))])
    with pytest.raises(StoreError, match="blobs not in the store"):
        store.save_episode(ep)
    assert store.counts()["episodes"] == 0


def test_check_finds_corrupt_missing_and_orphan_blobs(store):
    import agent.storage.store as st

    ep = make_episode(store, 3)
    assert store.check() == []
    h0, h1 = ep.steps[0].observation.screenshot, ep.steps[1].observation.screenshot
    store.blob_path(h0).write_bytes(b"tampered")
    store.blob_path(h1).unlink()
    orphan = store.put_blob(b"nobody uses me")
    problems = "\n".join(store.check())
    assert f"blob {h0} is corrupt" in problems
    assert f"blob {h1} is referenced but missing" in problems
    # pinned: a write whose episode is not saved yet is not a problem, and gc() keeps it
    assert orphan not in problems and store.gc() == 0 and store.has_blob(orphan)
    store.execute("UPDATE blob_pins SET at = ? WHERE hash = ?", [time.time() - st.PIN_SECONDS - 1, orphan])
    assert f"blob {orphan} is not used" in "\n".join(store.check())  # its pin expired: nobody will use it
    assert store.gc() == 1 and not store.has_blob(orphan)


def test_corrupt_database_file_gives_clear_error(tmp_path):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "tandem.db").write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open the store"):
        Store(d)


def test_raw_events_append_and_settings(store):
    ep = make_episode(store, 1)
    store.append_raw_events(ep.id, [{"t": 1.0, "kind": "move", "x": 1, "y": 2}])
    store.append_raw_events(ep.id, [{"t": 1.5, "kind": "press", "key": "a"}])
    assert store.raw_events(ep.id) == [{"t": 1.0, "kind": "move", "x": 1, "y": 2}, {"t": 1.5, "kind": "press", "key": "a"}]
    store.set_setting("server", {"url": "ws://x"})
    assert store.get_setting("server") == {"url": "ws://x"} and store.get_setting("nope", 3) == 3


def test_default_data_dir_env_override(monkeypatch, tmp_path):
    from agent.storage.store import default_data_dir

    monkeypatch.setenv("TANDEM_DATA", str(tmp_path / "x"))
    assert default_data_dir() == tmp_path / "x"
    monkeypatch.delenv("TANDEM_DATA")
    assert "Tandem" in str(default_data_dir())


WRITER = textwrap.dedent(
    """
    import sys, time
    sys.path[:0] = [{root!r}, {tests!r}]
    from agent.storage.store import Store
    from factories import make_episode
    store = Store(sys.argv[1])
    i = 0
    while True:
        ep = make_episode(store, 3, instruction=f"episode {{i}}")
        print(ep.id, flush=True)  # printed only after the commit returned
        i += 1
    """
)


def test_writer_killed_with_sigkill_loses_nothing_committed(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = tmp_path / "data"
    script = tmp_path / "writer.py"
    script.write_text(WRITER.format(root=root, tests=os.path.join(root, "tests")))
    proc = subprocess.Popen([sys.executable, str(script), str(data)], stdout=subprocess.PIPE, text=True)
    committed = []
    deadline = time.time() + 60
    while len(committed) < 25 and time.time() < deadline:
        line = proc.stdout.readline()
        if line:
            committed.append(line.strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(committed) >= 25
    store = Store(data)
    ids = set(store.episode_ids())
    assert set(committed) <= ids  # every commit that returned survived
    for eid in ids:  # and nothing half-written: each episode is whole
        ep = store.load_episode(eid)
        assert len(ep.steps) == 3
    problems = [p for p in store.check() if "is not used by any episode" not in p and "leftover temporary" not in p]
    assert problems == []  # at worst an unreferenced blob or temp file from the killed write
    store.gc()
    assert store.check() == []


def test_stores_made_by_the_last_release_open_and_migrate(tmp_path):
    """tests/data/store-c5882f4 was written by the release before migrations were recorded (a
    local store with episodes, an outbox, routing decisions and a model registry; a backend store
    with a user, an ingested episode and an announced model). Today's code opens both, records
    their schema versions, adds what is new, and keeps every row."""
    import shutil
    from pathlib import Path

    from agent.sync.outbox import Outbox
    from trainer.backend.store import BackendStore
    from trainer.flywheel.registry import Registry
    from trainer.flywheel.routing import Router

    old = tmp_path / "old"
    shutil.copytree(Path(__file__).parent / "data" / "store-c5882f4", old)
    with Store(old / "local") as s:
        assert s.schema_version("store") == 5 and s.has_table("blob_pins")
        eps = s.list_episodes()
        assert len(eps) == 2 and s.check() == []
        assert [e.state for e in Outbox(s).entries()] == ["queued"]
        assert len(Router(s).decisions(1)) == 2
        _routed_the_old_way_moves_out(s, Router(s))
        reg = Registry(s)
        assert reg.current().version == "v0000" and reg.current().note == "base" and reg.current().decision == ""
        assert s.schema_version("flywheel_models") == 2  # the decision column, added
        assert s.migrate("store", __import__("agent.storage.store", fromlist=["x"]).STORE_MIGRATIONS) == 0  # once only
    b = BackendStore(old / "backend")
    try:
        user = b.authenticate((old / "backend" / "ann.token").read_text())
        assert user.name == "ann" and len(b.list_episodes(user)) == 1 and b.latest_model()[0] == "v0003"
        assert [r["status"] for r in b.ingest_log()] == ["stored"]
        assert b.store.schema_version("backend") == 4 and b.relayed_decisions() == []  # the relay log, added
        # the episode arrived as that release's app sent it, routed there: the route moved out of it too
        (ep,) = b.store.list_episodes()
        assert (ep.route, "routing" in ep.meta, b.store.judgement(ep.id).route) == ("unscored", False, "sft")
    finally:
        b.close()
    # a store written by a newer Tandem is refused by name, not misread
    with Store(old / "local") as s:
        s.execute("UPDATE schema_versions SET version = 9 WHERE owner = 'sync_outbox'")
        with pytest.raises(StoreError, match="'sync_outbox' tables are at schema version 9, newer than this Tandem"):
            Outbox(s)


def _routed_the_old_way_moves_out(s: Store, router) -> None:
    """The old release's flywheel wrote its route and reasons into each episode (a: sft, marked
    successful by its annotator; b: ct, failed by the verifier). Opened today, each judgement is
    in `judgements` under the episode's content, the episodes hold none of it, every routing
    record still answers for its content, and the move is idempotent."""
    import agent.storage.store as st

    by_kind = {e.kind: e for e in s.list_episodes()}
    a, b = by_kind["recording"], by_kind["rollout"]
    for ep in (s.load_episode(a.id), s.load_episode(b.id)):
        assert ep.route == "unscored" and "routing" not in ep.meta  # nothing of the flywheel's left in it
    ja, jb = s.judgement(a.id), s.judgement(b.id)
    assert (ja.route, ja.routing["why"], ja.revision) == ("sft", ["judged successful by annotator, every check passed"], 1)
    assert (jb.route, jb.outcome) == ("ct", Outcome(False, 0.0, "verifier"))
    assert s.load_episode(b.id).outcome == Outcome(False, 0.0, "verifier")  # a verifier's mark stays the episode's own
    assert [e.id for e in s.list_episodes(route="sft")] == [a.id] and s.counts()["by_route"] == {"sft": 1, "ct": 1}
    rows = {r["episode_id"]: r for r in router.decisions(1)}
    assert rows[a.id]["content_hash"] == ja.content_hash == s.load_episode_version(a.id)[1]
    before = s.query("SELECT * FROM judgements ORDER BY episode_id")
    with s.transaction():
        st.move_judgements_out(s)  # again: changes nothing
        s.execute("UPDATE episodes SET content_hash = NULL WHERE id = ?", [a.id])  # even on a row it did
        st.move_judgements_out(s)
    assert s.query("SELECT * FROM judgements ORDER BY episode_id") == before
    assert router.growth() == [{"iteration": 1, "sft": 1, "ct": 1, "rejected": 0}]
    assert router.undo(1) == 2 and s.counts()["by_route"] == {"unscored": 2}
    assert s.judgement(a.id).revision == 2  # undone: a change of the same content's judgement
