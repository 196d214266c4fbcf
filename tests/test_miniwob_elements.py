"""MiniWoB++ element lists (trainer.sandbox.miniwob_elements): the CSS-to-screenshot mapping against
miniwob's own screenshot code; in real headless Chromium, a page of known layout (boxes on the
screenshot's pixels, what is listed and what is not, a click at each centre acting on its element),
a scan that fails or runs out of time (the episode goes on without a list), the list reaching a
policy's messages, and the "snapped oracle": on seven tasks, each oracle click lies inside a listed
element and a click at that element's centre, written as the pointer writes it, solves the task
as often as the oracle does."""
from __future__ import annotations

import io

import numpy as np
import pytest

from agent.elements import Element, format_lines, parse_block
from agent.schema import Action
from trainer.sandbox.miniwob_elements import css_to_screen, screen_scale
from trainer.sandbox.miniwob_env import TASK_HEIGHT, TASK_WIDTH, available

MISSING = available()
needs_miniwob = pytest.mark.skipif(MISSING is not None, reason=f"MiniWoB++ not available here: {MISSING}")
SNAP_TASKS = ["click-test", "click-button", "click-dialog", "click-link", "enter-text", "focus-text", "click-checkboxes"]
SEEDS = range(8)


# ------------------------------------------------------------ the mapping, against miniwob's screenshot code
class _PNGDriver:
    """What miniwob.screenshot.get_screenshot asks of a WebDriver: the viewport as PNG bytes."""

    def __init__(self, image):
        self.image = image

    def get_screenshot_as_png(self) -> bytes:
        buf = io.BytesIO()
        self.image.save(buf, format="PNG")
        return buf.getvalue()


