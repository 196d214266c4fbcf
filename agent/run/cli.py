"""`python main.py agent`: run the agent on this desktop (or an Android phone) from a terminal.

Examples:
    python main.py agent --instruction "Open the settings" --policy replay --responses demo.jsonl
    python main.py agent --instruction "..." --policy endpoint --base-url http://127.0.0.1:8000/v1 --model ui-tars-1.5-7b --gate risky
    python main.py agent --instruction "..." --policy local --model-dir ./ui-tars-1.5-7b --gate all

Gate questions are answered in this terminal, or, with --publish, by remote supervisors through
the sync backend (Supervise -> Watch a run, with the printed run id). The kill switch
(Ctrl+Alt+Shift+K by default) stops the agent at once; so does Ctrl+C. The episode lands in the
store either way.
"""
from __future__ import annotations

import os
import signal
import sys

from agent import coords
from agent.cli_common import fail, open_store
from agent.executors.android import AndroidExecutor
from agent.executors.base import ExecutionError
from agent.executors.desktop import DesktopExecutor
from agent.executors.terminal import TerminalExecutor
from agent.grammar import format_action
from agent.host.killswitch import DEFAULT_HOTKEY, KillSwitch, KillSwitchError
from agent.policies import PolicyError
from agent.policies.choice import CLI
from agent.policies.choice import make_policy as choose
from agent.run.gate import GATE_MODES, Gate
from agent.run.loop import AgentLoop, LoopConfig
from agent.run.terminal_supervisor import TerminalSupervisor
from agent.storage.secret_store import saved_secret
from agent.sync.client import signing_name
from agent.sync.live_link import RunPublisher
from agent.wording import command_name


def register(sub, common) -> None:
    p = sub.add_parser("agent", parents=[common], help="run the agent on this desktop or a phone",
                       description="Runs observe -> propose -> gate -> execute -> record; the episode is saved in the store as it goes. "
                       "Questions from the gate are answered in the terminal.")
    p.add_argument("--instruction", required=True, help="what the agent should do")
    p.add_argument("--policy", choices=("endpoint", "local", "replay"), required=True)
    p.add_argument("--responses", metavar="FILE.jsonl", help="replay: one JSON string (a raw model response) per line")
    p.add_argument("--model-dir", metavar="DIR", help="local: a transformers Qwen2.5-VL-class model directory")
    p.add_argument("--base-url", help="endpoint: OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--model", help="endpoint: the served model name")
    p.add_argument("--api-key", help="endpoint: API key (default: $TANDEM_API_KEY or $OPENAI_API_KEY)")
    p.add_argument("--max-images", type=int, default=5, help="endpoint: screenshots per request (default 5)")
    p.add_argument("--gate", choices=GATE_MODES, default="risky", help="when to ask you (default: risky)")
    p.add_argument("--max-steps", type=int, default=30)
    p.add_argument("--max-seconds", type=float, help="stop after this long")
    p.add_argument("--coords", choices=coords.SPACES, default=coords.SMART_RESIZE, help="the model's coordinate space")
    p.add_argument("--platform", choices=("desktop", "android"), default="desktop")
    p.add_argument("--serial", help="android: the device serial (default: $ANDROID_SERIAL or the only device)")
    p.add_argument("--monitor", type=int, default=1, help="desktop: mss monitor index (1 = primary, 0 = all)")
    p.add_argument("--tools-root", metavar="DIR", help="also give the agent the terminal and files: read_file/write_file stay inside DIR; "
                        "run_command starts in DIR but runs with your rights and is NOT confined (a command can "
                        "cd out); the gate asks before every tool action")
    p.add_argument("--image-format", choices=("png", "jpeg"), default="jpeg", help="screenshots in the store (default jpeg q90; png is lossless and about 10x slower)")
    p.add_argument("--hotkey", default=DEFAULT_HOTKEY, help=f"kill-switch hotkey in pynput notation (default {DEFAULT_HOTKEY})")
    p.add_argument("--no-kill-switch", action="store_true", help="do not listen for the kill-switch hotkey")
    p.add_argument("--publish", action="store_true",
                   help="remote supervisors answer the gate: publish this run through the sync backend "
                        "(the one `sync --save` set up, or --server/--token)")
    p.add_argument("--server", help="--publish: backend URL (default: the saved sync server)")
    p.add_argument("--token", help="--publish: token (default: the saved sync token)")
    p.add_argument("--run-id", help="--publish: the run id supervisors open (default: a new random one)")
    p.add_argument("--decision-timeout", type=float,
                   help="--publish: seconds to wait for a supervisor's decision before stopping (default: no limit)")
    p.set_defaults(func=cmd_agent)


