"""The core CLI as scripts use it: parse, export, import, info, check — as real subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from factories import make_episode

from agent.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]


def run(*args, stdin="", data=None):
    env = dict(os.environ)
    if data:
        env["TANDEM_DATA"] = str(data)
    return subprocess.run([sys.executable, str(ROOT / "main.py"), *args], input=stdin, capture_output=True, text=True, env=env, timeout=120)


def test_help_lists_subcommands():
    r = run("--help")
    assert r.returncode == 0
    for cmd in ("parse", "import", "export", "info", "check"):
        assert cmd in r.stdout


def test_parse_prints_screen_points_in_order():
    text = "Thought: drag it\nAction: drag(start_box='(0,0)', end_box='(1932,1092)')"
    r = run("parse", "--width", "1920", "--height", "1080", stdin=text)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["thought"] == "drag it"
    assert out["actions"][0]["action"] == "drag"
    assert out["actions"][0]["screen_points"] == [[0, 0], [1919, 1079]]


def test_parse_relative_with_scale():
    r = run("parse", "--width", "2880", "--height", "1800", "--coords", "relative1000", "--scale", "2", stdin="Action: click(start_box='(500,500)')")
    assert json.loads(r.stdout)["actions"][0]["screen_points"] == [[720, 450]]


def test_parse_error_exit_2():
    r = run("parse", "--width", "100", "--height", "100", stdin="Action: click(start_box='(1,")
    assert r.returncode == 2
    assert "unterminated quote" in json.loads(r.stdout)["error"]


def test_export_import_info_check(tmp_path):
    src = Store(tmp_path / "src")
    eps = [make_episode(src, 3), make_episode(src, 2)]
    src.close()
    out = tmp_path / "out" / "train.jsonl"
    r = run("export", "--out", str(out), "--data", str(tmp_path / "src"))
    assert r.returncode == 0, r.stderr
    samples = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(samples) == 5
    last = [s for s in samples if s["episode_id"] == eps[0].id and s["step"] == 2][0]
    # system, then image/assistant pairs, ending with the target
    assert last["messages"][0]["role"] == "system" and "## Action Space" in last["messages"][0]["content"]
    assert [m["role"] for m in last["messages"][1:]] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert last["messages"][-1]["content"].startswith("Thought: Scroll down")
    assert "scroll(start_box='(" in last["messages"][-1]["content"]
    assert len(last["images"]) == 3 and all((out.parent / p).is_file() for p in last["images"])
    first = [s for s in samples if s["episode_id"] == eps[0].id and s["step"] == 0][0]
    # click at (70, 40) of a 320x200 screenshot, in its 364x224 smart-resize image
    assert "click(start_box='(80,45)')" in first["messages"][-1]["content"]

    bundle = tmp_path / "eps.zip"
    assert run("export", "--out", str(bundle), "--data", str(tmp_path / "src")).returncode == 0
    r = run("import", str(bundle), data=tmp_path / "dst")
    assert r.returncode == 0, r.stderr
    assert "imported 2 episode(s)" in r.stdout
    info = json.loads(run("info", "--json", data=tmp_path / "dst").stdout)
    assert info["episodes"] == 2 and info["steps"] == 5
    assert run("check", data=tmp_path / "dst").returncode == 0

    # importing again replaces, never duplicates
    assert "2 replaced" in run("import", str(bundle), data=tmp_path / "dst").stdout
    assert json.loads(run("info", "--json", data=tmp_path / "dst").stdout)["episodes"] == 2


def test_import_refuses_a_tampered_bundle_and_changes_nothing(tmp_path):
    src = Store(tmp_path / "src")
    make_episode(src, 2)
    src.close()
    bundle = tmp_path / "eps.zip"
    run("export", "--out", str(bundle), "--data", str(tmp_path / "src"))
    tampered = tmp_path / "tampered.zip"
    with zipfile.ZipFile(bundle) as zin, zipfile.ZipFile(tampered, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            zout.writestr(info, b"evil" if info.filename.startswith("blobs/") else data)
    r = run("import", str(tampered), data=tmp_path / "dst")
    assert r.returncode == 2 and "does not match its content hash" in r.stderr
    truncated = tmp_path / "trunc.zip"
    truncated.write_bytes(bundle.read_bytes()[: len(bundle.read_bytes()) // 2])
    r = run("import", str(truncated), data=tmp_path / "dst")
    assert r.returncode == 2 and "import failed" in r.stderr
    assert json.loads(run("info", "--json", data=tmp_path / "dst").stdout)["episodes"] == 0


def test_import_episode_json_with_image_files(tmp_path):
    from factories import screenshot_png

    (tmp_path / "shot.png").write_bytes(screenshot_png())
    doc = {
        "id": "11111111-2222-3333-4444-555555555555", "kind": "recording", "instruction": "from another tool",
        "schema_version": 1,
        "steps": [{
            "index": 0, "thought": "click it",
            "observation": {"screenshot": "shot.png", "width": 320, "height": 200,
                            "geometry": {"logical_width": 320, "logical_height": 200, "physical_width": 320, "physical_height": 200}},
            "action": {"name": "click", "args": {"start_box": [0.5, 0.5]}},
        }],
    }
    (tmp_path / "ep.json").write_text(json.dumps(doc))
    r = run("import", str(tmp_path / "ep.json"), data=tmp_path / "dst")
    assert r.returncode == 0, r.stderr
    st = Store(tmp_path / "dst")
    ep = st.load_episode(doc["id"])
    assert st.get_blob(ep.steps[0].observation.screenshot) == (tmp_path / "shot.png").read_bytes()


@pytest.mark.parametrize("scale", ["nan", "inf", "0"])
def test_parse_refuses_a_scale_that_is_not_a_positive_finite_number(scale):
    r = run("parse", "--width", "100", "--height", "100", "--scale", scale, stdin="Action: click(start_box='(5,5)')")
    assert r.returncode == 2
    error = json.loads(r.stdout)["error"]
    assert "--scale must be positive finite numbers" in error and error.endswith(f"{float(scale)})")


def test_a_mistyped_data_folder_is_said_and_not_created(tmp_path):
    typo = tmp_path / "tandem-dta"
    r = run("info", "--data", str(typo))
    assert r.returncode == 0 and "holds no Tandem data" in r.stderr and "empty" in r.stdout
    r = run("info", "--json", "--data", str(typo))
    assert json.loads(r.stdout)["exists"] is False
    for cmd in (("check",), ("export", "--out", str(tmp_path / "x.zip"))):
        r = run(*cmd, "--data", str(typo))
        assert r.returncode == 2 and "holds no Tandem data" in r.stderr
    assert not typo.exists()


def test_record_refuses_a_bad_rate_before_creating_a_store(tmp_path):
    data = tmp_path / "new"
    r = run("record", "--instruction", "x", "--fps", "100", "--data", str(data))
    assert r.returncode != 0 and "fps must be in (0, 60], got 100.0" in r.stderr
    assert not data.exists()