@pytest.mark.parametrize("inner,ratio", [((780, 437), 1.0), ((780, 437), 2.0), ((780, 437), 1.25), ((500, 320), 1.5)])
def test_css_boxes_land_where_miniwobs_screenshot_draws_them(inner, ratio):
    pytest.importorskip("miniwob")
    from miniwob.screenshot import get_screenshot
    from PIL import Image, ImageDraw

    rect = (23.0, 97.0, 71.0, 131.0)  # CSS px: a 48x34 red block in the task area
    png = Image.new("RGB", (round(inner[0] * ratio), round(inner[1] * ratio)), "white")
    ImageDraw.Draw(png).rectangle([round(v * ratio) for v in rect[:2]] + [round(v * ratio) - 1 for v in rect[2:]],
                                  fill=(255, 0, 0))
    shot = np.asarray(get_screenshot(_PNGDriver(png), inner[0], inner[1], TASK_WIDTH, TASK_HEIGHT))
    ys, xs = np.nonzero((shot[:, :, 0] > 200) & (shot[:, :, 1] < 60))
    drawn = (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
    scale = screen_scale(inner[0], inner[1], ratio, TASK_WIDTH, TASK_HEIGHT)
    box = css_to_screen(rect, scale, TASK_WIDTH, TASK_HEIGHT)
    assert all(abs(a - b) <= 1 for a, b in zip(box, drawn, strict=True)), (box, drawn, scale)  # resampling blurs one pixel
    if ratio in (1.0, 2.0):  # no resampling error: exactly
        assert box == drawn == (23, 97, 71, 131) and scale == (1.0, 1.0)


def test_css_to_screen_clips_to_the_task_area_and_checks_its_input():
    assert css_to_screen((150.4, 200.0, 190.0, 230.0), (1.0, 1.0), 160, 210) == (150, 200, 160, 210)
    assert css_to_screen((170.0, 10.0, 200.0, 30.0), (1.0, 1.0), 160, 210) is None  # right of the task area
    assert css_to_screen((10.0, 10.0, 10.5, 30.0), (1.0, 1.0), 160, 210) is None  # under a pixel wide
    assert css_to_screen((10.0, 10.0, 20.0, 20.0), (2.0, 0.5), 160, 210) == (20, 5, 40, 10)
    with pytest.raises(ValueError, match="device_pixel_ratio must be a positive number, got 0"):
        screen_scale(780, 437, 0, 160, 210)
    with pytest.raises(ValueError, match="holds no 160x210 task area"):
        screen_scale(100, 100, 0.001, 160, 210)


# ------------------------------------------------------------ real Chromium
@pytest.fixture(scope="module")
def env():
    if MISSING:
        pytest.skip(f"MiniWoB++ not available here: {MISSING}")
    from trainer.sandbox.miniwob_env import MiniWoBEnv

    e = MiniWoBEnv(SNAP_TASKS, max_steps=10, episode_seconds=60)
    yield e
    e.close()


def by_name(elements, name: str) -> Element:
    found = [e for e in elements if e.name == name]
    assert len(found) == 1, (name, elements)
    return found[0]


def pointer_click(env, obs, element: Element) -> list[Action]:
    """A click at `element`'s centre as the pointer writes it: the entry's model-space box from the
    list the model reads (agent.elements.format_lines), its centre in whole pixels; parsed as the
    episode runner parses a reply (the env takes actions, not text)."""
    from agent.grammar import parse_reply

    h, w = obs["screenshot"].shape[:2]
    entries = parse_block(format_lines(obs["elements"], env.coords_space, w, h))
    cx, cy = entries[obs["elements"].index(element)].center
    parsed = parse_reply(f"Thought: click {element.name}\nAction: click(start_box='({cx},{cy})')", env.coords_space,
                         w, h, platforms=(env.platform,))
    assert parsed, parsed.reason
    return list(parsed.actions)


LAYOUT = """
document.getElementById('area').innerHTML = `
 <button id="t-go" style="position:fixed;left:20px;top:100px;width:50px;height:30px;margin:0;padding:0;border:0;
   background:#f00;color:#f00">Go</button>
 <label id="t-lab" style="position:fixed;left:90px;top:60px;font:12px sans-serif">
   <input type="checkbox" id="t-box" style="margin:0" checked>Agree</label>
 <input id="t-pw" type="password" value="secret" style="position:fixed;left:90px;top:90px;width:60px;height:16px">
 <input id="t-name" placeholder="Your name" value="Ann" style="position:fixed;left:90px;top:120px;width:60px;height:16px">
 <button id="t-hidden" style="position:fixed;left:10px;top:150px;visibility:hidden">Hidden</button>
 <button id="t-zero" style="position:fixed;left:10px;top:150px;width:0;height:0;padding:0;border:0"></button>
 <button id="t-under" style="position:fixed;left:20px;top:160px;width:40px;height:20px">Under</button>
 <div style="position:fixed;left:15px;top:155px;width:60px;height:40px;background:#00f;z-index:5"></div>
 <button id="t-edge" style="position:fixed;left:140px;top:185px;width:40px;height:20px;margin:0;padding:0">Edge</button>
 <span id="t-more" style="position:fixed;left:90px;top:150px;cursor:pointer;color:#0a0">more</span>`;
window.tClicks = [];
document.addEventListener('click', function (e) { window.tClicks.push(e.target.id); }, true);
"""


@needs_miniwob
def test_a_page_of_known_layout_is_listed_on_the_screenshots_pixels(env):
    env.reset(seed=0, options={"family": "click-test-2"})  # a page the other tests load afresh
    env.driver.execute_script(LAYOUT)
    obs, *_ = env.step(Action("wait", {}))
    assert env.scale == (1.0, 1.0) and obs["elements_source"] == "dom"
    els = obs["elements"]
    names = [e.name for e in els]
    # the instruction is the prompt's, not the list's; hidden, zero-size and covered are not listed
    assert names == ["Go", "Agree", "", "Your name", "Edge", "more"], els
    go = by_name(els, "Go")
    assert go == Element("button", "Go", (20, 100, 70, 130))
    ys, xs = np.nonzero((obs["screenshot"][:, :, 0] > 200) & (obs["screenshot"][:, :, 1] < 60))
    assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == go.box  # the box is where the screenshot shows it
    agree = by_name(els, "Agree")
    assert agree.role == "checkbox" and agree.states == ("checked",)
    label = env.driver.execute_script("return document.getElementById('t-lab').getBoundingClientRect().toJSON();")
    assert agree.box == css_to_screen((label["left"], label["top"], label["right"], label["bottom"]), (1, 1), 160, 210)
    pw = els[2]
    assert (pw.role, pw.states, pw.value) == ("text_field", ("password",), None)  # no password shown
    name = by_name(els, "Your name")
    assert (name.role, name.value, name.states) == ("text_field", "Ann", ())
    assert by_name(els, "Edge").box == (140, 185, 160, 205)  # clipped at the task area's right edge
    assert by_name(els, "more").role == "link"  # a leaf with its own cursor: pointer

    # a click at each centre, written as the pointer writes it, acts on that element
    for el, target in ((go, "t-go"), (by_name(els, "more"), "t-more"), (agree, None), (name, "t-name")):
        obs, _, term, trunc, info = env.step(pointer_click(env, obs, el))
        assert "action_error" not in info and not (term or trunc)
        clicks = env.driver.execute_script("return window.tClicks;")
        if target:
            assert clicks[-1] == target, (el, clicks)
    assert env.driver.execute_script("return document.getElementById('t-box').checked;") is False
    assert by_name(obs["elements"], "Agree").states == ()
    assert by_name(obs["elements"], "Your name").states == ("focused",)
    obs, *_ = env.step(Action("type", {"content": "x"}))
    assert by_name(obs["elements"], "Your name").value == "Annx"


@needs_miniwob
def test_a_failing_or_slow_scan_leaves_no_list_and_the_episode_goes_on(env):
    from trainer.rollout.runner import frame_of

    obs, _ = env.reset(seed=1, options={"family": "click-test"})
    assert [e.name for e in obs["elements"]] == ["Click Me!"]
    env.driver.execute_script("document.elementFromPoint = function () { throw new Error('broken page'); };")
    obs, _, term, trunc, _ = env.step(Action("wait", {}))
    assert obs["elements"] is None and not (term or trunc)
    assert obs["elements_source"].startswith("no element list: the page's DOM scan failed") \
        and "broken page" in obs["elements_source"]
    frame = frame_of(obs)
    assert frame.elements is None and frame.elements_source == obs["elements_source"]
    env.driver.execute_script("delete document.elementFromPoint;")  # the prototype's again
    env.driver.execute_script("var own = Element.prototype.checkVisibility; window.tOwn = own;"
                              "Element.prototype.checkVisibility = function (o) {"
                              " var t = performance.now(); while (performance.now() - t < 5) {} return own.call(this, o); };")
    budget, env.elements_budget = env.elements_budget, 0.02
    try:
        obs, *_ = env.step(Action("wait", {}))
        assert obs["elements"] is None and "passed its 20 ms budget" in obs["elements_source"]
    finally:
        env.elements_budget = budget
        env.driver.execute_script("Element.prototype.checkVisibility = window.tOwn;")
    obs, reward, term, _, info = env.step(env.expert_action()[1])  # the task itself still works
    assert reward == 1.0 and term and info["success"] and obs["elements"] == []


def texts(messages) -> str:
    """The text of a chat (its images left out)."""
    return "\n".join(p.get("text", "") for m in messages
                     for p in (m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}]))


