"""Browser games in the app (pytest-qt, offscreen): Supervise and Drive run a real GameEnv (headless
Chromium under the fake clock, in the executor's child process); only the model is scripted (a
replay policy). The supervisor approves and edits through the real widgets, the game's own state
says what happened, the game stands still while a proposal waits, and no Chromium outlives the page."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from games_helpers import HAVE_CHROMIUM, needs_chromium
from PySide6.QtCore import QPoint, Qt

from agent import coords
from agent.grammar import format_normalized
from agent.policies import ReplayPolicy
from agent.run.loop import LoopConfig
from agent.schema import Action
from app.drive_view import DrivePage
from app.game_executor import GameProcessExecutor
from app.proposal_panel import frame_pixmap
from app.supervise_view import SupervisePage
from trainer.sandbox.games.browser import chromium_processes, tagged_processes
from trainer.sandbox.games.spec import HEIGHT, WIDTH, key


def text(thought: str, action: Action) -> str:
    return format_normalized(thought, [action], coords.SMART_RESIZE, WIDTH, HEIGHT)


def wait_gone(ids, seconds: float = 15.0) -> list[int]:
    """The game's Chromium processes still alive after up to `seconds` (its group, and any process
    tagged with its profile: the crash handler leaves the group)."""
    pgid, profile = ids

    def left():
        return sorted(set(chromium_processes(pgid)) | set(tagged_processes(profile)))

    end = time.monotonic() + seconds
    while left() and time.monotonic() < end:
        time.sleep(0.1)
    return left()


@pytest.fixture
def page(qtbot, store):
    p = SupervisePage(store, name="alice")
    qtbot.addWidget(p)
    p.resize(1400, 900)
    p.show()
    qtbot.waitExposed(p)
    yield p
    p.shutdown()


def wait_for_proposal(qtbot, page, n: int):
    qtbot.waitUntil(lambda: len(page.displays) >= n and page.panel.pending is not None, timeout=30000)
    return page.panel.pending


def wait_end(qtbot, page):
    qtbot.waitUntil(lambda: page.last_result is not None, timeout=30000)
    return page.store.load_episode(page.last_episode_id)


def cell_point(state: dict, x: int, y: int) -> tuple[float, float]:
    """The normalized point of the centre of lights cell (x, y)."""
    c = state["cell"]
    return (state["ox"] + (x + 0.5) * c) / WIDTH, (state["oy"] + (y + 0.5) * c) / HEIGHT


def pressed(lights: list[list[int]], x: int, y: int) -> list[list[int]]:
    """Lights out's rule: a press toggles the cell and its four neighbours."""
    out = [row[:] for row in lights]
    n = len(out)
    for dx, dy in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
        if 0 <= x + dx < n and 0 <= y + dy < n:
            out[y + dy][x + dx] ^= 1
    return out


