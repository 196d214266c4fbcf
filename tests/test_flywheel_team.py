"""The flywheel for a team, as its users run it, every part a real process on one machine with
three data folders: a backend serving B; an annotator's store A that generates, submits and syncs
demonstrations; `flywheel run --data B` trains on what A uploaded, evaluates both models on fresh
held-out seeds and registers the candidate with its interval; `models pull --data C` brings the
current model to a third store with the same hash."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tandem(*args, timeout=600) -> subprocess.CompletedProcess:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "TANDEM_BACKEND_URL": "", "TANDEM_BACKEND_TOKEN": ""}
    p = subprocess.run([sys.executable, str(ROOT / "main.py"), *args], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT)
    assert p.returncode == 0, f"{args}: {p.stdout[-1500:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture
def backend(tmp_path):
    b = tmp_path / "B"
    ann = tandem("backend", "user", "add", "ann", "--role", "annotator", "--data", str(b)).stdout.split()[0]
    sup = tandem("backend", "user", "add", "sup", "--role", "supervisor", "--data", str(b)).stdout.split()[0]
    proc = subprocess.Popen([sys.executable, str(ROOT / "main.py"), "backend", "--data", str(b), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on ws://"), line
        yield b, line.split()[2], ann, sup
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_backends_flywheel_trains_on_uploads_and_ships_its_model(backend, tmp_path):
    b, url, ann, sup = backend
    a, c = tmp_path / "A", tmp_path / "C"
    tandem("sandbox", "generate", "--episodes", "12", "--data", str(a))
    tandem("submit", "--all", "--data", str(a))
    assert "12 acknowledged, 0 failed" in tandem("sync", "--data", str(a), "--server", url, "--token", ann).stdout
    from agent.storage.store import Store

    with Store(a) as store:
        uploaded = {e.id for e in store.list_episodes()}

    run = tandem("flywheel", "run", "--iterations", "1", "--data", str(b), "--eval-episodes", "12", "--rollouts", "0",
                 "--families", "click_button,radio,list_pick,check_boxes,dropdown,tabs",  # 2 held-out episodes each
                 "--ct-steps", "0", "--sft-steps", "2", "--ppo-updates", "0", "--miniwob-episodes", "0")
    line = json.loads(run.stdout.splitlines()[0])
    assert line["routed"]["sft"] == 12  # A's demonstrations, routed on the backend

    status = json.loads(tandem("flywheel", "status", "--data", str(b), "--json").stdout)
    versions = {v["id"]: v for v in status["versions"]}
    assert set(versions) == {"v0000", "v0001"} and status["store"] == str(b)
    cand = versions["v0001"]
    assert set(cand["lineage"]["pools"]["sft"]) == uploaded  # trained on what A uploaded
    for v in versions.values():  # both measured on the same 12 fresh held-out episodes, with intervals
        assert v["eval"]["episodes"] == 12 and 0 <= v["eval"]["ci95"][0] <= v["eval"]["success"] <= v["eval"]["ci95"][1]
        assert v["eval"]["seed_start"] == versions["v0000"]["eval"]["seed_start"]
    assert cand["comparison"]["episodes"] == 12 and cand["promoted"] is (cand["status"] == "current")
    assert cand["decision"].startswith("promoted over v0000" if cand["promoted"] else "not promoted, v0000 stays")
    assert versions["v0000"]["promoted"] and versions["v0000"]["decision"] == "first model: nothing to compare with"

    pulled = json.loads(tandem("models", "pull", "--data", str(c), "--server", url, "--token", sup, "--json").stdout)
    assert pulled["version"] == status["current"]
    here = {m["version"]: m for m in json.loads(tandem("models", "list", "--data", str(c), "--json").stdout)}
    there = {m["version"]: m for m in json.loads(tandem("models", "list", "--data", str(b), "--json").stdout)}
    assert here[status["current"]]["hash"] == there[status["current"]]["hash"] == pulled["hash"]
    assert here[status["current"]]["source"] == f"pulled from {url}"
