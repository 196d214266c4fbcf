"""Hybrid sandbox tasks (GUI and terminal/file tools over one workspace per episode), on real Qt
widgets offscreen and real subprocesses in a real temporary folder: the verifiers accept the
expert's result and reject near misses, the expert solves every family with the tools and, where a
GUI-only route exists, without them, and the tools' output reaches the next observation, the
runner's trajectory, the stored episode and the demonstrations' chats."""
from __future__ import annotations

import json

import pytest

from agent.grammar import TOOL_OUTPUT_LIMIT, format_tool_output
from agent.schema import Action
from trainer.rollout.actors import ExpertActor
from trainer.rollout.runner import EpisodeRunner, demonstrate, run_episode, trajectory_to_episode
from trainer.sandbox.env import SandboxEnv
from trainer.sandbox.families import FAMILIES, HYBRID_FAMILIES, family_class, parse_families
from trainer.sandbox.families_hybrid import format_record
from trainer.sandbox.screen import SandboxError
from trainer.sandbox.task import FAILED, HELDOUT_START, RUNNING, SUCCESS

SEEDS = [HELDOUT_START + k for k in (3, 17, 29)]


@pytest.fixture
def make_env():
    made = []

    def make(**kw):
        made.append(SandboxEnv(**kw))
        return made[-1]

    yield make
    for env in made:
        env.close()


def _run(make_env, tools: bool, family: str, seeds=SEEDS):
    """The expert through the one episode runner (its replies formatted and parsed as a model's are)."""
    env = make_env(tools=tools)
    return EpisodeRunner(ExpertActor(env), [env], greedy=True).run_all([(s, family) for s in seeds])


def _expert_until(env, stop) -> None:
    """Step the env's expert until `stop(thought, action)` holds for its next move (not taken)."""
    for _ in range(60):
        thought, action = env.expert_action()
        if stop(thought, action):
            return
        env.step(action)
    raise AssertionError("the expert never reached the move asked for")


def test_six_hybrid_families_kept_apart_from_the_gui_families():
    assert len(HYBRID_FAMILIES) >= 6 and len(FAMILIES) == 16
    assert not set(HYBRID_FAMILIES) & set(FAMILIES)
    assert parse_families("hybrid") == list(HYBRID_FAMILIES)
    assert parse_families("radio,bulk_rename") == ["radio", "bulk_rename"]
    assert SandboxEnv().families == list(FAMILIES)  # the default draws no hybrid family
    with pytest.raises(SandboxError, match="unknown sandbox families: nope"):
        parse_families("nope")
    with pytest.raises(ValueError, match="config_to_form cannot be played without the tools"):
        SandboxEnv(families=["form_to_file", "config_to_form"])
    assert SandboxEnv(families=["config_to_form"], tools=True).families == ["config_to_form"]


@pytest.mark.parametrize("family", list(HYBRID_FAMILIES))
def test_expert_solves_each_family_with_and_without_tools(make_env, family):
    on = _run(make_env, True, family)
    assert all(t.success for t in on), [(t.seed, t.status) for t in on]
    assert all(not u.parse_error and not u.action_error for t in on for u in t.turns)
    if not family_class(family).gui_route:
        env = make_env(tools=False)
        with pytest.raises(SandboxError, match="cannot be played without the tools"):
            env.reset(seed=SEEDS[0], options={"family": family})
        return
    off = _run(make_env, False, family)
    assert all(t.success for t in off), [(t.seed, t.status) for t in off]
    assert not any(a.name in ("run_command", "read_file", "write_file") for t in off for u in t.turns for a in u.actions)
    steps_on, steps_off = (sum(len(t.turns) for t in ts) / len(ts) for ts in (on, off))
    if family in ("bulk_rename", "export_count", "form_to_file"):
        assert steps_on < steps_off, (steps_on, steps_off)
    if family == "bulk_rename":  # one shell loop instead of a dialog per file
        assert steps_on == 1 and steps_off >= 15


