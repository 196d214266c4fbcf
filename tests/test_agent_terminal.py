"""The terminal and files executor: real subprocesses and files in tmp_path."""
from __future__ import annotations

import os
import time

import pytest

from agent.executors.base import ExecutionError
from agent.executors.terminal import PathOutsideRoot, TerminalExecutor
from agent.schema import Action


@pytest.fixture
def term(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    t = TerminalExecutor(root, timeout=2.0, output_limit=200)
    t.reset()
    yield t
    t.close()


def test_run_command_in_root_and_subdir(term):
    (term.root / "sub").mkdir()
    frame, reward, terminated, truncated, info = term.step(Action("run_command", {"command": "pwd; echo hi; exit 3"}))
    out = frame.tool_output  # the observation's tool_output: the command, its exit code, what it printed
    assert out["tool"] == "run_command" and out["target"] == "pwd; echo hi; exit 3" and out["exit_code"] == 3
    assert out["output"].splitlines() == [str(term.root), "hi"] and out["truncated"] is False
    assert frame.text == f"$ pwd; echo hi; exit 3\n(exit 3)\n{term.root}\nhi\n" and not terminated and not truncated
    assert info["tool_result"]["exit_code"] == 3 and "output" not in info["tool_result"]  # the output is said once
    r = term.run_command("pwd", cwd="sub")
    assert r["output"].strip() == str(term.root / "sub")


def test_timeout_kills_the_process_group(term):
    t0 = time.monotonic()
    r = term.run_command("sleep 30 & sleep 30; echo never")
    assert r["timed_out"] and "never" not in r["output"]
    assert time.monotonic() - t0 < 5


def test_output_is_capped(term):
    r = term.run_command("python3 -c \"print('x' * 5000)\"")
    assert r["truncated_output"] and len(r["output"]) < 300 and "characters cut" in r["output"]
    frame, *_ = term.step(Action("run_command", {"command": "python3 -c \"print('x' * 5000)\""}))
    assert frame.tool_output["truncated"] is True and len(frame.tool_output["output"]) < 300


def test_a_timed_out_command_says_so_in_its_output(term):
    term.timeout = 0.5
    frame, *_ = term.step(Action("run_command", {"command": "sleep 5"}))
    assert frame.tool_output["exit_code"] != 0 and "[timed out after 0.5 s: stopped]" in frame.tool_output["output"]


def test_tool_output_renders_compactly_and_keeps_the_tail_of_a_long_output():
    from agent.grammar import format_tool_output

    out = {"tool": "run_command", "target": "grep -c x data.csv", "exit_code": 0, "output": "12\n", "truncated": False}
    assert format_tool_output(out) == "$ grep -c x data.csv\n(exit 0)\n12\n"
    assert format_tool_output({**out, "exit_code": None, "output": "error: no dir"}).startswith("$ grep -c x data.csv\n(did not run)\n")
    assert format_tool_output({"tool": "write_file", "target": "o.txt", "exit_code": None, "output": "", "truncated": False}) \
        == "[write_file o.txt]"
    long = format_tool_output({**out, "output": "a" * 500 + "THE END"}, limit=100)
    assert long.endswith("THE END") and "characters cut" in long and len(long) < 200


def test_write_then_read_inside_root(term):
    term.step(Action("write_file", {"path": "notes/a.txt", "content": "héllo\nworld"}))
    assert (term.root / "notes" / "a.txt").read_text() == "héllo\nworld"
    frame, *_ , info = term.step(Action("read_file", {"path": "notes/a.txt"}))
    assert frame.tool_output == {"tool": "read_file", "target": "notes/a.txt", "exit_code": None,
                                 "output": "héllo\nworld", "truncated": False}
    assert frame.text == "[read_file notes/a.txt]\nhéllo\nworld"


@pytest.mark.parametrize("path", ["../outside.txt", "/etc/passwd", "sub/../../x"])
def test_paths_escaping_the_root_are_refused_by_name(term, path):
    with pytest.raises(PathOutsideRoot) as e:
        term.write_file(path, "no")
    assert repr(path) in str(e.value)
    assert not (term.root.parent / "outside.txt").exists()


def test_symlink_out_of_root_is_refused(term, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.symlink(secret, term.root / "link.txt")
    with pytest.raises(PathOutsideRoot):
        term.read_file("link.txt")
    with pytest.raises(ExecutionError, match="cwd|outside"):
        term.run_command("ls", cwd="..")


def test_gui_actions_are_refused(term):
    with pytest.raises(ExecutionError, match="click"):
        term.step(Action("click", {"start_box": (0.5, 0.5)}))


def test_release_ends_a_running_command(term):
    import threading

    term.timeout = 20
    result = {}
    th = threading.Thread(target=lambda: result.update(term.run_command("sleep 20")))
    th.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    term.release()
    th.join(5)
    assert not th.is_alive() and time.monotonic() - t0 < 1.0
    assert result["exit_code"] != 0


def test_write_file_never_follows_a_link_planted_at_its_temporary_name(term, tmp_path):
    """The old writer used the fixed name .NAME.tandem-tmp; a link planted there sent the content
    outside the root. Every plausible temporary name is planted here; nothing outside changes."""
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    for name in (".notes.txt.tandem-tmp", ".notes.txt.tandem-tmp.tmp", "notes.txt.tmp"):
        os.symlink(outside, term.root / name)
    term.write_file("notes.txt", "hello")
    assert (term.root / "notes.txt").read_text() == "hello" and not (term.root / "notes.txt").is_symlink()
    assert outside.read_text() == "untouched"


def test_commands_are_said_not_to_be_confined(term):
    """run_command starts inside the root but a shell can leave it; the help says so plainly."""
    import subprocess
    import sys

    out = term.run_command("cd .. && pwd")
    assert out["output"].strip() == str(term.root.parent)  # not confined: documented, not hidden
    helptext = subprocess.run([sys.executable, "main.py", "agent", "--help"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))).stdout
    assert "NOT confined" in " ".join(helptext.split())