@needs_chromium
def test_supervise_a_lights_game_approve_twice_and_edit_once(qtbot, page, store):
    ex = GameProcessExecutor("lights", 3)
    instruction = ex.prepare()
    state = ex.info["state"]
    a, b, proposed, edited = (0, 0), (2, 2), (1, 1), (0, 2)
    want = pressed(pressed(pressed(state["lights"], *a), *b), *edited)
    assert any(any(r) for r in want)  # the level is not solved on the way: the board stays comparable
    policy = ReplayPolicy([text("Press the top-left light.", Action("click", {"start_box": cell_point(state, *a)})),
                           text("Press the bottom-right light.", Action("click", {"start_box": cell_point(state, *b)})),
                           text("Press the middle.", Action("click", {"start_box": cell_point(state, *proposed)})),
                           "Thought: enough for now\nAction: finished()"], platform="sandbox")
    page.start_run(policy, ex, instruction, gate="all", config=LoopConfig(max_steps=6, kind="supervised"))
    ids = None
    for n in (1, 2):
        wait_for_proposal(qtbot, page, n)
        assert f"Lights: score {ex.score:g}" in page.run_label.text()  # the score in the status line
        ids = ids or ex.browser_ids()
        qtbot.keyClick(page.panel, Qt.Key_Return)  # approve
    wait_for_proposal(qtbot, page, 3)
    assert page.run_label.text() == ("Running (you decide here). Lights: score 2 (normalized 1), level 1; step 2 of 100 "
                                     "(the game is paused until you answer)")
    x, y = page.panel.canvas.point_to_widget(cell_point(state, *edited))  # the edit: a click on the screenshot
    qtbot.mouseClick(page.panel.canvas, Qt.LeftButton, pos=QPoint(round(x), round(y)))
    assert page.panel.approve_btn.text().startswith("Approve with edits")
    qtbot.keyClick(page.panel, Qt.Key_Return)
    wait_for_proposal(qtbot, page, 4)
    qtbot.keyClick(page.panel, Qt.Key_Return)  # finished
    ep = wait_end(qtbot, page)

    assert ep.instruction == instruction and instruction.startswith("Play lights out")
    assert [s.provenance.decision for s in ep.steps] == ["approve", "approve", "edit", "approve"]
    # the game's own state: the approved presses and the edited one (not the proposed middle) toggled it
    assert ex.info["state"]["lights"] == want and ex.info["state"]["level"] == 1
    # score: lit at the level's start (4) minus the fewest lit so far (2, after the second press)
    assert [s.info["score"] for s in ep.steps[:3]] == [1, 2, 2]
    assert ep.steps[2].provenance.source == "corrected"
    assert "The game was left running at score 2 (normalized 1)." in page.run_label.text()
    assert page.panel.title.text().endswith("The game was left running at score 2 (normalized 1).")
    assert wait_gone(ids) == []  # the run closed the executor: its Chromium is gone


@needs_chromium
def test_a_waiting_snake_stands_still_and_closing_the_page_reaps_chromium(qtbot, store):
    page = SupervisePage(store, name="alice")
    qtbot.addWidget(page)
    page.resize(1400, 900)
    page.show()
    qtbot.waitExposed(page)
    ex = GameProcessExecutor("snake", 1)
    instruction = ex.prepare()
    head0 = ex.info["state"]["snake"][0]
    policy = ReplayPolicy([text("Go down.", key("down")), text("Go left.", key("left"))], platform="sandbox")
    page.start_run(policy, ex, instruction, gate="all", config=LoopConfig(max_steps=6, kind="supervised"))
    wait_for_proposal(qtbot, page, 1)
    qtbot.keyClick(page.panel, Qt.Key_Return)
    pending = wait_for_proposal(qtbot, page, 2)
    head1 = ex.info["state"]["snake"][0]
    assert head1 == [head0[0], head0[1] + 1]  # one step of 200 ms: one cell, down as approved
    assert "Snake: score 0" in page.run_label.text()

    shown = page.panel.canvas._pixmap.toImage()
    ids = ex.browser_ids()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.0:  # real time passes (the page keeps running); in real time the snake would move 10 cells
        qtbot.wait(100)
    assert page.panel.canvas._pixmap.toImage() == shown
    now = ex.observe()  # a fresh screenshot of the page: the game has not moved either
    assert (now.pixels == pending.request.observation.pixels).all()
    assert frame_pixmap(now)[0].toImage() == shown  # what the supervisor sees is the game as it is
    assert ex.info["state"]["snake"][0] == head1

    assert len(chromium_processes(ids[0])) >= 2  # the watchdog and Chromium, while the run waits
    page.close()  # mid-run: the page stops the run, which closes the game's process
    assert wait_gone(ids) == []
    assert not page.run.running