def make_policy(args):
    key = args.api_key or os.environ.get("TANDEM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return choose(args.policy, responses=args.responses, base_url=args.base_url, model=args.model, api_key=key,
                  model_dir=args.model_dir, platform=args.platform, space=args.coords, tools=bool(args.tools_root),
                  max_images=args.max_images, spelling=CLI)


def make_executor(args):
    if args.platform == "android":
        return AndroidExecutor(serial=args.serial)

    return DesktopExecutor(monitor=args.monitor)


def _print_step(step) -> None:
    a = step.action
    where = step.info.get("screen_point") or step.info.get("screen_points") or ""
    who = step.provenance.source
    err = f"  ERROR {step.info['error']}" if step.info.get("error") else ""
    print(f"[{step.index}] {who:9} {format_action(a)} {where}{err}", flush=True)


def cmd_agent(args) -> int:
    try:
        policy = make_policy(args)
    except (ValueError, PolicyError) as e:
        return fail(str(e))
    executor = make_executor(args)
    tools = None
    if args.tools_root:
        try:
            tools = TerminalExecutor(args.tools_root)
        except ExecutionError as e:
            return fail(str(e))
    store = open_store(args)
    publisher = None
    if args.publish:
        if args.gate == "auto":
            store.close()
            return fail("--publish needs --gate risky or all: with auto nobody is asked")
        url = args.server or store.get_setting("sync.server_url")

        token = args.token or saved_secret(store, "sync.token")
        if not url or not token:
            store.close()
            return fail(f"--publish needs a backend: run `{command_name()} sync --server URL --token T --save` or pass "
                        "--server and --token")

        try:
            publisher = RunPublisher(url, token, args.run_id, timeout=args.decision_timeout).start()
        except Exception as e:  # any failure to connect or log in is reported, not raised
            store.close()
            return fail(f"cannot publish the run to {url}: {e}")
        supervisor = publisher.supervisor
        print(f"run id: {publisher.run_id} (open it in Supervise -> Watch a run)", flush=True)
    else:
        supervisor = TerminalSupervisor(name=signing_name(store, "terminal")) if args.gate != "auto" else None
    loop = AgentLoop(policy, executor, store=store, gate=Gate(args.gate, supervisor), tools=tools,
                     config=LoopConfig(max_steps=args.max_steps, max_seconds=args.max_seconds, image_format=args.image_format),
                     on_step=_print_step, on_control=lambda on: print("[agent has control]" if on else "[agent idle]", flush=True))
    if publisher is not None:
        supervisor.stop_event = loop.stop_event  # a stop (kill switch, Ctrl+C) also ends the wait for a decision
    switch = KillSwitch(loop, hotkey=args.hotkey)
    if not args.no_kill_switch and args.platform == "desktop":
        try:
            switch.start()
            print(f"kill switch: {args.hotkey}", flush=True)
        except KillSwitchError as e:
            print(f"warning: {e}; use Ctrl+C to stop", file=sys.stderr)
    old = signal.signal(signal.SIGINT, lambda *a: loop.stop("interrupted (Ctrl+C)"))
    res = None
    try:
        res = loop.run(args.instruction)
    except ExecutionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        if publisher is not None:
            publisher.end(res.reason if res is not None else "error")
        signal.signal(signal.SIGINT, old)
        switch.stop()
        executor.close()
        policy.close()
        store.close()
    print(f"episode {res.episode.id}: {res.steps} steps, ended: {res.reason}", flush=True)
    return 0 if res.reason in ("finished", "call_user") else 1