def snapped(env, obs, action: Action, lengths: list[int]):
    """The oracle's click moved to the centre of the smallest listed element holding its point."""
    lengths.append(len(obs["elements"]))
    if action.name != "click":
        return action
    x, y = action.args["start_box"][0] * TASK_WIDTH, action.args["start_box"][1] * TASK_HEIGHT
    holding = [e for e in obs["elements"] if e.contains(x, y)]
    assert holding, f"the oracle's click ({x:.1f}, {y:.1f}) lies in no listed element: {obs['elements']}"
    return pointer_click(env, obs, min(holding, key=lambda e: (e.box[2] - e.box[0]) * (e.box[3] - e.box[1])))


def play(env, task: str, seed: int, snap: bool, lengths: list[int]) -> bool:
    obs, _ = env.reset(seed=seed, options={"family": task})
    for _ in range(env.max_steps):
        _, action = env.expert_action()
        obs, _, term, trunc, info = env.step(snapped(env, obs, action, lengths) if snap else action)
        assert "action_error" not in info and "parse_error" not in info, info
        if term or trunc:
            return bool(info["success"])
    return False


@needs_miniwob
def test_the_snapped_oracle_solves_what_the_oracle_solves(env, capsys):
    rows = {}
    for task in SNAP_TASKS:
        lengths: list[int] = []
        plain = [play(env, task, s, False, []) for s in SEEDS]
        snap = [play(env, task, s, True, lengths) for s in SEEDS]
        rows[task] = (sum(lengths) / len(lengths), sum(plain) / len(plain), sum(snap) / len(snap))
    with capsys.disabled():
        print(f"\n{'task':<18} {'mean list':>9} {'oracle':>7} {'snapped':>8}  ({len(SEEDS)} seeds)")
        for task, (n, p, s) in rows.items():
            print(f"{task:<18} {n:>9.1f} {p:>7.0%} {s:>8.0%}")
    assert all(p == 1.0 and s == p for _, p, s in rows.values()), rows


