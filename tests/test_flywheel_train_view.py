"""The Train page with pytest-qt on a real store: a registry, routed pools and a metrics file
are shown; the button runs a real (tiny-budget) iteration as a child process with progress."""
from __future__ import annotations

import json

import pytest

from tests.factories import make_episode


@pytest.fixture
def flywheel_store(store):
    from agent.schema import Outcome
    from trainer.flywheel.registry import Registry
    from trainer.flywheel.routing import Router
    from trainer.stats import rate

    reg = Registry(store)

    def metrics(click, radio):  # an evaluation on the same 10 seeds per family, success on the first ones
        outcomes = [[f, s, s < n] for f, n in (("click_button", click), ("radio", radio)) for s in range(10)]
        fams = {"click_button": {"success": click / 10}, "radio": {"success": radio / 10}}
        return {"mean_success": (click + radio) / 20, "families": fams, "eval_signature": "s", "outcomes": outcomes,
                "overall": rate([ok for _, _, ok in outcomes])}

    v0 = reg.register(store.root / "m0", metrics=metrics(2, 0))
    reg.make_first(v0.version, "first model: nothing to compare with")
    v1 = reg.register(store.root / "m1", parent=v0.version, iteration=1, metrics=metrics(9, 6))
    assert reg.decide(v1.version)[0]
    marked = make_episode(store, 2)
    marked.outcome = Outcome(True, 1.0, "annotator")  # unjudged episodes are not SFT data
    store.save_episode(marked)
    failed = make_episode(store, 2, kind="rollout")
    failed.outcome = Outcome(False, 0.0, "verifier")
    store.save_episode(failed)
    Router(store).route(iteration=1)
    d = store.root / "flywheel"
    d.mkdir(exist_ok=True)
    rows = [{"step": k, "phase": "ppo", "reward": 0.1 * k, "entropy": 1.0 - 0.1 * k, "success_rate": 0.2 * k}
            for k in range(4)] + [{"step": 0, "phase": "sft", "loss": 3.0}, {"step": 1, "phase": "sft", "loss": 2.0}]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    return store


def test_train_page_shows_pools_versions_and_curves(qtbot, flywheel_store):
    from app.train_view import TrainPage

    page = TrainPage(flywheel_store)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.status is not None, timeout=60_000)
    assert "SFT 1 · CT 1 · rejected 0" in page.summary.text() and "current model: v0001" in page.summary.text()
    headers = [page.table.horizontalHeaderItem(c).text() for c in range(page.table.columnCount())]
    assert headers[:6] == ["version", "iteration", "status", "parent", "held-out success", "gain vs parent"]
    assert {"click_button", "radio"} <= set(headers) and headers[-1] == "decision"
    assert page.table.rowCount() == 2
    assert page.table.item(1, 2).text() == "current ★" and page.table.item(0, 2).text() == "retired"
    assert page.table.item(1, headers.index("click_button")).text() == "90%"
    # the evidence: the rate with its interval and episodes, the paired gain over the parent, and why
    assert page.table.item(1, 4).text() == "75% [53%, 89%] n=20"
    assert page.table.item(1, 5).text().startswith("+65.0 [+") and page.table.item(0, 5).text() == "–"
    assert page.table.item(1, headers.index("decision")).text().startswith("promoted over v0000: held-out success 75.0%")
    assert page.table.item(0, headers.index("decision")).text() == "first model: nothing to compare with"
    # the routing tab: each episode with its route and the rule that decided it
    assert page.tabs.tabText(1) == "Routing (iteration 1)" and page.routing.rowCount() == 2
    why = {page.routing.item(r, 1).text(): page.routing.item(r, 2).text() for r in range(2)}
    assert why == {"sft": "judged successful by annotator, every check passed", "ct": "judged failed by verifier"}
    # the curves: reward, entropy, success rate from PPO rows, the SFT loss; the bad line skipped
    curves = page.curve_fig.axes
    assert [len(ax.lines[0].get_xdata()) for ax in curves] == [4, 4, 4, 2]
    assert list(curves[2].lines[0].get_ydata()) == pytest.approx([0, 0.2, 0.4, 0.6])
    bars = page.pool_fig.axes[0].patches
    assert sorted(b.get_height() for b in bars) == [0, 1, 1]


