"""A model version the flywheel announces through a real backend on loopback reaches a
connected client; with only the backend's data directory, a client hears it when it connects."""
from __future__ import annotations

import asyncio

import pytest

from tests.vlm_fixtures import tiny_vlm_dir  # noqa: F401 - fixture
from trainer.flywheel import FlywheelError
from trainer.flywheel.announce import announce, backend_target


@pytest.fixture
def backend(tmp_path):
    from trainer.backend.server_thread import start_in_thread

    bt = start_in_thread(tmp_path / "backend")
    admin = bt.store.add_user("operator", "admin")
    user = bt.store.add_user("ann", "annotator")
    yield bt, admin, user
    bt.stop()


def test_announced_version_reaches_a_connected_client(backend):
    from agent import protocol as P
    from agent.sync.session import Session

    bt, admin, user = backend
    info = {"path": "/models/v0003", "iteration": 3, "mean_success": 0.42}

    async def scenario():
        client = await Session.open(bt.url, user)
        try:
            done = await asyncio.to_thread(announce, "v0003", info, target={"url": bt.url, "token": admin})
            ev = await client.next_event(10)
        finally:
            await client.close()
        return done, ev

    done, ev = asyncio.run(scenario())
    assert done == f"announced v0003 to the backend at {bt.url}"
    # clients hear the version and how it did, not where the backend keeps it
    assert isinstance(ev, P.ModelVersion) and (ev.version, ev.info) == ("v0003", {"iteration": 3, "mean_success": 0.42})
    assert bt.store.latest_model() == ("v0003", info)


def test_only_an_admin_may_announce_and_a_dead_backend_is_reported(backend):
    bt, admin, user = backend
    with pytest.raises(FlywheelError, match="refused the announcement of v1"):
        announce("v1", {}, target={"url": bt.url, "token": user})
    with pytest.raises(FlywheelError, match="cannot announce v1 to ws://127.0.0.1:9"):
        announce("v1", {}, target={"url": "ws://127.0.0.1:9", "token": admin})
    with pytest.raises(FlywheelError, match="needs an admin token"):
        announce("v1", {}, target={"url": bt.url, "token": None})


def test_recorded_in_the_backend_store_when_it_is_not_running(tmp_path):
    from trainer.backend.store import BackendStore

    d = tmp_path / "backend"
    assert "recorded v0002" in announce("v0002", {"mean_success": 0.5}, target={"data": str(d)})
    bs = BackendStore(d)
    try:
        assert bs.latest_model() == ("v0002", {"mean_success": 0.5})
    finally:
        bs.close()
    assert announce("v0002", {}, target={}) == "no backend configured: not announced"


def test_target_comes_from_settings_then_environment(store, monkeypatch):
    monkeypatch.setenv("TANDEM_BACKEND_URL", "ws://env:1")
    monkeypatch.setenv("TANDEM_BACKEND_TOKEN", "envtok")
    assert backend_target(store) == {"url": "ws://env:1", "token": "envtok", "data": None}
    store.set_setting("flywheel.backend_url", "ws://set:2")
    assert backend_target(store)["url"] == "ws://set:2"
    assert backend_target(store, url="ws://arg:3")["url"] == "ws://arg:3"
    # the environment's token never goes to the settings' server
    assert backend_target(store)["token"] is None
    store.set_setting("flywheel.backend_token", "settok")
    assert backend_target(store) == {"url": "ws://set:2", "token": "settok", "data": None}


def test_an_iteration_that_promotes_announces_to_connected_apps(backend, store, tiny_vlm_dir):  # noqa: F811
    """run_iteration end to end: the random tiny model is current (evaluated for real), SFT on
    expert demonstrations makes a better candidate, and connected clients hear of it."""
    import torch

    from agent import protocol as P
    from agent.sync.session import Session
    from trainer.flywheel.iteration import FlywheelConfig, run_iteration
    from trainer.flywheel.registry import Registry
    from trainer.rollout.runner import demonstrate, plan, trajectory_to_episode

    torch.set_num_threads(1)
    bt, admin, user = backend
    for traj in demonstrate(plan(6, families=["click_button"]), env_kw={"width": 224, "height": 168}):
        trajectory_to_episode(traj, store, producer="expert")
    # min_gain -1: any evaluated candidate is promoted; this test is about the announcement
    cfg = FlywheelConfig.from_dict({"width": 224, "height": 168, "max_steps": 2, "families": ["click_button"],
                                    "eval_episodes": 2, "rollouts": 0, "ct": {"max_steps": 0},
                                    "sft": {"max_steps": 40, "lr": 3e-3, "batch_size": 4}, "ppo": {"updates": 0},
                                    "max_new_tokens": 32, "min_gain": -1.0})
    reg = Registry(store)
    v0 = reg.register(tiny_vlm_dir)
    reg.make_first(v0.version, "first model")

    # The sandbox's Qt widgets live on this (the main) thread, so the iteration runs here and the
    # connected app listens on a thread of its own.
    import threading

    ready, heard = threading.Event(), []

    async def app_listens():
        client = await Session.open(bt.url, user)
        ready.set()
        try:
            heard.append(await client.next_event(240))
        finally:
            await client.close()

    listener = threading.Thread(target=lambda: asyncio.run(app_listens()), daemon=True)
    listener.start()
    assert ready.wait(30)
    rep = run_iteration(store, cfg, announce_target={"url": bt.url, "token": admin})
    listener.join(30)
    ev = heard[0] if heard else None

    assert rep["promoted"], rep["decision"]
    assert rep["announce"] == f"announced {rep['candidate']} to the backend at {bt.url}"
    assert isinstance(ev, P.ModelVersion) and ev.version == rep["candidate"] == reg.current().version
    assert ev.info["parent"] == v0.version and "path" not in ev.info  # the backend's folder stays there
    assert bt.store.latest_model()[1]["path"].endswith(rep["candidate"])
    assert ev.info["families"]["click_button"] == rep["metrics"]["families"]["click_button"]["success"]