def test_instruction_offers_tools_only_when_on(make_env):
    on, off = make_env(tools=True), make_env(tools=False)
    _, info_on = on.reset(seed=SEEDS[0], options={"family": "export_count"})
    _, info_off = off.reset(seed=SEEDS[0], options={"family": "export_count"})
    assert "command" in info_on["instruction"] and "command" not in info_off["instruction"]
    traj_on = run_episode(ExpertActor(on), on, SEEDS[1], family="radio")
    traj_off = run_episode(ExpertActor(off), off, SEEDS[1], family="radio")
    prompt_on, prompt_off = (json.dumps([m["content"] for m in t.turns[0].messages if isinstance(m["content"], str)])
                             for t in (traj_on, traj_off))
    assert "run_command(" in prompt_on and "write_file(" in prompt_on
    assert "run_command(" not in prompt_off


def test_export_count_rejects_a_wrong_count(make_env):
    env = make_env(tools=True)
    env.reset(seed=SEEDS[0], options={"family": "export_count"})
    _expert_until(env, lambda thought, a: "press Submit" in thought)
    task = env.task
    assert task.answer.text() == str(task.count) and task.verdict().status == RUNNING
    task.answer.setText(str(task.count + 1))
    _, _, term, _, info = env.step(task.click(task.submit))
    assert term and info["status"] == FAILED and "orders match" in info["reason"]


def test_config_to_form_rejects_one_wrong_field(make_env):
    env = make_env(tools=True)
    env.reset(seed=SEEDS[1], options={"family": "config_to_form"})
    _expert_until(env, lambda thought, a: "press Save" in thought)
    task = env.task
    port = task.fields["port"]
    port.setValue(port.value() + 1)
    _, _, term, _, info = env.step(task.click(task.save))
    assert term and info["status"] == FAILED and "port" in info["reason"]


def _seed_with(family: str, tools: bool, pred) -> int:
    env = SandboxEnv(tools=tools)
    try:
        for seed in range(HELDOUT_START, HELDOUT_START + 200):
            env.reset(seed=seed, options={"family": family})
            if pred(env.task):
                return seed
    finally:
        env.close()
    raise AssertionError("no such seed")


@pytest.mark.parametrize("fmt", ["json", "kv"])
def test_form_to_file_verifier_parses_the_file(make_env, fmt):
    seed = _seed_with("form_to_file", True, lambda t: t.fmt == fmt and "age" in t.record)
    env = make_env(tools=True)

    def write(content):
        env.reset(seed=seed, options={"family": "form_to_file"})
        return env.step(Action("write_file", {"path": env.task.file, "content": content}))[4]

    env.reset(seed=seed, options={"family": "form_to_file"})
    record = dict(env.task.record)
    other = "kv" if fmt == "json" else "json"
    wrong_value = {**record, "age": record["age"] + 1}
    wrong_key = {("full_name" if k == "name" else k): v for k, v in record.items()}
    as_text = {**record, "age": str(record["age"])}
    for content in (format_record(wrong_value, fmt), format_record(wrong_key, fmt), format_record(record, other),
                    format_record({k: v for k, v in record.items() if k != "name"}, fmt)):
        info = write(content)
        assert info["status"] == RUNNING and not info["success"] and info["reason"], content
    if fmt == "json":  # the age must be a number, as the instruction says
        assert write(format_record(as_text, fmt))["status"] == RUNNING
    info = write(format_record(record, fmt))
    assert info["status"] == SUCCESS and info["success"]


def test_bulk_rename_counts_every_file(make_env):
    env = make_env(tools=True)
    env.reset(seed=SEEDS[0], options={"family": "bulk_rename"})
    task = env.task
    first = task.olds[0]
    # one file renamed: a near miss
    _, _, term, _, info = env.step(Action("run_command", {"command": f"mv -- '{first}' '{task.rename(first)}'"}))
    assert not term and info["status"] == RUNNING and 0 < info["progress"] < 1
    # the loop does the rest
    env.step(Action("run_command", {"command": task.command}))
    assert task.verdict().status == SUCCESS
    env.reset(seed=SEEDS[0], options={"family": "bulk_rename"})
    _, _, term, _, info = env.step(Action("run_command", {"command": f"rm -- '{env.task.olds[1]}'"}))
    assert term and info["status"] == FAILED and "lost" in info["reason"]
    env.reset(seed=SEEDS[0], options={"family": "bulk_rename"})
    env.step(Action("run_command", {"command": env.task.command + " && touch extra.txt"}))
    assert env.task.verdict().status == RUNNING  # a stray file beside the right names is no success either


