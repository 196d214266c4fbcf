"""Element lists in the trajectory schema: an observation's list and its source round-trip, bad
lists are refused naming the element, old episodes load; the store (real SQLite), a bundle and a
sync to a real backend on loopback carry the list unchanged; reduction gives each recorded action
the list read before it; the privacy redaction masks personal data in element names and values
(and in the raw lists); a blurred region blanks the elements under it; SFT samples built from a
recording show the step's list as the agent saw it."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from factories import make_episode, screenshot_png

from agent.elements import Element
from agent.schema import Action, Episode, Observation, Provenance, SchemaError, ScreenGeometry, Step

ELEMENTS = [Element("button", "Save", (12, 40, 84, 68)),
            Element("checkbox", "Dark mode", (12, 76, 120, 104), ("checked",)),
            Element("text_field", "Email", (130, 40, 300, 68), ("focused",), "ana@example.org"),
            Element("text_field", "Password", (130, 76, 300, 104), ("password",))]


def with_elements(ep: Episode, elements=ELEMENTS, source="atspi") -> Episode:
    for s in ep.steps:
        s.observation.elements, s.observation.elements_source = list(elements), source
    return ep


def test_an_observation_keeps_its_list_and_old_ones_load():
    g = ScreenGeometry.simple(320, 200)
    obs = Observation("h", 320, 200, g, elements=ELEMENTS, elements_source="atspi")
    d = json.loads(json.dumps(obs.to_dict()))
    assert d["elements"][2] == {"role": "text_field", "name": "Email", "box": [130, 40, 300, 68],
                                "states": ["focused"], "value": "ana@example.org"}
    assert Observation.from_dict(d) == obs
    none = Observation("h", 320, 200, g, elements_source="none: no accessibility bus")
    assert Observation.from_dict(none.to_dict()) == none and none.to_dict()["elements_source"].startswith("none")
    empty = Observation("h", 320, 200, g, elements=[], elements_source="uiautomator2")
    assert Observation.from_dict(empty.to_dict()).elements == []  # an empty list is not "no list"
    old = Observation("h", 320, 200, g).to_dict()
    assert "elements" not in old and "elements_source" not in old  # old episodes keep their dict (and hash)
    back = Observation.from_dict(old)
    assert back.elements is None and back.elements_source is None


@pytest.mark.parametrize("elements,message", [
    ("button", "observation: elements: expected a list, got str"),
    ([{"name": "Save", "box": [0, 0, 1, 1]}], "observation: elements[0]: 'role' must be a non-empty string, got None"),
    ([{"role": "button", "name": "ok", "box": [0, 0, 1, 1]}, {"role": "button", "box": [5, 5, 1]}],
     "observation: elements[1]: 'box' must be four numbers"),
    ([{"role": "button", "box": [9, 9, 1, 1]}], "observation: elements[0]: 'box' [9, 9, 1, 1] ends before it starts"),
    ([{"role": "button", "box": [0, 0, 1, 1], "states": "checked"}], "observation: elements[0]: 'states' must be a list"),
    ([{"role": "text_field", "box": [0, 0, 1, 1], "value": 5}], "observation: elements[0]: 'value' must be a string, got int"),
])
def test_a_malformed_list_is_refused_naming_the_element(elements, message):
    d = Observation("h", 320, 200, ScreenGeometry.simple(320, 200)).to_dict()
    d["elements"] = elements
    with pytest.raises(SchemaError) as e:
        Observation.from_dict(d)
    assert message in str(e.value)
    d = Observation("h", 320, 200, ScreenGeometry.simple(320, 200)).to_dict() | {"elements_source": 3}
    with pytest.raises(SchemaError, match="observation: elements_source must be a string, got int"):
        Observation.from_dict(d)


def test_the_store_a_bundle_and_a_sync_carry_the_list_unchanged(store, tmp_path):
    from agent.storage.bundle import import_file, write_bundle
    from agent.storage.store import Store
    from agent.sync.client import Backoff, SyncClient
    from agent.sync.outbox import Outbox
    from trainer.backend.server_thread import start_in_thread

    ep = with_elements(make_episode(store, 3))
    ep.steps[2].observation.elements, ep.steps[2].observation.elements_source = None, "none: no active window"
    store.save_episode(ep, bump_revision=True)
    stored = store.load_episode(ep.id)
    assert stored.to_dict() == ep.to_dict() and stored.steps[0].observation.elements == ELEMENTS
    # a bundle, imported into another store
    write_bundle(store, tmp_path / "b.zip", [ep.id], include_originals=True)
    other = Store(tmp_path / "other")
    import_file(other, tmp_path / "b.zip")
    assert other.load_episode(ep.id).to_dict() == ep.to_dict()
    other.close()
    # a sync to a real backend on loopback: the backend's copy is the same episode
    backend = start_in_thread(tmp_path / "backend")
    try:
        token = backend.store.add_user("ann", "annotator")
        Outbox(store).submit(ep.id)
        client = SyncClient(store, backend.url, token, backoff=Backoff(0.05, 0.2))
        report = asyncio.run(client.sync(deadline=time.monotonic() + 20))
        assert report.ok, report
        remote = backend.store.store.load_episode(ep.id)
        assert remote.to_dict() == ep.to_dict()
        assert remote.steps[1].observation.elements[3].states == ("password",)
        assert remote.steps[2].observation.elements is None and remote.steps[2].observation.elements_source == "none: no active window"
    finally:
        backend.stop()


def _events(*rows):
    return [dict(r) for r in rows]


def test_reduction_gives_each_action_the_list_read_before_it():
    from agent.recorder.reduce import NO_FRESH_LIST, build_steps

    g = ScreenGeometry.simple(400, 300)
    one = [Element("button", "One", (0, 0, 10, 10)).to_dict()]
    two = [Element("button", "Two", (0, 0, 10, 10)).to_dict()]
    ev = _events(
        {"t": 0.0, "kind": "frame", "t_end": 0.01, "blob": "f0", "width": 400, "height": 300, "why": "start"},
        {"t": 0.5, "kind": "elements", "t_end": 0.6, "elements": one, "source": "atspi"},
        {"t": 1.0, "kind": "mouse_down", "x": 10, "y": 10, "button": "left"},
        {"t": 1.05, "kind": "mouse_up", "x": 10, "y": 10, "button": "left"},
        {"t": 1.02, "kind": "elements", "t_end": 1.1, "elements": two, "source": "atspi"},  # began during the click: not after it
        {"t": 1.3, "kind": "elements", "t_end": 1.4, "elements": two, "source": "atspi"},
        {"t": 1.9, "kind": "elements", "t_end": 2.05, "elements": one, "source": "atspi"},  # ended after the next click began
        {"t": 2.0, "kind": "mouse_down", "x": 20, "y": 20, "button": "left"},
        {"t": 2.05, "kind": "mouse_up", "x": 20, "y": 20, "button": "left"},
        {"t": 2.3, "kind": "elements", "t_end": 2.4, "elements": one, "source": "atspi"},
        {"t": 2.5, "kind": "pause"}, {"t": 3.0, "kind": "resume"},  # read before a pause: stale after it
        {"t": 3.2, "kind": "mouse_down", "x": 30, "y": 30, "button": "left"},
        {"t": 3.25, "kind": "mouse_up", "x": 30, "y": 30, "button": "left"},
        {"t": 3.5, "kind": "elements", "t_end": 3.5, "elements": None, "source": "none: no active window on the accessibility bus"},
        {"t": 4.0, "kind": "mouse_down", "x": 40, "y": 40, "button": "left"},
        {"t": 4.05, "kind": "mouse_up", "x": 40, "y": 40, "button": "left"},
    )
    steps = build_steps(ev, g)
    assert [s.action.name for s in steps] == ["click"] * 4
    got = [([e.name for e in s.observation.elements] if s.observation.elements is not None else None,
            s.observation.elements_source) for s in steps]
    assert got == [(["One"], "atspi"), (["Two"], "atspi"), (None, NO_FRESH_LIST),
                   (None, "none: no active window on the accessibility bus")]
    # a recording that read no lists at all (older ones): no list and no reason
    plain = build_steps([e for e in ev if e["kind"] != "elements"], g)
    assert all(s.observation.elements is None and s.observation.elements_source is None for s in plain)


def test_the_watcher_gives_the_last_reading_before_an_input_and_reads_nothing_while_paused():
    from agent.host.atspi_elements import Reading
    from agent.recorder.element_watch import ElementWatcher

    class Reader:  # a reader whose screen changes on each reading: the list is the reading's number
        available, reason, n = True, "atspi", 0

        def open(self):
            return self

        def read(self, geometry, hidden=None):
            self.n += 1
            return Reading([Element("text_field", "Email", (0, 0, 5, 5), ("focused",), f"v{self.n}")], "atspi")

        def close(self):
            pass

    paused, secret = [False], [False]
    w = ElementWatcher(ScreenGeometry.simple(100, 100), allowed=lambda: not paused[0], masked=lambda: secret[0],
                       interval=0.05, reader=Reader()).start()
    try:
        time.sleep(0.3)
        t = time.monotonic()
        snap = w.before(t)
        assert snap.t1 <= t and snap.elements[0].value.startswith("v") and snap.event()["kind"] == "elements"
        paused[0] = True
        w.clear()
        time.sleep(0.05)
        n = w.readings
        time.sleep(0.3)
        assert w.readings == n  # nothing read while capture is not allowed
        assert w.before(time.monotonic()).elements is None  # nor anything read before the pause given out
        paused[0] = False
        secret[0] = True  # typed secretly into the focused field: its value goes from now on
        time.sleep(0.2)
        secret[0] = False
        time.sleep(0.2)
        assert w.before(time.monotonic()).elements[0].value is None
    finally:
        w.stop()


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("rapidocr")
    from agent.redaction.ocr import OcrEngine

    return OcrEngine()


def test_redaction_masks_personal_data_in_element_names_and_values(store, engine):
    from agent.redaction import review

    g = ScreenGeometry.simple(320, 200)
    h = store.put_blob(screenshot_png(320, 200, label="inbox"))
    listed = [Element("label", "From: jane.doe@example.com", (10, 10, 200, 30)),
              Element("text_field", "Phone", (10, 40, 200, 60), (), "+1 (415) 555-0132"),
              Element("button", "Send", (10, 70, 80, 90))]
    step = Step(0, Observation(h, 320, 200, g, 0.0, elements=listed, elements_source="atspi"), "send it",
                Action("click", {"start_box": (0.1, 0.4)}), Provenance("human"), 0.0, 0.1)
    ep = Episode("Reply to the mail", steps=[step], meta={"recording": {"status": "complete"}})
    store.save_episode(ep)
    store.append_raw_events(ep.id, [{"t": -0.5, "kind": "elements", "t_end": -0.4, "source": "atspi",
                                     "elements": [e.to_dict() for e in listed]}])
    plan = review.scan(store, ep.id, engine=engine)
    assert {k: [s["kind"] for s in v["spans"]] for k, v in plan["texts"].items()} == {
        "step/0/observation/elements/0/name": ["email"], "step/0/observation/elements/1/value": ["phone"]}
    assert review.field_label("step/0/observation/elements/0/name") == "Step 1 element name"
    assert review.field_label("step/0/observation/elements/1/value") == "Step 1 element text"
    review.approve(store, ep.id, "ana", keep_originals=True)
    up = review.upload_view(store, store.load_episode(ep.id))
    names = [(e.name, e.value) for e in up.steps[0].observation.elements]
    assert names == [("From: <email>", None), ("Phone", "<phone>"), ("Send", None)]
    assert "jane.doe" not in json.dumps(up.to_dict()) and "555-0132" not in json.dumps(up.to_dict())
    assert store.load_episode(ep.id).steps[0].observation.elements == listed  # the original stays local
    # originals not kept: the stored episode and the raw lists it was reduced from are masked too
    review.approve(store, ep.id, "ana", keep_originals=False)
    local = store.load_episode(ep.id)
    assert local.steps[0].observation.elements[0].name == "From: <email>"
    raw = [e for e in store.raw_events(ep.id) if e["kind"] == "elements"]
    assert [d.get("value") or d["name"] for d in raw[0]["elements"]] == ["From: <email>", "<phone>", "Send"]


def test_blurring_a_region_blanks_the_elements_under_it(store):
    from agent.recorder.reduce import build_steps
    from agent.recorder.review import blur_region

    g = ScreenGeometry.simple(320, 200)
    h = store.put_blob(screenshot_png(320, 200, label="account"))
    listed = [Element("label", "Card 4111 1111 1111 1111", (10, 10, 200, 30)), Element("button", "Pay", (10, 150, 80, 180))]
    raw = [{"t": 0.0, "kind": "frame", "t_end": 0.01, "blob": h, "width": 320, "height": 200, "why": "start"},
           {"t": 0.2, "kind": "elements", "t_end": 0.3, "source": "atspi", "elements": [e.to_dict() for e in listed]},
           {"t": 1.0, "kind": "mouse_down", "x": 40, "y": 160, "button": "left"},
           {"t": 1.05, "kind": "mouse_up", "x": 40, "y": 160, "button": "left"}]
    ep = Episode("Pay", steps=build_steps(raw, g), meta={"recording": {"status": "complete"}, "screen": g.to_dict()})
    assert ep.steps[0].observation.elements == listed
    store.save_episode(ep)
    store.append_raw_events(ep.id, raw)
    blur_region(store, ep.id, 0, (0.0, 0.0, 0.7, 0.2))  # over the card's label, not the button
    got = store.load_episode(ep.id).steps[0].observation.elements
    assert [(e.role, e.name, e.box) for e in got] == [("label", "", (10, 10, 200, 30)), ("button", "Pay", (10, 150, 80, 180))]
    rebuilt = build_steps(store.raw_events(ep.id), g)  # re-reduction cannot bring the name back
    assert [e.name for e in rebuilt[0].observation.elements] == ["", "Pay"]
    assert "4111" not in json.dumps(store.raw_events(ep.id))


def test_sft_samples_show_the_steps_list_as_the_agent_saw_it(store):
    from trainer.learn.sft import runtime_samples

    ep = with_elements(make_episode(store, 2))
    samples = runtime_samples(ep, store.get_blob)
    texts = [p["text"] for m in samples[0].messages if isinstance(m.get("content"), list)
             for p in m["content"] if p.get("type") == "text"]
    listed = next(t for t in texts if t.startswith("Elements:"))
    assert "[0] button 'Save'" in listed and "[3] text_field 'Password'" in listed and "password" in listed
    bare = runtime_samples(make_episode(store, 2), store.get_blob)  # no list: none shown
    assert not any("Elements:" in json.dumps(m, default=str) for m in bare[0].messages)
