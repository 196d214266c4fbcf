"""Tool calls under supervision (issue 43, item 4), driven like a supervisor would (pytest-qt,
offscreen): the agent acts on a real sandbox task with a real TerminalExecutor over a workspace in
tmp_path (real subprocesses); only the model is scripted. The supervisor reads the proposed
command, edits it in the action editor and approves; the edited command is what runs."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontInfo

from agent.executors.terminal import TerminalExecutor
from agent.policies import ReplayPolicy
from agent.run.loop import LoopConfig
from agent.schema import Action, Episode, Observation, Provenance, ScreenGeometry, Step
from app.sandbox_executor import SandboxProcessExecutor
from app.step_view import StepViewer
from app.supervise_view import SupervisePage

WRONG, RIGHT = "echo wrong > out.txt", "echo right > out.txt"


@pytest.fixture
def page(qtbot, store):
    p = SupervisePage(store, name="alice")
    qtbot.addWidget(p)
    p.resize(1400, 900)
    p.show()
    qtbot.waitExposed(p)
    yield p
    p.shutdown()


@pytest.fixture
def workspace(tmp_path):
    root = tmp_path / "workspace"
    root.mkdir()
    return root


def start(page, workspace, responses):
    ex = SandboxProcessExecutor("click_button", 3)
    instruction = ex.prepare()
    policy = ReplayPolicy(responses, platform="sandbox", tools=True)
    tools = TerminalExecutor(workspace, timeout=10)
    page.start_run(policy, ex, instruction, gate="all", config=LoopConfig(max_steps=6, kind="supervised"), tools=tools)


def wait_for_proposal(qtbot, page, n):
    qtbot.waitUntil(lambda: len(page.displays) >= n and page.panel.pending is not None, timeout=15000)
    return page.panel


def wait_end(qtbot, page):
    qtbot.waitUntil(lambda: page.last_result is not None, timeout=20000)
    return page.store.load_episode(page.last_episode_id)


def test_an_edited_command_is_what_runs_and_its_output_is_shown(qtbot, page, workspace, store):
    start(page, workspace, ["Thought: Write the answer.\nAction: run_command(command='echo wrong > out.txt')",
                            "Action: run_command(command='echo bad input; exit 3')",
                            "Action: run_command(command='seq 1 500')",
                            "Action: finished()"])
    panel = wait_for_proposal(qtbot, page, 1)
    # the proposal reads as a tool call that runs here, its command in a monospace block
    assert panel.tool_call.isVisible() and panel.tool_call.text() == f"$ {WRONG}"
    assert "runs a shell command on this machine" in panel.tool_call.title.text()
    assert str(workspace) in panel.tool_call.title.text()
    assert QFontInfo(panel.tool_call.body.font()).fixedPitch()
    assert not panel.last_output.isVisible()  # no tool ran before the first step
    # the supervisor rewrites the command in the editor's field, then approves with the button
    field = panel.editor.fields["command"]
    assert field.toPlainText() == WRONG
    field.selectAll()
    qtbot.keyClicks(field, RIGHT)
    assert panel.approve_btn.text().startswith("Approve with edits")
    assert panel.tool_call.text() == f"$ {RIGHT}\n\nproposed by the agent:\n$ {WRONG}"
    qtbot.mouseClick(panel.approve_btn, Qt.LeftButton)

    # the next proposal comes with the command's result: what the agent sees now
    panel = wait_for_proposal(qtbot, page, 2)
    assert (workspace / "out.txt").read_text() == "right\n"
    assert panel.last_output.isVisible() and "exit code 0" in panel.last_output.title.text()
    assert panel.last_output.text().startswith(f"$ {RIGHT}\n[exit code 0]")
    assert "exit code 0" in page.step_output.title.text() and page.steps.item(0).text().endswith("→ exit code 0")
    qtbot.keyClick(panel, Qt.Key_Return)

    # a failing command: its exit code is shown, in red, with what it printed
    panel = wait_for_proposal(qtbot, page, 3)
    assert panel.last_output.text() == "$ echo bad input; exit 3\n[exit code 3]\nbad input"
    assert "exit code 3" in panel.last_output.title.text() and "#c0392b" in panel.last_output.title.text()
    qtbot.keyClick(panel, Qt.Key_Return)

    # a long output: the first lines, and how many more there are
    panel = wait_for_proposal(qtbot, page, 4)
    shown = panel.last_output.text().splitlines()
    assert shown[:3] == ["$ seq 1 500", "[exit code 0]", "1"] and shown[-1] == "… 494 more lines" and "500" not in shown
    qtbot.keyClick(panel, Qt.Key_Return)

    ep = wait_end(qtbot, page)
    s0, s1, s2, s3 = ep.steps
    assert s0.action == Action("run_command", {"command": RIGHT})
    assert s0.provenance.source == "corrected" and s0.provenance.decision == "edit"
    assert s0.provenance.proposal_action == Action("run_command", {"command": WRONG})
    assert s1.observation.tool_output == {"tool": "run_command", "target": RIGHT, "exit_code": 0, "output": "",
                                          "truncated": False}
    assert s2.observation.tool_output["exit_code"] == 3 and s3.observation.tool_output["output"].count("\n") == 500
    assert s1.observation.screenshot  # the GUI's frame, with the tool output beside it

    # the step viewer shows each tool step's result in a recorded episode
    viewer = StepViewer(store)
    qtbot.addWidget(viewer)
    viewer.resize(1300, 800)
    viewer.show()
    viewer.load_episode(ep.id)
    assert viewer.tool_output.text().startswith(f"$ {RIGHT}\n[exit code 0]")
    viewer.select_step(1)
    assert "[exit code 3]" in viewer.tool_output.text()
    viewer.select_step(2)
    assert viewer.tool_output.text().splitlines()[-1] == "… 494 more lines"
    viewer.select_step(3)
    assert viewer.tool_output.isHidden()  # finished is no tool call


def test_a_write_file_proposal_shows_its_path_and_content_and_can_be_edited(qtbot, page, workspace):
    content = "\n".join(f"line {i}" for i in range(1, 13))
    start(page, workspace, [f"Action: write_file(path='notes.txt', content='{content.replace(chr(10), chr(92) + 'n')}')",
                            "Action: finished()"])
    panel = wait_for_proposal(qtbot, page, 1)
    shown = panel.tool_call.text().splitlines()
    assert "writes a file" in panel.tool_call.title.text()
    assert shown[0] == "notes.txt" and shown[2:4] == ["line 1", "line 2"] and shown[-1] == "… 6 more lines"
    path, body = panel.editor.fields["path"], panel.editor.fields["content"]
    assert body.toPlainText() == content
    path.selectAll()
    qtbot.keyClicks(path, "kept.txt")
    body.selectAll()
    qtbot.keyClicks(body, "only this")
    qtbot.mouseClick(panel.approve_btn, Qt.LeftButton)
    panel = wait_for_proposal(qtbot, page, 2)
    assert (workspace / "kept.txt").read_text() == "only this" and not (workspace / "notes.txt").exists()
    assert panel.last_output.text() == "write_file kept.txt\n[done]\nwrote 9 bytes to kept.txt"
    page.panel.stop_run()
    wait_end(qtbot, page)


def test_an_old_episode_with_text_observations_still_shows(qtbot, store):
    """Episodes recorded before tool_output kept the terminal's text in observation.extra["text"]
    and the raw result in info["tool_result"]; the step viewer still shows both."""
    g = ScreenGeometry.simple(1, 1)
    steps = [Step(0, Observation(None, 1, 1, g, 0.0, extra={"text": "working directory: /w"}), "",
                  Action("run_command", {"command": "ls"}), Provenance("agent"), 0.0, 0.1,
                  info={"tool_result": {"command": "ls", "exit_code": 2, "output": "ls: cannot access\n",
                                        "truncated_output": False, "timed_out": False}}),
             Step(1, Observation(None, 1, 1, g, 1.0, extra={"text": "$ ls\nls: cannot access\n[exit code 2]"}), "",
                  Action("finished", {}), Provenance("agent"), 1.0, 1.1)]
    ep = Episode("list", kind="autonomous", platform="terminal", steps=steps)
    store.save_episode(ep)
    viewer = StepViewer(store)
    qtbot.addWidget(viewer)
    viewer.show()
    viewer.load_episode(ep.id)
    assert viewer.tool_output.text() == "$ ls\n[exit code 2]\nls: cannot access"
    assert "exit code 2" in viewer.tool_output.title.text()
    viewer.select_step(1)
    assert viewer.tool_output.text() == "$ ls\nls: cannot access\n[exit code 2]"
    assert "Text observation" in viewer.tool_output.title.text()


def test_the_form_gives_the_agent_a_workspace_folder(qtbot, page, workspace, tmp_path, store):
    """Run here: the Tools folder is where the agent's tools act, and the policy is offered them."""
    import json

    path = tmp_path / "responses.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ["Action: run_command(command='pwd > where.txt')",
                                                      "Action: finished()"]) + "\n")
    f = page.form
    f.set_choice(f.policy, "replay")
    f.replay_path.setText(str(path))
    f.set_choice(f.executor, "sandbox")
    f.tools_root.setText(str(tmp_path / "no such folder"))
    page.start_from_form()
    assert "tools:" in page.run_label.text() and "no such folder" in page.run_label.text() and page.run is None
    f.tools_root.setText(str(workspace))
    qtbot.mouseClick(page.start_btn, Qt.LeftButton)
    panel = wait_for_proposal(qtbot, page, 1)
    assert panel.tool_call.text() == "$ pwd > where.txt" and str(workspace) in panel.tool_call.title.text()
    qtbot.mouseClick(panel.approve_btn, Qt.LeftButton)
    wait_for_proposal(qtbot, page, 2)
    assert (workspace / "where.txt").read_text().strip() == str(workspace)
    qtbot.mouseClick(page.panel.approve_btn, Qt.LeftButton)
    wait_end(qtbot, page)
    assert store.get_setting("supervise.tools_root") == str(workspace)