def test_run_iteration_button_runs_a_real_iteration_with_progress(qtbot, store):
    from trainer.rollout.runner import demonstrate, plan, trajectory_to_episode

    for traj in demonstrate(plan(2, families=["click_button"]), env_kw={"width": 224, "height": 168}):
        trajectory_to_episode(traj, store, producer="expert")
    store.set_setting("flywheel.config", {"families": ["click_button"], "width": 224, "height": 168, "max_steps": 1,
                                          "eval_episodes": 1, "rollouts": 1, "ct_steps": 1, "sft_steps": 2, "batch": 2,
                                          "ppo_updates": 0, "max_new_tokens": 8})
    from app.train_view import TrainPage

    page = TrainPage(store)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.status is not None, timeout=60_000)
    assert page.table.rowCount() == 0 and "none yet" in page.summary.text()
    assert "random weights" in page.summary.text()  # 224x168: the shipped 320x240 model does not fit
    seen, said = [], set()
    page.progress.valueChanged.connect(seen.append)
    real = page._on_progress

    def on_progress(done, total, text=""):  # what the page says after each progress line
        real(done, total, text)
        said.add(page.message.text().rsplit(" · ", 1)[0])  # less the time elapsed

    page._on_progress = on_progress
    qtbot.mouseClick(page.run_btn, __import__("PySide6.QtCore", fromlist=["Qt"]).Qt.LeftButton)
    assert not page.run_btn.isEnabled() and page.stop_btn.isEnabled()
    qtbot.waitUntil(lambda: page.running is None, timeout=300_000)
    assert page.message.text().startswith("Iteration 1 finished in"), page.message.text()
    assert "v0001" in page.message.text() and "key (" not in page.message.text()
    # every stage was named while it ran, with its own count
    assert any(t.startswith("Stage 1 of 8: preparing the model") for t in said), said
    assert any(t.startswith("Stage 2 of 8: playing on-policy episodes") for t in said), said
    assert any(t.startswith("Stage 3 of 8: scoring and routing new episodes (") for t in said), said
    assert any(t.startswith("Stage 5 of 8: fine-tuning on the SFT pool (step 2/2 · loss ") for t in said), sorted(said)
    assert any(t.startswith("Stage 8 of 8: evaluating both models on fresh held-out tasks") for t in said), said
    assert seen and seen[-1] == 100 and len(set(seen)) > 3  # it moved through the stages
    qtbot.waitUntil(lambda: page.table.rowCount() == 2, timeout=60_000)  # v0000 (base) and v0001
    assert page.run_btn.isEnabled()
    assert "SFT 2" in page.summary.text()