def test_bulk_rename_gui_list_follows_the_folder(make_env):
    env = make_env(tools=True)
    env.reset(seed=SEEDS[2], options={"family": "bulk_rename"})
    task = env.task
    env.step(Action("run_command", {"command": "touch zz_new.txt"}))
    assert "zz_new.txt" in [task.list.item(i).text() for i in range(task.list.count())]


def test_output_decides_rejects_the_runner_up(make_env):
    env = make_env(tools=True)
    env.reset(seed=SEEDS[0], options={"family": "output_decides"})
    task = env.task
    wrong = next(f for f in task.stats if f != task.target)
    task.list.setCurrentRow(list(task.stats).index(wrong))
    _, _, term, _, info = env.step(task.click(task.attach))
    assert term and info["status"] == FAILED and task.target in info["reason"]


def test_tool_trap_editing_the_settings_file_fails(make_env):
    env = make_env(tools=True)
    _, info = env.reset(seed=SEEDS[0], options={"family": "tool_trap"})
    assert "prefs.ini" in info["instruction"]
    task = env.task
    _, _, term, _, info = env.step(Action("read_file", {"path": "prefs.ini"}))  # looking costs a step, no more
    assert not term and info["status"] == RUNNING
    want = {**task._values(), **task.want}
    _, _, term, _, info = env.step(Action("write_file", {"path": "prefs.ini", "content": task._ini(want)}))
    assert term and info["status"] == FAILED and "edited outside the app" in info["reason"]
    assert task._wrong()  # the app did not take the edit: its widgets hold the old settings


def test_tool_action_with_tools_off_is_an_action_error(make_env):
    env = make_env(tools=False)
    obs, _ = env.reset(seed=SEEDS[0], options={"family": "click_button"})
    assert env.workspace is None and "tool_output" not in obs
    obs, _, term, trunc, info = env.step(Action("run_command", {"command": "touch /tmp/never"}))
    assert "no terminal or file tools" in info["action_error"] and not term and not trunc
    assert "tool_output" not in obs
    env.reset(seed=SEEDS[0], options={"family": "form_to_file"})  # a hybrid family keeps its app's folder
    assert env.workspace.is_dir()
    info = env.step(Action("write_file", {"path": env.task.file, "content": format_record(env.task.record, env.task.fmt)}))[4]
    assert "no terminal" in info["action_error"] and info["status"] == RUNNING


def test_workspace_is_fresh_each_episode_and_removed(make_env):
    env = make_env(tools=True)
    env.reset(seed=SEEDS[0], options={"family": "radio"})
    first = env.workspace
    assert first.is_dir() and not any(first.iterdir())
    env.step(Action("write_file", {"path": "left.txt", "content": "x"}))
    assert (first / "left.txt").read_text() == "x"
    env.reset(seed=SEEDS[0], options={"family": "output_decides"})
    second = env.workspace
    assert not first.exists() and second != first and any(second.glob("*.log"))
    env.close()
    assert not second.exists() and env.workspace is None


def test_command_output_reaches_the_next_observation(make_env):
    env = make_env(tools=True)
    obs, _ = env.reset(seed=SEEDS[0], options={"family": "radio"})
    assert obs["tool_output"] is None and env.observation_space.contains(obs)
    obs, _, _, _, info = env.step(Action("run_command", {"command": "echo hello; pwd; exit 3"}))
    out = obs["tool_output"]
    assert out["tool"] == "run_command" and out["target"] == "echo hello; pwd; exit 3" and out["exit_code"] == 3
    assert out["output"] == f"hello\n{env.workspace.resolve()}\n" and out["truncated"] is False
    assert "action_error" not in info and env.observation_space.contains(obs)
    obs = env.step(Action("read_file", {"path": "../../etc/passwd"}))[0]  # outside the workspace: refused
    assert obs["tool_output"]["output"].startswith("error:") and "outside the allowed root" in obs["tool_output"]["output"]
    obs, _, _, _, info = env.step(Action("wait", {}))
    assert obs["tool_output"] is None
    obs = env.step(Action("run_command", {"command": "yes | head -c 20000"}))[0]
    assert obs["tool_output"]["truncated"] and len(obs["tool_output"]["output"]) < 5000