@needs_miniwob
def test_the_list_reaches_the_policy_and_pixels_mode_has_none(env):
    from trainer.rollout.actors import ActorOutput, ExpertActor
    from trainer.rollout.runner import frame_of, run_episode
    from trainer.sandbox.miniwob_env import MiniWoBEnv

    class Recording(ExpertActor):  # the oracle, keeping what it was shown
        def __init__(self, env):
            super().__init__(env)
            self.seen = []

        def generate_batch(self, chats, *, greedy: bool = False, slots=None) -> list[ActorOutput]:
            self.seen += chats
            return super().generate_batch(chats, greedy=greedy, slots=slots)

    obs, _ = env.reset(seed=2, options={"family": "enter-text"})  # the page the episode below starts on
    listed = format_lines(obs["elements"], env.coords_space, TASK_WIDTH, TASK_HEIGHT)
    actor = Recording(env)
    traj = run_episode(actor, env, 2, family="miniwob/enter-text", greedy=True)
    assert traj.success
    assert listed.startswith("Elements:\n[0] text_field") and listed in texts(actor.seen[0])
    now = parse_block(texts(actor.seen[1]))  # the next turn's list: the field the oracle clicked into
    assert now[0].role == "text_field" and "focused" in now[0].states
    assert frame_of(obs).elements_source == "dom"

    pixels = MiniWoBEnv("enter-text", observation="pixels")
    try:
        obs, _ = pixels.reset(seed=2)
        assert set(obs) == {"screenshot", "geometry"} and obs in pixels.observation_space
        frame = frame_of(obs)
        assert frame.elements is None and frame.elements_source is None
        seen = Recording(pixels)
        assert run_episode(seen, pixels, 2, family="miniwob/enter-text", greedy=True).success
        assert seen.seen and all("Elements:" not in texts(m) for m in seen.seen)
    finally:
        pixels.close()
    with pytest.raises(ValueError, match="observation must be one of"):
        MiniWoBEnv("enter-text", observation="dom")


@needs_miniwob
def test_the_random_policy_plays_the_same_with_or_without_lists():
    from trainer.rollout.miniwob_eval import play as play_policy

    def summary(trajs):
        return [(t.family, t.seed, t.success, [(u.action, u.point) for u in t.turns]) for t in trajs]

    kw = {"max_steps": 3, "episode_seconds": 60}
    with_lists = play_policy("random", ["click-test", "click-checkboxes"], 4, env_kw=kw, seed=3)
    without = play_policy("random", ["click-test", "click-checkboxes"], 4, env_kw={**kw, "observation": "pixels"}, seed=3)
    assert summary(with_lists) == summary(without) and len(with_lists) == 4


@needs_miniwob
def test_sandbox_eval_shows_the_default_model_the_list(monkeypatch, capsys):
    from agent.storage.model_files import DEFAULT_MODEL_DIR
    from main import main
    from trainer.rollout.actors import VLMActor

    if not (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
        pytest.skip(f"no default model at {DEFAULT_MODEL_DIR}")
    chats = []
    generate_batch = VLMActor.generate_batch

    def recording(self, batch, **kw):  # the real model's batched generation, keeping its chats
        chats.extend(batch)
        return generate_batch(self, batch, **kw)

    monkeypatch.setattr(VLMActor, "generate_batch", recording)
    assert main(["sandbox", "eval", "--suite", "miniwob", "--tasks", "click-test", "--policy", "default",
                 "--episodes", "1", "--episode-seconds", "120", "--max-new-tokens", "24", "--json"]) == 0
    assert '"suite": "miniwob"' in capsys.readouterr().out
    assert chats
    first = parse_block(texts(chats[0]))  # the current page's list, in the model's coordinate space
    assert [(e.role, e.name) for e in first] == [("button", "Click Me!")]
    assert all(parse_block(texts(c)) for c in chats)
