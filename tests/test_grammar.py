"""The UI-TARS grammar: golden parses for every action and coordinate form, round trips,
properties, and malformed outputs that must come back as error values."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.actions import REGISTRY, canonical_keys, validate
from agent.grammar import (
    ParseError,
    format_action,
    format_response,
    parse_normalized,
    parse_point,
    parse_response,
    system_prompt,
)
from agent.schema import Action


def one(text, **kw):
    r = parse_response(text, **kw)
    assert r, getattr(r, "reason", r)
    assert len(r.actions) == 1, r.actions
    return r.actions[0]


# ------------------------------------------------------------------ golden: every action

GOLDEN = [
    ("click(start_box='(100,200)')", Action("click", {"start_box": (100.0, 200.0)})),
    ("left_double(start_box='(5,6)')", Action("left_double", {"start_box": (5.0, 6.0)})),
    ("right_single(start_box='(7,8)')", Action("right_single", {"start_box": (7.0, 8.0)})),
    (
        "drag(start_box='(1,2)', end_box='(30,40)')",
        Action("drag", {"start_box": (1.0, 2.0), "end_box": (30.0, 40.0)}),
    ),
    ("hotkey(key='ctrl c')", Action("hotkey", {"key": "ctrl c"})),
    ("hotkey(key='Ctrl+Shift+T')", Action("hotkey", {"key": "ctrl shift t"})),
    ("type(content='hello world')", Action("type", {"content": "hello world"})),
    ("scroll(start_box='(10,20)', direction='down')", Action("scroll", {"start_box": (10.0, 20.0), "direction": "down"})),
    ("scroll(direction='Left')", Action("scroll", {"direction": "left"})),
    ("wait()", Action("wait", {})),
    ("finished(content='done')", Action("finished", {"content": "done"})),
    ("finished()", Action("finished", {})),
    ("call_user()", Action("call_user", {})),
    ("long_press(start_box='(3,4)')", Action("long_press", {"start_box": (3.0, 4.0)})),
    ("open_app(app_name='Settings')", Action("open_app", {"app_name": "Settings"})),
    ("press_home()", Action("press_home", {})),
    ("press_back()", Action("press_back", {})),
    ("run_command(command='ls -la', cwd='/tmp')", Action("run_command", {"command": "ls -la", "cwd": "/tmp"})),
    ("read_file(path='a.txt')", Action("read_file", {"path": "a.txt"})),
    ("write_file(path='a.txt', content='x\\ny')", Action("write_file", {"path": "a.txt", "content": "x\ny"})),
]


def test_golden_covers_every_registered_action():
    assert {a.name for _, a in GOLDEN} == set(REGISTRY)


@pytest.mark.parametrize("text,expected", GOLDEN, ids=[g[1].name + str(i) for i, g in enumerate(GOLDEN)])
def test_golden_action(text, expected):
    assert one(f"Thought: t\nAction: {text}") == expected


# ------------------------------------------------------------------ golden: coordinate forms


@pytest.mark.parametrize(
    "form,point",
    [
        ("'(100,200)'", (100, 200)),
        ("'( 100 , 200 )'", (100, 200)),
        ("'<|box_start|>(100,200)<|box_end|>'", (100, 200)),
        ("'[90,190,110,210]'", (100, 200)),
        ("'(90,190,110,210)'", (100, 200)),
        ("'<|box_start|>(90,190,110,210)<|box_end|>'", (100, 200)),
        ("'<bbox>90 190 110 210</bbox>'", (100, 200)),
        ("'<point>100 200</point>'", (100, 200)),
        ("'[100, 200]'", (100, 200)),
        ("(100,200)", (100, 200)),  # unquoted
        ("<point>100 200</point>", (100, 200)),  # unquoted tag
        ("'100.5,200.25'", (100.5, 200.25)),
    ],
)
def test_coordinate_forms(form, point):
    assert one(f"Action: click(start_box={form})").args["start_box"] == pytest.approx(point)


@pytest.mark.parametrize("pname", ["start_box", "point", "start_point"])
def test_point_parameter_names(pname):
    assert one(f"Action: click({pname}='<point>5 6</point>')") == Action("click", {"start_box": (5.0, 6.0)})


def test_drag_end_point_alias():
    a = one("Action: drag(start_point='<point>1 2</point>', end_point='<point>3 4</point>')")
    assert a.args == {"start_box": (1.0, 2.0), "end_box": (3.0, 4.0)}


def test_sections_and_multiple_actions():
    text = (
        "Reflection: the last click missed.\n"
        "Action_Summary: click the search box and type.\n"
        "Thought: I will click the box,\nthen type.\n"
        "Action: click(start_box='(10,20)')\n\n"
        "type(content='cats\\n')\n\n"
        "hotkey(key='enter')"
    )
    r = parse_response(text)
    assert r.reflection == "the last click missed."
    assert r.summary == "click the search box and type."
    assert r.thought == "I will click the box,\nthen type."
    assert [a.name for a in r.actions] == ["click", "type", "hotkey"]
    assert r.actions[1].args["content"] == "cats\n"  # trailing \n: press Enter


def test_escaped_quotes_and_newlines():
    a = one("Action: type(content='He said \\'hi\\' and \\\"bye\\\"\\nnext')")
    assert a.args["content"] == "He said 'hi' and \"bye\"\nnext"
    b = one('Action: type(content="double \\" quoted")')
    assert b.args["content"] == 'double " quoted'


def test_unescaped_apostrophe_inside_text():
    assert one("Action: type(content='it's fine')").args["content"] == "it's fine"


def test_code_fence_around_output():
    assert one("```\nThought: x\nAction: wait()\n```").name == "wait"


def test_positional_argument():
    assert one("Action: hotkey('ctrl v')").args["key"] == "ctrl v"


def test_platform_restriction():
    r = parse_response("Action: press_home()", platform="desktop")
    assert not r and "not available on desktop" in r.reason


# ------------------------------------------------------------------ malformed -> error values


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "empty"),
        ("   \n ", "empty"),
        ("Thought: just thinking", "no 'Action:'"),
        ("Thought: x\nAction:", "empty"),
        ("Action: click(start_box='(1,2)'", "not closed"),  # truncated
        ("Action: click(start_box='(1,2)", "unterminated quote"),  # missing quote
        ("Action: fly(to='moon')", "unknown action 'fly'"),
        ("Action: click(start_box='here')", "cannot read coordinates"),
        ("Action: click(start_box='(-5,10)')", "negative"),
        ("Action: click()", "missing argument 'start_box'"),
        ("Action: click(target='(1,2)')", "unknown argument 'target'"),
        ("Action: scroll(direction='sideways')", "direction must be one of"),
        ("Action: hotkey(key='ctrl banana')", "unknown key 'banana'"),
        ("Action: click", "expected '('"),
        ("Action: click(start_box='(1,2)' end_box='(3,4)')", "cannot read coordinates"),
        ("Action: click(start_box=(1,2)> )", "expected ',' or ')'"),
        ("Action: click(start_box='(1,2)', start_box='(3,4)')", "given twice"),
    ],
)
def test_malformed_gives_error_value(text, needle):
    r = parse_response(text)
    assert isinstance(r, ParseError), r
    assert needle in r.reason, r.reason
    assert r.raw == text


def test_non_text_is_an_error_not_an_exception():
    assert isinstance(parse_response(None), ParseError)
    assert isinstance(parse_response(b"Action: wait()"), ParseError)


def test_out_of_range_coordinates_are_an_error_after_normalizing():
    r = parse_normalized("Action: click(start_box='(5000,10)')", "smart-resize", 1920, 1080)
    assert isinstance(r, ParseError) and "outside" in r.reason
    r = parse_normalized("Action: click(start_box='(1001,10)')", "relative1000", 1920, 1080)
    assert isinstance(r, ParseError) and "outside" in r.reason


def test_normalized_point():
    r = parse_normalized("Action: click(start_box='(500,250)')", "relative1000", 1920, 1080)
    assert r.actions[0].args["start_box"] == (0.5, 0.25)


# ------------------------------------------------------------------ round trips

@pytest.mark.parametrize("text,action", GOLDEN)
def test_format_then_parse_golden(text, action):
    assert one(f"Action: {format_action(action)}") == action


_texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_coord = st.integers(min_value=0, max_value=4000).map(float)
_point = st.tuples(_coord, _coord)
# chords in their one spelling (agent.actions.canonical_keys), which is what parsing gives back
_keys = st.lists(st.sampled_from(["ctrl", "alt", "shift", "enter", "a", "z", "1", "f5", "tab"]), min_size=1,
                 max_size=3).map(" ".join).map(canonical_keys)


@st.composite
def actions(draw):
    spec = draw(st.sampled_from(sorted(REGISTRY.values(), key=lambda s: s.name)))
    args = {}
    for p in spec.params:
        if not p.required and not draw(st.booleans()):
            continue
        if p.kind == "point":
            args[p.name] = draw(_point)
        elif p.kind == "key":
            args[p.name] = draw(_keys)
        elif p.kind == "direction":
            args[p.name] = draw(st.sampled_from(["up", "down", "left", "right"]))
        elif p.kind == "app":
            args[p.name] = draw(st.text(alphabet="abcdefgh XYZ", min_size=1, max_size=10).filter(str.strip))
        else:
            args[p.name] = draw(_texts)
    return Action(spec.name, args)


@settings(max_examples=400, deadline=None)
@given(st.lists(actions(), min_size=1, max_size=3), st.text(alphabet="abc XYZ.,'\"()=\n", max_size=30))
def test_random_actions_survive_format_then_parse(acts, thought):
    thought = thought.strip()
    for a in acts:
        assert validate(a, normalized=False) is None
    r = parse_response(format_response(thought, acts))
    assert r, r.reason
    assert r.actions == acts
    assert r.thought == thought


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_parser_never_raises(text):
    r = parse_response("Thought: x\nAction: " + text)
    assert r or isinstance(r, ParseError)


def test_system_prompt_lists_the_registry():
    p = system_prompt("Open the settings", "desktop")
    for name in ("click", "left_double", "right_single", "drag", "hotkey", "type", "scroll", "wait", "finished", "call_user"):
        assert f"\n{name}(" in p
    assert "press_home(" not in p and "Open the settings" in p
    m = system_prompt("x", "android")
    assert "press_home()" in m and "open_app(app_name='')" in m and "left_double(" not in m


def test_parse_point_reports_reason():
    assert isinstance(parse_point("nowhere"), str)
    assert parse_point("<bbox>0 0 10 20</bbox>") == (5.0, 10.0)


# ---------------------------------------------------------------- hostile and real-world outputs


def test_malformed_box_with_long_whitespace_runs_parses_in_linear_time():
    """A reply that made the box patterns backtrack for 32 s (nested optional separators over
    whitespace) is refused at once."""
    import time

    text = "Thought: x\nAction: click(start_box='(1" + " " * 200 + "1" + " " * 200 + "1" + " " * 200 + "x')"
    t0 = time.perf_counter()
    out = parse_response(text)
    assert time.perf_counter() - t0 < 0.1
    assert not out and "cannot read coordinates" in out.reason
    assert parse_response("Action: click(start_box='(1 ,    2)')").actions[0].args["start_box"] == (1.0, 2.0)


@pytest.mark.parametrize("text,thought,actions", [
    # 'Action:' in the middle of a line, as in UI-TARS-desktop's own fixtures
    ("点击登录按钮 Action: click(start_box='(200,300,400,500)')", "", [("click", {"start_box": (300.0, 400.0)})]),
    ("Thought: I'll open it. Action: click(start_box='(10,20)')", "I'll open it.", [("click", {"start_box": (10.0, 20.0)})]),
    # unescaped quotes inside type content, which UI-TARS's reference parser repairs
    ("Thought: t\nAction: type(content='I said 'yes', then left')", "t", [("type", {"content": "I said 'yes', then left"})]),
    ("Thought: t\nAction: type(content='print('hi')')", "t", [("type", {"content": "print('hi')"})]),
    ("Thought: t\nAction: type(content='it's')\n\nhotkey(key='enter')", "t",
     [("type", {"content": "it's"}), ("hotkey", {"key": "enter"})]),
    # key names other tools write
    ("Action: hotkey(key='arrowdown')", "", [("hotkey", {"key": "down"})]),
    ("Action: hotkey(key='ArrowLeft')", "", [("hotkey", {"key": "left"})]),
    ("Action: hotkey(key='pgdn')", "", [("hotkey", {"key": "pagedown"})]),
    ("Action: hotkey(key='page down')", "", [("hotkey", {"key": "pagedown"})]),
    ("Action: hotkey(key='Shift+Control+T')", "", [("hotkey", {"key": "ctrl shift t"})]),
    # Reflection / Action_Summary replies: the summary is the thought
    ("Reflection: the menu did not open\nAction_Summary: click Settings again\nAction: click(start_box='(5,5)')",
     "click Settings again", [("click", {"start_box": (5.0, 5.0)})]),
    ("Action_Summary: press enter\nAction: hotkey(key='return')", "press enter", [("hotkey", {"key": "enter"})]),
])
def test_real_model_outputs_parse_as_ui_tars_parses_them(text, thought, actions):
    out = parse_response(text)
    assert out, out
    assert out.thought == thought
    assert [(a.name, a.args) for a in out.actions] == actions


def test_a_quote_followed_by_a_real_next_argument_still_closes_the_value():
    out = parse_response("Action: scroll(start_box='(1,2)', direction='down')")
    assert out.actions[0].args == {"start_box": (1.0, 2.0), "direction": "down"}
    out = parse_response("Action: type(content='a, b', )")
    assert out.actions[0].args == {"content": "a, b"}


@pytest.mark.parametrize("key", ["control w", "Control+Q", "shift del", "ctrl alt del", "option f4", "alt ctrl delete",
                                 "shift control delete", "command q",
                                 # issue 38: repeated keys, left/right modifiers, close/quit chords of all three platforms
                                 "ctrl w w", "ctrl f4", "ctrl shift w", "ctrl shift q", "w ctrl", "lctrl w", "ctrl_r+q",
                                 "rightctrl f4", "Control_L Shift_R W", "ctrlleft w", "alt_l f4", "ctrl a w",
                                 "cmd option w", "cmd shift w", "super q", "meta q", "win shift q", "lcmd q",
                                 "command alt escape", "cmd backspace delete"])
def test_hotkeys_spelled_otherwise_are_as_risky_as_the_listed_ones(key):
    from agent.actions import is_risky

    assert is_risky(Action("hotkey", {"key": key}))
    parsed = parse_response(f"Action: hotkey(key='{key}')")
    assert is_risky(parsed.actions[0])
    assert not is_risky(Action("hotkey", {"key": "ctrl c"}))


@pytest.mark.parametrize("key", ["ctrl c", "ctrl v", "ctrl a", "ctrl z", "ctrl shift t", "ctrl t", "alt tab", "cmd tab",
                                 "enter", "ctrl enter", "shift tab", "delete", "ctrl delete", "ctrl alt t", "cmd c",
                                 "w", "f4", "ctrl s"])
def test_everyday_hotkeys_are_not_risky(key):
    from agent.actions import is_risky

    assert not is_risky(Action("hotkey", {"key": key}))
    assert not is_risky(parse_response(f"Action: hotkey(key='{key}')").actions[0])


@pytest.mark.parametrize("text,canonical", [("ctrl w w", "ctrl w"), ("w ctrl ctrl", "ctrl w"), ("lctrl rshift w", "ctrl shift w"),
                                            ("Control_L+Alt_R+Delete", "ctrl alt delete"), ("leftalt f4", "alt f4"),
                                            ("super_l q", "win q"), ("rcmd q", "cmd q"), ("opt shift a", "alt shift a")])
def test_chords_have_one_spelling_the_parser_hands_on(text, canonical):
    assert canonical_keys(text) == canonical and canonical_keys(canonical) == canonical
    assert one(f"Action: hotkey(key='{text}')").args["key"] == canonical  # what the executor presses


def test_a_reply_with_more_actions_than_the_limit_is_a_parse_error():
    from agent.grammar import MAX_ACTIONS_PER_REPLY

    clicks = ["click(start_box='(10,20)')"] * MAX_ACTIONS_PER_REPLY
    assert len(parse_response("Action: " + "\n\n".join(clicks)).actions) == MAX_ACTIONS_PER_REPLY
    for n in (MAX_ACTIONS_PER_REPLY + 1, 20_000):  # issue 38: 20,000 actions in one reply were accepted
        r = parse_response("Thought: x\nAction: " + "\n\n".join(["type(content='y')"] * n))
        assert isinstance(r, ParseError) and r.reason.startswith(f"the reply holds more than {MAX_ACTIONS_PER_REPLY} actions")


def test_every_destructive_chord_parses_to_itself_and_is_asked_about():
    from agent.actions import DESTRUCTIVE_HOTKEYS, is_risky

    for key in DESTRUCTIVE_HOTKEYS:
        a = one(f"Action: hotkey(key='{key}')")
        assert a.args["key"] == key and is_risky(a)
