"""Policies and memory: replay files, an OpenAI-compatible server on 127.0.0.1, the token budget."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent import coords
from agent.executors.base import Frame, frame_from_image_bytes
from agent.policies import EndpointPolicy, PolicyError, ReplayPolicy
from agent.policies.memory import Memory, MemoryStep, count_images, message_text
from agent.schema import Action, ScreenGeometry
from tests.factories import screenshot_png


def frame(w=640, h=400, label="screen"):
    return frame_from_image_bytes(screenshot_png(w, h, label=label))


# ------------------------------------------------------------------ replay


def test_replay_parses_smart_resize_coordinates(tmp_path):
    f = frame(1280, 800)
    h, w = coords.smart_resize(800, 1280)
    x, y = round(0.25 * w), round(0.75 * h)
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(s) for s in [
        f"Thought: Click the OK button.\nAction: click(start_box='<|box_start|>({x},{y})<|box_end|>')",
        "Thought: hmm\nAction: clack(start_box='(1,2)')",
    ]) + "\n")
    p = ReplayPolicy(path)
    prop = p.propose("Press OK", Memory(), f)
    assert prop.ok and prop.thought == "Click the OK button."
    (nx, ny), = prop.actions[0].points()
    assert abs(nx - 0.25) < 1e-3 and abs(ny - 0.75) < 1e-3
    bad = p.propose("Press OK", Memory(), f)
    assert not bad.ok and "clack" in bad.parse_error and bad.actions == []
    with pytest.raises(PolicyError, match="ran out after 2"):
        p.propose("Press OK", Memory(), f)
    # the prompt is UI-TARS's computer prompt with the instruction
    assert "## User Instruction\nPress OK" in message_text(p.last_messages)
    assert "left_double(" in message_text(p.last_messages)


def test_replay_file_errors_name_the_line(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('"ok"\n{"not": "a string"}\n')
    with pytest.raises(PolicyError, match=r"r.jsonl:2: expected a JSON string"):
        ReplayPolicy(path)
    path.write_text('"ok"\nThought: raw text\n')
    with pytest.raises(PolicyError, match=r"r.jsonl:2: not JSON"):
        ReplayPolicy(path)
    with pytest.raises(PolicyError, match="cannot read"):
        ReplayPolicy(tmp_path / "missing.jsonl")


def test_mobile_prompt_and_platform_check():
    p = ReplayPolicy(["Action: press_home()", "Action: hotkey(key='ctrl c')"], platform="android")
    f = frame(540, 1200)
    assert p.propose("go home", Memory(), f).actions == [Action("press_home", {})]
    assert "press_back()" in message_text(p.last_messages) and "hotkey(" not in message_text(p.last_messages)
    bad = p.propose("copy", Memory(), f)
    assert "not available on android" in bad.parse_error


def test_tools_join_the_action_space():
    p = ReplayPolicy(["Action: run_command(command='ls')"], tools=True)
    prop = p.propose("list files", Memory(), frame())
    assert prop.ok and prop.actions[0].name == "run_command"
    assert "run_command(" in message_text(p.last_messages) and "click(" in message_text(p.last_messages)


# ------------------------------------------------------------------ memory


def _steps(n, f):
    return [MemoryStep(f"Step {i} thought. More detail here.", [Action("click", {"start_box": (0.1 * (i % 9 + 1), 0.5)})], f) for i in range(n)]


def test_memory_working_and_episodic():
    f = frame(640, 400)
    m = Memory(working_steps=2, token_budget=100_000)
    for s in _steps(6, f):
        m.add(s)
    msgs = m.build_messages("PROMPT", f, feedback="try again")
    assert count_images(msgs) == 3  # two working steps + the current screenshot
    text = message_text(msgs)
    # older steps as one-line summaries, numbered, with the action in model space
    assert "1. Step 0 thought. -> click(start_box=" in text and "4. Step 3 thought." in text
    assert "More detail" not in msgs[1]["content"] and "5. " not in msgs[1]["content"]
    assert [m_["role"] for m_ in msgs[-5:]] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[-1]["content"][-1] == {"type": "text", "text": "try again"}
    assert m.last_report == {"working": 2, "episodic": 4, "omitted": 0, "tokens": m.last_report["tokens"], "over_budget": False}


def test_memory_fits_the_token_budget():
    f = frame(640, 400)
    img = coords.smart_resize(400, 640)
    per_image = (img[0] // 28) * (img[1] // 28)
    m = Memory(working_steps=4, token_budget=per_image * 2 + 120)
    for s in _steps(30, f):
        m.add(s)
    msgs = m.build_messages("PROMPT", f)
    r = m.last_report
    assert count_images(msgs) == 2 and r["working"] == 1  # only one history screenshot fits beside the current one
    assert r["tokens"] <= m.token_budget and r["omitted"] > 0 and r["episodic"] > 0
    assert f"({r['omitted']} earlier steps omitted)" in message_text(msgs)
    # a custom counter is honoured: one token per character shrinks the episodic part
    m2 = Memory(working_steps=4, token_budget=per_image * 2 + 120, count_tokens=len)
    m2.steps = list(m.steps)
    m2.build_messages("PROMPT", f)
    assert m2.last_report["episodic"] < r["episodic"]


# ------------------------------------------------------------------ endpoint


class _Server:
    """A local OpenAI-compatible server that answers scripted completions and keeps each request."""

    def __init__(self, answers):
        self.answers = list(answers)  # str: a completion; int: an HTTP status to fail with
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                a = outer.answers.pop(0)
                if isinstance(a, int):
                    self.send_response(a)
                    self.end_headers()
                    self.wfile.write(b'{"error": "busy"}')
                    return
                data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "message": {"role": "assistant", "content": a}, "finish_reason": "stop"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    servers = []

    def make(answers):
        s = _Server(answers)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_endpoint_sends_images_prompt_and_key(server):
    srv = server([503, "Thought: Click it.\nAction: click(start_box='(100,200)')"])
    f = frame(1000, 1000)
    p = EndpointPolicy(srv.url, "ui-tars-1.5-7b", api_key="sekret", max_images=2, backoff=0.01, space=coords.RELATIVE_1000)
    m = Memory(working_steps=3)
    for s in _steps(4, frame(1000, 1000, label="old")):
        m.add(s)
    prop = p.propose("Open the menu", m, f)
    assert prop.ok and prop.actions[0].args["start_box"] == (0.1, 0.2)
    assert len(srv.requests) == 2  # the 503 was retried
    req = srv.requests[-1]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sekret"
    body = req["body"]
    assert body["model"] == "ui-tars-1.5-7b"
    parts = [p_ for msg in body["messages"] if isinstance(msg["content"], list) for p_ in msg["content"]]
    images = [p_ for p_ in parts if p_["type"] == "image_url"]
    assert len(images) == 2  # max_images: the current screenshot and the newest history one
    assert images[-1]["image_url"]["url"].startswith("data:image/png;base64,")
    assert sum(p_.get("text") == "(an earlier screenshot, omitted)" for p_ in parts) == 2
    assert "## User Instruction\nOpen the menu" in body["messages"][1]["content"]


def test_endpoint_bad_output_is_a_value_and_4xx_is_not_retried(server):
    srv = server(["I think I should click", 404])
    p = EndpointPolicy(srv.url, "m", backoff=0.01)
    prop = p.propose("x", Memory(), frame())
    assert not prop.ok and "Action" in prop.parse_error
    with pytest.raises(PolicyError, match="HTTP 404"):
        p.propose("x", Memory(), frame())
    assert len(srv.requests) == 2


def test_endpoint_unreachable_gives_up_after_retries():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here now
    p = EndpointPolicy(f"http://127.0.0.1:{port}/v1", "m", retries=2, backoff=0.01, timeout=1)
    with pytest.raises(PolicyError, match="gave up after 3 attempts"):
        p.propose("x", Memory(), frame())


def test_frame_encodings_round_trip():
    import numpy as np

    px = np.zeros((30, 40, 3), np.uint8)
    px[:, :, 0] = 255  # red in RGB
    f = Frame(geometry=ScreenGeometry.simple(40, 30), pixels=px)
    data, mime = f.encode("png")
    assert mime == "image/png" and frame_from_image_bytes(data).pil().getpixel((5, 5)) == (255, 0, 0)
    fb = Frame(geometry=ScreenGeometry.simple(40, 30), pixels=px[:, :, ::-1], bgr=True)
    assert fb.pil().getpixel((5, 5)) == (255, 0, 0)
    assert frame_from_image_bytes(fb.encode("png")[0]).pil().getpixel((5, 5)) == (255, 0, 0)


def test_one_factory_makes_a_policy_from_choices_for_each_caller(tmp_path):
    """agent.policies.choice: the agent CLI, the app's form and the sandbox share the rules and the
    checks; each names the inputs its own way in the errors."""
    from agent.policies.choice import CLI, FORM, make_policy
    from agent.storage.model_files import DEFAULT_MODEL_DIR

    with pytest.raises(PolicyError, match="^--policy endpoint needs --base-url and --model$"):
        make_policy("endpoint", base_url="http://h/v1", spelling=CLI)
    with pytest.raises(PolicyError, match="^the endpoint policy needs a base URL and a model name$"):
        make_policy("endpoint", model="m", spelling=FORM)
    with pytest.raises(PolicyError, match="^--policy replay needs --responses FILE.jsonl$"):
        make_policy("replay", spelling=CLI)
    with pytest.raises(PolicyError, match="^--policy local needs --model-dir DIR$"):
        make_policy("local", spelling=CLI)
    with pytest.raises(PolicyError, match=f"^the local policy: no model in {tmp_path} "):
        make_policy("local", model_dir=tmp_path)
    with pytest.raises(PolicyError, match="needs a model directory; '.*none' does not exist; train the default model"):
        make_policy("default", model_dir=tmp_path / "none")
    with pytest.raises(PolicyError, match="unknown coordinate space 'inches'"):  # a constructor's ValueError
        make_policy("endpoint", base_url="http://h/v1", model="m", space="inches")
    with pytest.raises(PolicyError, match="got 'oracle'"):
        make_policy("oracle")

    responses = tmp_path / "r.jsonl"
    responses.write_text(json.dumps("Action: wait()") + "\n")
    p = make_policy("replay", responses=str(responses), platform="android", space=coords.RELATIVE_1000, tools=True)
    assert isinstance(p, ReplayPolicy) and p.platforms == ("android", "terminal") and p.space == coords.RELATIVE_1000
    p = make_policy("endpoint", base_url="http://h/v1", model="m", api_key="k", max_images=2)
    assert isinstance(p, EndpointPolicy) and (p.url, p.api_key, p.max_images) == ("http://h/v1/chat/completions", "k", 2)
    if (DEFAULT_MODEL_DIR / "config.json").exists():  # the shipped model: loaded on first use, not here
        assert make_policy("default").model_dir == str(DEFAULT_MODEL_DIR)