@needs_chromium
def test_drive_a_game_from_the_form_until_it_is_over(qtbot, store, tmp_path):
    """Drive with a replay file chosen in the form: the snake waits its way into the wall; the game
    ending ends the run, and the page says so with the score."""
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps("Thought: keep going\nAction: wait()") + "\n" for _ in range(30)))
    page = DrivePage(store)
    qtbot.addWidget(page)
    page.show()
    f = page.form
    f.set_choice(f.policy, "replay")
    f.replay_path.setText(str(path))
    f.set_choice(f.executor, "game")
    assert f.seed.isVisible() and f.game.isVisible() and not f.family.isVisible()
    titles = [f.game.itemText(i) for i in range(f.game.count())]
    assert "Snake" in titles and "Lights" in titles
    f.set_choice(f.game, "snake")
    f.seed.setValue(1)
    f.set_choice(f.gate, "auto")
    results = []
    page.run_finished.connect(results.append)
    qtbot.mouseClick(page.start_btn, Qt.LeftButton)
    try:
        qtbot.waitUntil(lambda: bool(results), timeout=60000)
    finally:
        page.shutdown()
    result = results[0]
    ep = store.load_episode(result.episode.id)
    assert ep.instruction.startswith("Play Snake")
    assert result.steps == 12 and ep.steps[-1].terminated and ep.steps[-1].info["state"]["over"] is True
    assert "Game over: score 0 (normalized 0)." in page.status.text()
    # the score is the stored episode's outcome (scored, not passed), in words in its meta
    assert (ep.outcome.success, ep.outcome.reward, ep.outcome.source) == (None, 0.0, "game")
    assert ep.meta["outcome_text"] == "Game over: score 0 (normalized 0)."
    assert store.get_setting("drive.game") == "snake" and store.get_setting("drive.executor") == "game"


@needs_chromium
def test_an_app_killed_mid_game_leaves_no_chromium():
    """SIGKILL of the app's process: the game's process reads end-of-file and ends, and the
    browser's watchdog kills Chromium."""
    code = ("from app.game_executor import GameProcessExecutor\n"
            "ex = GameProcessExecutor('snake', 1); ex.prepare(); pgid, profile = ex.browser_ids()\n"
            "print(pgid, profile, flush=True)\nimport time; time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1], env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        pgid, profile = proc.stdout.readline().split()
        ids = (int(pgid), profile)
        assert len(chromium_processes(ids[0])) >= 2
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert wait_gone(ids) == []


def test_without_chromium_the_form_says_so_and_nothing_starts(qtbot, page, monkeypatch):
    monkeypatch.setenv("TANDEM_CHROMIUM", "/nonexistent/chromium")
    form_page = SupervisePage(page.store, name="bob")
    qtbot.addWidget(form_page)
    f = form_page.form
    f.set_choice(f.policy, "replay")
    f.set_choice(f.executor, "game")
    assert not f.warning.isHidden()
    assert f.warning.text() == ("The games need Chromium: TANDEM_CHROMIUM='/nonexistent/chromium' is not an "
                                "executable file.")
    form_page.start_from_form()
    assert form_page.run is None
    assert form_page.run_label.text() == "Cannot start: " + f.warning.text()
    f.set_choice(f.executor, "sandbox")
    assert f.warning.isHidden()  # said for the games only
    if HAVE_CHROMIUM:  # Chromium is there again (installed meanwhile): the form checks anew
        monkeypatch.delenv("TANDEM_CHROMIUM")
        f.set_choice(f.executor, "game")
        assert f.warning.isHidden()


def test_a_run_on_a_game_gets_the_games_step_budget_not_the_pages_default():
    from app.game_executor import run_steps

    assert run_steps(GameProcessExecutor("snake"), 30) == 100  # nothing starts before prepare()
    assert run_steps(GameProcessExecutor("snake", max_steps=20), 30) == 30
    assert run_steps(object(), 50) == 50


def test_an_unknown_game_is_named():
    from app.agent_run import RunSetupError, make_executor

    with pytest.raises(RunSetupError, match="unknown game 'chess'; known games: merge, snake"):
        make_executor("game", game="chess")