def test_live_numbers_show_on_the_page_while_the_iteration_runs(qtbot, store, tmp_path):
    """The issue's minor item: an iteration ran for minutes with only a stage line. Each stage's
    count and latest numbers now show as they arrive: SFT's step and loss, PPO's reward, entropy
    and success, evaluation's episodes; the curves follow the training stages' rows."""
    import re

    from PySide6.QtCore import Qt

    from trainer.rollout.runner import demonstrate, plan, trajectory_to_episode

    for traj in demonstrate(plan(2, families=["click_button"]), env_kw={"width": 224, "height": 168}):
        trajectory_to_episode(traj, store, producer="expert")
    store.set_setting("flywheel.config", {"families": ["click_button"], "width": 224, "height": 168, "max_steps": 1,
                                          "eval_episodes": 1, "rollouts": 0, "ct_steps": 0, "sft_steps": 12, "batch": 2,
                                          "ppo_updates": 1, "ppo_batch": 2, "max_new_tokens": 8, "miniwob_episodes": 0})
    from app.train_view import TrainPage

    page = TrainPage(store)
    qtbot.addWidget(page)
    page.resize(1100, 720)
    page.show()
    qtbot.waitUntil(lambda: page.status is not None, timeout=60_000)
    said = []
    real = page._on_progress

    def on_progress(done, total, text=""):
        real(done, total, text)
        said.append(page.message.text().rsplit(" · ", 1)[0])  # less the time elapsed

    page._on_progress = on_progress
    qtbot.mouseClick(page.run_btn, Qt.LeftButton)
    sft = re.compile(r"Stage 5 of 8: fine-tuning on the SFT pool \(step (\d+)/12 · loss \d+\.\d{3}\) · \d+:\d\d elapsed$")
    qtbot.waitUntil(lambda: sft.search(page.message.text()) is not None, timeout=300_000)
    assert page.running is not None  # seen while it ran, not in a report afterwards
    page.grab().save(str(tmp_path / "train_page_sft.png"))
    # PPO's critic warm-up, then its update: reward, entropy, success, on the page while PPO runs
    qtbot.waitUntil(lambda: "Stage 7 of 8: PPO on sandbox tasks (critic warm-up done · reward "
                    in page.message.text(), timeout=300_000)
    assert page.running is not None
    curves = page.curve_fig.axes  # redrawn as PPO began: the SFT loss of all 12 steps of this run
    assert len(curves[3].lines[0].get_xdata()) == 12 and len(curves[0].lines[0].get_xdata()) == 0
    page.grab().save(str(tmp_path / "train_page_ppo.png"))
    qtbot.waitUntil(lambda: page.running is None, timeout=300_000)
    assert page.message.text().startswith("Iteration 1 finished in"), page.message.text()
    steps = [int(m.group(1)) for t in said for m in [re.search(r"SFT pool \(step (\d+)/12 · loss", t)] if m]
    assert steps == list(range(1, 13)), said  # every step, in order, each with its loss
    ppo = [t for t in said if t.startswith("Stage 7 of 8: PPO on sandbox tasks (update 1/1 · reward ")]
    assert ppo and re.search(r"· entropy \d+\.\d\d · success \d+%\)$", ppo[0]), said
    assert any(re.match(r"Stage 8 of 8: evaluating both models on fresh held-out tasks \(episode 1/2\)$", t)
               for t in said), said
    qtbot.waitUntil(lambda: len(page.curve_fig.axes[0].lines[0].get_xdata()) == 1, timeout=60_000)  # PPO's update, once read
    curves = page.curve_fig.axes
    assert len(curves[3].lines[0].get_xdata()) == 12


def _routed_sft(store, n: int, unscored: int = 0):
    from agent.schema import Outcome
    from trainer.flywheel.routing import Router

    for _ in range(n + unscored):
        ep = make_episode(store, 2)
        ep.outcome = Outcome(True, 1.0, "annotator")
        store.save_episode(ep)
        if _ < n:
            Router(store).route(iteration=1, episode_ids=[ep.id])


def test_the_page_warns_before_a_run_when_the_sft_data_is_too_small(qtbot, store, tmp_path):
    """One SFT episode: the SFT stage (100 steps x 8 samples) would see its steps hundreds of
    times. The page says so before the run, and the run stays allowed."""
    from app.train_view import TrainPage

    _routed_sft(store, 1)
    page = TrainPage(store)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.status is not None, timeout=60_000)
    assert not page.warning.isHidden()
    assert page.warning.text() == ("Only 1 SFT episode: the model will memorize it rather than learn; record or import "
                                   "more (the SFT stage would show each of its 2 steps about 400 times; at least 8 "
                                   "episodes, one batch, are needed).")
    assert page.run_btn.isEnabled()  # advice, not a stop
    page.resize(1100, 720)
    page.grab().save(str(tmp_path / "train_page_warning.png"))
    # unscored episodes may still go to SFT: counted as at most
    _routed_sft(store, 0, unscored=2)
    page.status = None
    page.refresh()
    qtbot.waitUntil(lambda: page.status is not None, timeout=60_000)
    assert page.warning.text().startswith("At most 3 SFT episodes (1 in the SFT pool, 2 not yet scored): the model "
                                          "will memorize them rather than learn;"), page.warning.text()


