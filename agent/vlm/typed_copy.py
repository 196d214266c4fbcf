"""Typed text copied from the instruction: a type action's content becomes the instruction's quoted
text nearest what the model wrote.

Why: the default model (2 layers, 128 wide, trained from scratch) cannot copy a string it has not
seen in training. On held-out tasks its thoughts and type actions write other fields' words and
mixed fragments ("Enter 'it ship at draft' as the Username" -> type(content='world draft')), so
type_text, form and search_chain stayed at 0% even when the right field was clicked. Copying is an
induction-style circuit that forms late in training (the same wall the pointer over element-list
entries gets around for clicks). An instruction that wants text typed quotes it ('Trent',
'walter@mail.com'); the actor keeps the model's decision to type and where, and writes the quoted
string whose characters are closest to the model's attempt (difflib's ratio; the first on a tie).

The rewritten reply is what the env runs and what the learner scores: its tokens from the content
on are tokenized again, carry log-prob 0 from the actor (forced, like the pointer's digits), and
PPO gives them the learner's own log-probs as behaviour (copied_from, as the pointer's
rewritten_from). A reply whose content already is a quoted string, or an instruction that quotes
nothing, is left as it is. Applied with the pointer head (models trained with element lists).
"""
from __future__ import annotations

import difflib
import re

from agent.grammar import escape_text
from agent.vlm.pointer import QUOTED_RE, instruction_text, token_texts

CONTENT_RE = re.compile(r"content='((?:[^'\\]|\\.)*)'")
DOUBLE_QUOTED_RE = re.compile(r'"([^"\n]{1,60}?)"')  # MiniWoB++'s and many people's: Enter "Jerald" ...


def unescape(s: str) -> str:
    """The grammar's escapes (agent.grammar.escape_text) undone."""
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t", "r": "\r"}.get(m.group(1), m.group(1)), s)


def quoted(instruction: str) -> list[str]:
    """The strings the instruction quotes ('single' or "double"), in order, each once."""
    out: list[str] = []
    found = sorted([*QUOTED_RE.finditer(instruction), *DOUBLE_QUOTED_RE.finditer(instruction)], key=lambda m: m.start())
    for m in found:
        if m.group(1) not in out:
            out.append(m.group(1))
    return out


def nearest(candidates: list[str], written: str) -> str:
    """The candidate whose characters are closest to `written` (the first on a tie)."""
    return max(candidates, key=lambda c: difflib.SequenceMatcher(None, c, written).ratio())  # max keeps the first


def copy_reply(reply: str, instruction: str) -> tuple[str, int] | None:
    """(the reply with its first type content replaced by the nearest quoted string, the character
    where the content starts), or None when there is nothing to replace."""
    spans = quoted(instruction)
    m = CONTENT_RE.search(reply)
    if not spans or m is None:
        return None
    written = unescape(m.group(1))
    if written in spans:
        return None
    pick = escape_text(nearest(spans, written))
    return reply[:m.start(1)] + pick + reply[m.end(1):], m.start(1)


def _token_at(texts: list[str], at: int) -> tuple[int, int]:
    """(the index of the token holding character `at` of the joined texts, where that token starts)."""
    start, k = 0, 0
    while k < len(texts) and start + len(texts[k]) <= at:
        start += len(texts[k])
        k += 1
    return k, start


def apply_to_generation(tokenizer, prompt_ids, reply_ids, reply_lps) -> tuple[list[int], list[float]] | None:
    """A generated reply with its type content copied from the instruction: (ids, log-probs), the
    tokens from the one holding the content's first character on tokenized again with log-prob 0;
    None when nothing changes."""
    texts = token_texts(tokenizer, reply_ids)
    reply = "".join(texts)
    if not CONTENT_RE.search(reply):  # most replies type nothing: the prompt is not read for them
        return None
    got = copy_reply(reply, instruction_text(tokenizer, prompt_ids))
    if got is None:
        return None
    new, at = got
    k, start = _token_at(texts, at)
    tail = list(tokenizer(new[start:], add_special_tokens=False)["input_ids"])
    return list(reply_ids[:k]) + tail, list(reply_lps[:k]) + [0.0] * len(tail)


def copied_from(tokenizer, ids, n_prompt: int) -> int | None:
    """The reply index of the token holding the first character of a type content that is one of
    the instruction's quoted strings (a copy, or the model's own writing of it), or None: PPO gives
    the tokens from there the learner's log-probs as behaviour (trainer.learn.ppo)."""
    ids = [int(i) for i in ids]
    texts = token_texts(tokenizer, ids[n_prompt:])
    m = CONTENT_RE.search("".join(texts))
    if m is None or unescape(m.group(1)) not in quoted(instruction_text(tokenizer, ids[:n_prompt])):
        return None
    return _token_at(texts, m.start(1))[0]