def test_runner_trajectory_and_stored_episode_carry_tool_output(make_env, tmp_path):
    from agent.storage.store import Store

    env = make_env(tools=True)
    traj = run_episode(ExpertActor(env), env, SEEDS[0], family="export_count")
    assert traj.success
    k = next(i for i, u in enumerate(traj.turns) if u.action == "run_command")
    command = traj.turns[k].actions[0].args["command"]
    seen = traj.turns[k + 1].tool_output
    assert seen["tool"] == "run_command" and seen["target"] == command and seen["exit_code"] == 0
    assert seen["output"].strip() == str(env.task.count)  # grep's count, as the verifier counts
    assert traj.turns[k].tool_output is None
    store = Store(tmp_path / "data")
    try:
        ep = trajectory_to_episode(traj, store, producer="expert")
        again = store.load_episode(ep.id)
        assert again.steps[k].action.name == "run_command" and again.steps[k].action.args["command"] == command
        assert again.steps[k + 1].observation.tool_output == seen
        assert again.steps[k].observation.tool_output is None
    finally:
        store.close()


def test_demonstrations_hold_the_tool_action_and_its_output():
    trajs = demonstrate([(SEEDS[0], "output_decides"), (SEEDS[1], "config_to_form")], env_kw={"tools": True})
    assert all(t.success for t in trajs)
    for traj in trajs:
        k = next(i for i, u in enumerate(traj.turns) if u.action in ("run_command", "read_file"))
        target = traj.turns[k + 1].tool_output["output"]
        assert "run_command(" in traj.turns[k].text or "read_file(" in traj.turns[k].text
        # the next turn's chat (an SFT sample's prompt) shows the tool's output first in what it observes
        chat = traj.turns[k + 1].messages
        last = chat[-1]["content"]
        first_text = last if isinstance(last, str) else next(p["text"] for p in last if p.get("type") == "text")
        assert first_text == format_tool_output(traj.turns[k + 1].tool_output, TOOL_OUTPUT_LIMIT), last
        assert target.strip().splitlines()[0] in first_text


def test_env_processes_play_hybrid_tickets():
    from trainer.sandbox.env_process import make_envs

    envs = make_envs(2, tools=True)
    try:
        assert all(e.tools and e.platforms == ("sandbox", "terminal") for e in envs)
        trajs = EpisodeRunner(ExpertActor(envs), envs, greedy=True).run_all(
            [(SEEDS[0], "bulk_rename"), (SEEDS[1], "export_count"), (SEEDS[2], "form_to_file")])
    finally:
        for e in envs:
            e.close()
    assert all(t.success for t in trajs)
    ec = trajs[1]
    assert any(u.tool_output and u.tool_output["tool"] == "run_command" for u in ec.turns)


def test_eval_cli_tools_both_reports_steps_side_by_side(capsys):
    from main import main

    assert main(["sandbox", "eval", "--policy", "expert", "--families", "bulk_rename,config_to_form", "--episodes", "4",
                 "--tools", "both", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tools"] == "both" and out["on"]["families"] == {"bulk_rename": 1.0, "config_to_form": 1.0}
    assert out["off"]["families"] == {"bulk_rename": 1.0} and "config_to_form" in out["off"]["not_playable"]
    assert out["on"]["intervals"]["families"]["bulk_rename"]["episodes"] == 2
    steps = out["mean_steps"]["bulk_rename"]
    assert steps["on"] == 1.0 and steps["off"] > 10 and out["mean_steps"]["config_to_form"]["off"] is None
    # no --tools: on, since a hybrid family is asked for
    assert main(["sandbox", "eval", "--policy", "expert", "--families", "form_to_file", "--episodes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tools"] == "on" and out["families"] == {"form_to_file": 1.0} and out["mean_steps"]["form_to_file"] == 1.0
    assert main(["sandbox", "eval", "--policy", "expert", "--families", "bulk_rename", "--episodes", "2",
                 "--tools", "both"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].count("tools on") == 1 and table[0].count("tools off") == 1
    assert table[1].split()[0] == "bulk_rename" and table[1].count("100.00%") == 2
    # generate refuses a family the tools-off setting cannot play, naming it
    assert main(["sandbox", "generate", "--episodes", "1", "--families", "config_to_form", "--tools", "off"]) == 2
    assert "config_to_form needs the tools" in capsys.readouterr().err