def test_the_page_does_not_warn_when_the_sft_data_is_adequate(qtbot, store):
    from app.train_view import TrainPage

    _routed_sft(store, 8)
    page = TrainPage(store)
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.status is not None, timeout=60_000)
    assert page.status["pools"]["sft"] == 8
    assert page.warning.isHidden() and page.warning.text() == ""


def test_the_library_shows_the_route_the_train_page_iteration_chose(qtbot, store):
    """The issue's item 3: after a Train-page iteration routed every episode (in the embedded
    backend's store, which the flywheel trains on), the Library's Route column still said
    "unscored": it read the app's own copy. The flywheel's store is the one owner of routes."""
    from PySide6.QtCore import Qt

    from app.main_window import MainWindow
    from trainer.backend.store import BackendStore
    from trainer.rollout.runner import demonstrate, plan, trajectory_to_episode

    ids = [trajectory_to_episode(t, store, producer="expert").id
           for t in demonstrate(plan(2, families=["click_button"]), env_kw={"width": 224, "height": 168})]
    unjudged = make_episode(store, 2, instruction="Nobody judged this one").id
    win = MainWindow(store)
    qtbot.addWidget(win)
    win.show()
    win.start_sync()  # no server configured: the embedded backend, which the Train page trains on
    try:
        backend = BackendStore(store.root / "backend").store
        win.sync.submit(ids + [unjudged])
        qtbot.waitUntil(lambda: all(backend.has_episode(i) for i in ids + [unjudged]), timeout=60_000)
        backend.set_setting("flywheel.config", {"families": ["click_button"], "width": 224, "height": 168,
                                                "max_steps": 1, "eval_episodes": 1, "rollouts": 1, "ct_steps": 1,
                                                "sft_steps": 2, "batch": 2, "ppo_updates": 0, "max_new_tokens": 8})
        library = win.page("Library")
        column = {i: library.model.item(r, 5).text() for r in range(library.model.rowCount())
                  for i in [library.model.item(r, 0).data(Qt.UserRole + 1)]}
        assert column[unjudged] == "unscored" and {column[i] for i in ids} == {"unscored"}

        train = win.page("Train")
        assert train.data_dir == store.root / "backend"
        qtbot.waitUntil(lambda: train.status is not None, timeout=60_000)
        qtbot.mouseClick(train.run_btn, Qt.LeftButton)
        qtbot.waitUntil(lambda: train.running is None, timeout=300_000)
        assert train.message.text().startswith("Iteration 1 finished in"), train.message.text()
        qtbot.waitUntil(lambda: train.routing.rowCount() >= 3, timeout=60_000)
        chosen = {train.routing.item(r, 0).text(): train.routing.item(r, 1).text()
                  for r in range(train.routing.rowCount())}
        assert chosen["Nobody judged this one"] == "ct"

        win.show_page_at([n for n, _ in win.pages_spec].index("Library"))  # it follows the flywheel's store
        routes = {i: backend.judgement(i).route for i in ids + [unjudged]}
        assert routes[unjudged] == "ct" and {routes[i] for i in ids} == {"sft"}

        def shown():
            return {library.model.item(r, 0).data(Qt.UserRole + 1): library.model.item(r, 5).text()
                    for r in range(library.model.rowCount())}

        qtbot.waitUntil(lambda: shown() == routes, timeout=10_000)  # within a poll of the store
        r = library._row_of(unjudged)
        why = library.proxy.index(r, 5).data(Qt.ToolTipRole)
        assert why.startswith("Iteration 1: ct") and "outcome unknown" in why
        library.select_episode(ids[0])
        assert "route sft" in library.viewer.meta.text()
        assert {store.judgement(i).route for i in ids} == {"unscored"}  # no second copy of the route
        assert library.model.item(library._row_of(ids[0]), 4).text() == "success"  # the verifier's judgement
    finally:
        win.close()  # nothing was edited: it closes without asking, and stops the embedded backend
