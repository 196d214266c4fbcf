"""Tandem as installable software: the package in a fresh virtual environment, the desktop bundle,
and model folders that stock transformers classes load."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.factories import make_episode

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "assets" / "default_model"


def _fresh_tree(dest: Path) -> Path:
    """The working tree as a fresh clone holds it: tracked files and untracked ones git does not
    ignore (no build/, dist/, .venv/ or egg-info from earlier builds)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _store_with_episode(path: Path) -> Path:
    from agent.storage.store import Store

    store = Store(path)
    make_episode(store, n_steps=3)
    store.close()
    return path


@pytest.mark.slow
def test_pip_install_in_a_fresh_venv_gives_the_tandem_command(tmp_path):
    src = _fresh_tree(tmp_path / "src")
    venv = tmp_path / "V"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    tandem = venv / "bin" / "tandem"
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}  # nothing from this checkout's Python
    r = subprocess.run([str(tandem), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: tandem"), r.stdout + r.stderr
    for cmd in ("record", "sync", "agent", "train", "flywheel"):
        assert cmd in r.stdout
    data = _store_with_episode(tmp_path / "D")
    r = subprocess.run([str(tandem), "info", "--data", str(data)], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"data location: {data}" in r.stdout and "episodes: 1  steps: 3" in r.stdout
    # the core install leaves the [train] extra out, and the package ships the default model
    py = str(venv / "bin" / "python")
    probe = ("import importlib.util as u, app.agent_run as a, agent.storage.model_files as m; print(u.find_spec('torch') is None, "
             "(m.DEFAULT_MODEL_DIR / 'model.safetensors').is_file(), a.__file__)")
    r = subprocess.run([py, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    no_torch, has_model, where = r.stdout.split()
    assert (no_torch, has_model) == ("True", "True") and where.startswith(str(venv)), r.stdout + r.stderr


def test_extras_come_from_the_tagged_requirement_lines(tmp_path):
    """setup.py splits requirements.txt by its `# [extra]` tags, so the pins stay in one place."""
    src = _fresh_tree(tmp_path / "src")
    r = subprocess.run([sys.executable, "-c", "import runpy, setuptools; captured = {}; "
                        "setuptools.setup = lambda **kw: captured.update(kw); "
                        "import json; runpy.run_path('setup.py'); print(json.dumps(captured))"],
                       cwd=src, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    core, extras = got["install_requires"], got["extras_require"]
    assert "torch==2.13.0" in extras["train"] and not any(req.startswith("torch") for req in core)
    assert "PySide6-Essentials==6.12.0" in core and "uiautomator2==3.7.1" in extras["android"]
    assert "pytest==9.0.3" in extras["test"] and "torch==2.13.0" in extras["test"]
    pinned = [line.split("#")[0].strip() for line in (src / "requirements.txt").read_text().splitlines()]
    assert sorted(filter(None, pinned)) == sorted(core + [r for k, reqs in extras.items() if k != "test" for r in reqs])


# ---------------------------------------------------------------- model folders for stock tools

def test_default_model_loads_with_the_stock_transformers_classes():
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    from agent.vlm.model import load_processor

    for name in ("preprocessor_config.json", "video_preprocessor_config.json"):
        assert (DEFAULT_MODEL / name).is_file(), name
    image_processor = AutoImageProcessor.from_pretrained(DEFAULT_MODEL)
    assert type(image_processor).__name__.startswith("Qwen2VLImageProcessor")
    image = Image.new("RGB", (320, 240), "white")
    out = image_processor(images=[image], return_tensors="pt")
    ours = load_processor(DEFAULT_MODEL).image_processor(images=[image], return_tensors="pt")  # what Tandem trained with
    assert out["image_grid_thw"].tolist() == ours["image_grid_thw"].tolist() == [[1, 18, 24]]
    assert torch.equal(out["pixel_values"], ours["pixel_values"])
    model = AutoModelForImageTextToText.from_pretrained(DEFAULT_MODEL)
    assert model.config.model_type == "qwen2_5_vl"
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_MODEL)
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id


def test_saved_checkpoints_hold_the_stock_processor_configs(tmp_path):
    """What name_stock_processor (run after every save) writes beside processor_config.json."""
    from agent.vlm.model import name_stock_processor

    for name in ("config.json", "processor_config.json"):
        shutil.copy(DEFAULT_MODEL / name, tmp_path / name)
    name_stock_processor(tmp_path)
    image = json.loads((tmp_path / "processor_config.json").read_text())["image_processor"]
    pre = json.loads((tmp_path / "preprocessor_config.json").read_text())
    video = json.loads((tmp_path / "video_preprocessor_config.json").read_text())
    assert pre["processor_class"] == "Qwen2_5_VLProcessor" and pre["size"] == image["size"]
    assert video["video_processor_type"] == "Qwen2VLVideoProcessor"
    for key in ("patch_size", "merge_size", "temporal_patch_size", "size", "image_mean"):
        assert video[key] == image[key], key


def test_default_model_loads_with_the_stock_processor_and_its_video_half():
    try:
        importlib.import_module("torchvision")
    except Exception as e:  # PyPI's torchvision wants a newer torch than the pinned 2.13.0
        pytest.skip(f"the stock video processor needs torchvision, which does not import here: {e}")
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(DEFAULT_MODEL)
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert type(processor.video_processor).__name__ == "Qwen2VLVideoProcessor"


# ---------------------------------------------------------------- the desktop bundle

@pytest.mark.slow
@pytest.mark.desktop
def test_bundle_builds_runs_headless_and_opens_its_window(tmp_path, xdisplay):
    """`bash packaging/build.sh` (the small bundle, no torch), then the program with no Python
    environment around it: --help, info, and the main window for 10 s on the X display."""
    dist = tmp_path / "dist"
    env = {**os.environ, "TANDEM_DIST": str(dist)}
    r = subprocess.run(["bash", str(ROOT / "packaging" / "build.sh")], capture_output=True, text=True, env=env,
                       timeout=1200)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    program = dist / "tandem" / "tandem"
    for name in ("tandem.desktop", "tandem.png", "install-desktop-entry.sh"):
        assert (dist / "tandem" / name).is_file(), name
    assert "Exec=" in (dist / "tandem" / "tandem.desktop").read_text()
    assert not list((dist / "tandem").rglob("libtorch*")), "the annotator's bundle should not carry torch"

    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "DISPLAY": xdisplay, "LANG": "C.UTF-8"}
    r = subprocess.run([str(program), "--help"], capture_output=True, text=True, env=bare, timeout=120)
    assert r.returncode == 0 and "record" in r.stdout, r.stderr
    data = _store_with_episode(tmp_path / "D")
    r = subprocess.run([str(program), "info", "--data", str(data)], capture_output=True, text=True, env=bare,
                       timeout=120)
    assert r.returncode == 0 and "episodes: 1  steps: 3" in r.stdout, r.stdout + r.stderr
    # an endpoint policy needs no torch: the run gets as far as asking the (absent) server
    r = subprocess.run([str(program), "agent", "--data", str(tmp_path / "A"), "--instruction", "x", "--policy",
                        "endpoint", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--max-steps", "1"],
                       capture_output=True, text=True, env={**bare, "XDG_SESSION_TYPE": "x11"}, timeout=120)
    assert "No module named" not in r.stdout + r.stderr and "127.0.0.1:9" in r.stdout + r.stderr, r.stdout + r.stderr

    proc = subprocess.Popen([str(program), "--data", str(tmp_path / "app-data")], env={**bare, "QT_QPA_PLATFORM": "xcb"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(10)
        assert proc.poll() is None, proc.stdout.read()
        windows = subprocess.run(["xdotool", "search", "--onlyvisible", "--name", "^Tandem$"], capture_output=True,
                                 text=True, env={**os.environ, "DISPLAY": xdisplay}, timeout=10).stdout.split()
        assert windows, "no visible Tandem window after 10 s"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    for bad in ("Traceback", "Error", "sync is off", "Could not load the Qt platform plugin"):
        assert bad not in out, out
