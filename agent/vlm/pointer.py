"""The pointer: which entry of the element list a click goes to, chosen by a small head over the
language model's hidden states instead of written as digits.

Why: a Qwen2.5-VL-class model trained from scratch learns to name the right element but not to turn
attention into coordinate digits (its vision tokens carry no absolute position). With the element
list in the observation (agent.elements), a click becomes one categorical choice among the entries
(GUI-Actor's idea, over list entries instead of patches):

- keys: the last hidden state at each entry's name's last token (the current list, the last one in
  the prompt);
- the query: the last hidden state at the token that ends with `_box='(`, the position whose next
  token would be the first coordinate digit;
- logits: q(query)·k(key)/sqrt(d) + alpha * copy + beta * named, where copy is the cosine between
  the input embeddings of a name the reply's thought quotes ('Save') and each entry's name, so an
  element the thought names exactly is found before any training, and named is 1 where the task's
  instruction holds the entry's name word for word; plus one "no entry" logit (a learned key) for
  positions that are not elements (a slider value, a drop point): the model's own digits stay.

The chosen entry's centre is written as the usual UI-TARS text `click(start_box='(x,y)')`, so replies
parse with agent.grammar as before. The head (about 33k parameters for the default model) is an
attribute of the model (`tandem_pointer`), saved beside the stock checkpoint in its own file; stock
loaders never see it, and the digits stay trained as an auxiliary loss so a server without the head
still writes roughly right coordinates.

Log-probabilities, so PPO and SFT need no new bookkeeping: a reply's token i carries log p(token i)
as before, except at a site's written digits: the first one carries the pointer's log-probability of
its choice, the others 0 (they were forced). With "no entry" chosen, the first digit carries the
pointer's log p(no entry) plus the digit's own, and the digits keep theirs.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from agent.elements import HEADER, Entry, entry_at, parse_block

HEAD_FILE = "pointer_head.safetensors"
ATTR = "tandem_pointer"
QUERY_RE = re.compile(r"_box='\(")
QUOTED_RE = re.compile(r"(?<![A-Za-z])'([^'\n]{1,60}?)'(?![A-Za-z])")  # 'Save', not the ' of "I'll"
DIGITS_RE = re.compile(r"^[0-9, ]+$")
POINT_RE = re.compile(r"^\s*(-?\d+)\s*,\s*(-?\d+)\s*$")
ALPHA0 = 5.0  # the copy feature's starting weight: an entry the thought names exactly wins by ~5 logits at first
BETA0 = 3.0  # the starting weight of "the instruction names this entry" (word for word)
INSTRUCTION = "## User Instruction\n"  # where agent.grammar's prompt puts the task


def head_of(model):
    return getattr(model, ATTR, None)


def _torch():
    import torch

    return torch


def make_head(hidden: int, dim: int = 128):
    """A fresh PointerHead (the class is built on first use: this module imports without torch)."""
    torch = _torch()
    nn = torch.nn

    class PointerHead(nn.Module):
        def __init__(self, hidden: int, dim: int):
            super().__init__()
            self.q = nn.Linear(hidden, dim)
            self.k = nn.Linear(hidden, dim)
            self.none = nn.Parameter(torch.zeros(dim))  # the key of "no entry"
            self.alpha = nn.Parameter(torch.tensor(ALPHA0))
            self.beta = nn.Parameter(torch.tensor(BETA0))
            self.scale = 1.0 / math.sqrt(dim)

        def forward(self, h_query, h_keys, copy, named=None):
            """h_query [Q, H], h_keys [K, H], copy [Q, K], named [K] (1 where the instruction names
            the entry) -> logits [Q, K + 1] (the last: no entry)."""
            q = self.q(h_query.float())
            k = self.k(h_keys.float())
            s = q @ k.T * self.scale + self.alpha * copy.to(q.dtype)
            if named is not None:
                s = s + self.beta * named.to(q.dtype)
            return torch.cat([s, (q @ self.none * self.scale).unsqueeze(-1)], dim=-1)

    return PointerHead(hidden, dim)


def hidden_size(model) -> int:
    cfg = model.config
    text = getattr(cfg, "text_config", None) or cfg
    return int(text.hidden_size)


def attach(model, head=None):
    """Give `model` a pointer head (a fresh one by default) on its device; returns the head."""
    head = head if head is not None else make_head(hidden_size(model))
    head.to(model.device)
    setattr(model, ATTR, head)
    return head


def split_state(state: dict) -> tuple[dict, dict]:
    """(the stock model's weights, the head's weights without its prefix) of a model's state dict."""
    prefix = ATTR + "."
    stock = {k: v for k, v in state.items() if not k.startswith(prefix)}
    head = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    return stock, head


def save_head(head_state: dict, out_dir) -> None:
    from pathlib import Path

    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in head_state.items()}, str(Path(out_dir) / HEAD_FILE))


def load_head(model, model_dir) -> bool:
    """Attach the head saved in `model_dir`, when there is one; True when it was."""
    from pathlib import Path

    path = Path(model_dir) / HEAD_FILE
    if not path.is_file():
        return False
    from safetensors.torch import load_file

    state = load_file(str(path))
    if "q.weight" not in state:
        raise ValueError(f"{path}: not a pointer head (no q.weight)")
    head = make_head(int(state["q.weight"].shape[1]), int(state["q.weight"].shape[0]))
    missing, unexpected = head.load_state_dict(state, strict=False)
    if missing == ["beta"]:  # a head from before the instruction feature: it had none
        with _torch().no_grad():
            head.beta.zero_()
        missing = []
    if missing or unexpected:
        raise ValueError(f"{path}: the pointer head does not fit (missing {missing}, unexpected {unexpected})")
    attach(model, head)
    return True


# ---------------------------------------------------------------- where the entries and queries are

_TEXTS: dict = {}


def token_texts(tokenizer, ids) -> list[str]:
    """Each token's own text (special tokens included), cached per tokenizer and id."""
    cache = _TEXTS.setdefault(id(tokenizer), {})
    out = []
    for i in ids:
        t = cache.get(i)
        if t is None:
            t = cache[i] = tokenizer.decode([i], skip_special_tokens=False)
        out.append(t)
    return out


def _spelled(tokenizer, ids) -> tuple[list[str], list[int], str]:
    """(each token's text, where each starts in the joined text, the joined text)."""
    texts = token_texts(tokenizer, ids)
    starts, at = [], 0
    for t in texts:
        starts.append(at)
        at += len(t)
    return texts, starts, "".join(texts)


@dataclass
class Site:
    """One `_box='(` in a reply: its query position, the written digits' positions and text."""
    query: int
    digits: list[int]
    written: str
    names: list[str] = field(default_factory=list)  # what the thought quotes before it
    choice: int | None = None  # the entry (len(entries): no entry); None: not known
    name_ids: list[list[int]] = field(default_factory=list)  # the names' token ids (the copy feature)

    def point(self) -> tuple[int, int] | None:
        m = POINT_RE.match(self.written)
        return (int(m.group(1)), int(m.group(2))) if m else None


@dataclass
class Layout:
    """What the pointer needs of one token sequence: the current list's entries and the positions
    of their keys, and the reply's sites."""
    entries: list[Entry]
    keys: list[int]
    sites: list[Site]
    name_ids: list[list[int]] = field(default_factory=list)  # each entry's name's token ids
    named: list[float] = field(default_factory=list)  # 1.0 where the instruction names the entry word for word

    @property
    def none(self) -> int:
        return len(self.entries)


def layout(tokenizer, ids, n_prompt: int) -> Layout | None:
    """The layout of prompt ids[:n_prompt] + reply ids[n_prompt:], or None when the prompt holds no
    element list or the reply no site."""
    ids = [int(i) for i in ids]
    texts, starts, text = _spelled(tokenizer, ids)
    prompt_end = starts[n_prompt] if n_prompt < len(ids) else len(text)
    head = text.rfind(HEADER, 0, prompt_end)
    if head < 0:
        return None
    entries = parse_block(text[head:prompt_end], offset=head)
    if not entries:
        return None
    import bisect

    def token_at(c: int) -> int:
        return bisect.bisect_right(starts, c) - 1

    keys = [token_at(e.name_end - 1) if e.name else token_at(e.start) for e in entries]
    reply = text[prompt_end:]
    thought_end = reply.find("Action:")
    thought = reply[:thought_end] if thought_end >= 0 else ""
    names = [m.group(1) for m in QUOTED_RE.finditer(thought)]
    sites = []
    for m in QUERY_RE.finditer(text, prompt_end):
        c = m.end() - 1
        t = token_at(c)
        if starts[t] + len(texts[t]) != c + 1:
            continue  # the '(' does not end its token: no clean place to write digits
        j = t + 1
        while j < len(ids) and DIGITS_RE.match(texts[j]):
            j += 1
        digits = list(range(t + 1, j))
        sites.append(Site(t, digits, "".join(texts[k] for k in digits), names, name_ids=[_ids(tokenizer, n) for n in names]))
    if not sites:
        return None
    return Layout(entries, keys, sites, [_ids(tokenizer, e.name) for e in entries],
                  instruction_names(_instruction(text[:prompt_end]), entries))


def instruction_text(tokenizer, prompt_ids) -> str:
    """The task's instruction in a prompt's token ids ("" without one)."""
    return _instruction(_spelled(tokenizer, [int(i) for i in prompt_ids])[2])


def _instruction(prompt: str) -> str:
    at = prompt.find(INSTRUCTION)
    if at < 0:
        return ""
    rest = prompt[at + len(INSTRUCTION):]
    return rest.split("\n", 1)[0].split("<|im_end|>", 1)[0]


def instruction_names(instruction: str, entries) -> list[float]:
    """Per entry, 1.0 when the instruction holds its name as whole words (case aside), else 0."""
    out = []
    for e in entries:
        name = e.name.strip()
        hit = bool(name) and re.search(r"(?<!\w)" + re.escape(name) + r"(?!\w)", instruction, re.I) is not None
        out.append(1.0 if hit else 0.0)
    return out


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def label_choices(lay: Layout) -> None:
    """Set each site's choice from its written point (the smallest entry holding it; no entry when
    none does): the targets of SFT on a demonstration."""
    for s in lay.sites:
        p = s.point()
        k = entry_at(lay.entries, *p) if p else None
        s.choice = lay.none if k is None else k


def snap_reply(reply: str, entries: list[Entry]) -> str:
    """A demonstration's reply with each point inside an entry moved to that entry's centre, the
    point the pointer writes (so training sequences are the ones generation produces)."""
    def fix(m):
        x, y = int(m.group(1)), int(m.group(2))
        k = entry_at(entries, x, y)
        if k is None:
            return m.group(0)
        cx, cy = entries[k].center
        return f"_box='({cx},{cy})'"

    return re.sub(r"_box='\((-?\d+),(-?\d+)\)'", fix, reply)


def prompt_entries(messages) -> list[Entry]:
    """The entries of the last element list in the neutral chat messages (agent.policies.memory's form)."""
    for m in reversed(messages):
        c = m.get("content")
        parts = [c] if isinstance(c, str) else [p.get("text", "") for p in c or [] if p.get("type") == "text"]
        for t in reversed(parts):
            if t and HEADER in t:
                return parse_block(t)
    return []


# ---------------------------------------------------------------- scores


def _embed(emb, ids):
    torch = _torch()
    if not ids:
        return torch.zeros(emb.shape[1], device=emb.device)
    return emb[torch.tensor(ids, device=emb.device)].detach().float().mean(0)


def copy_features(model, lay: Layout):
    """[Q, K]: per site, the best cosine between a name its thought quotes and each entry's name
    (mean input embeddings; identical strings give 1 whatever the weights)."""
    torch = _torch()
    F = torch.nn.functional
    emb = model.get_input_embeddings().weight
    keys = torch.stack([_embed(emb, ids) for ids in lay.name_ids])
    out = torch.zeros(len(lay.sites), len(lay.entries), device=keys.device)
    for i, s in enumerate(lay.sites):
        if s.name_ids:
            q = torch.stack([_embed(emb, ids) for ids in s.name_ids])
            out[i] = F.cosine_similarity(q.unsqueeze(1), keys.unsqueeze(0), dim=-1).max(0).values
    return out


def site_logits(model, lay: Layout, hidden, offset: int = 0):
    """Logits [Q, K + 1] of the layout's sites from last hidden states `hidden` [T, H] whose row
    0 is the sequence's position `offset` (a forward after a cached prefix starts there)."""
    torch = _torch()
    q = hidden[torch.tensor([s.query - offset for s in lay.sites], device=hidden.device)]
    k = hidden[torch.tensor([p - offset for p in lay.keys], device=hidden.device)]
    named = torch.tensor(lay.named or [0.0] * len(lay.entries), device=hidden.device)
    return head_of(model)(q, k, copy_features(model, lay).to(hidden.device), named)


def site_loss(model, lay: Layout, hidden, offset: int = 0):
    """SFT: the summed cross-entropy of the sites' labelled choices (label_choices)."""
    torch = _torch()
    logits = site_logits(model, lay, hidden, offset)
    target = torch.tensor([s.choice for s in lay.sites], device=logits.device)
    return torch.nn.functional.cross_entropy(logits, target, reduction="sum")


def digit_weights(lay: Layout, aux: float) -> dict[int, float]:
    """Per position, the weight of its digit's cross-entropy: `aux` where the pointer writes the
    digits (they stay trained, so a server without the head still writes roughly right ones)."""
    return {d: aux for s in lay.sites if s.choice is not None and s.choice < lay.none for d in s.digits}


def adjust_logprobs(model, lay: Layout, choices: list[int], hidden, offset: int, flat_of, lp, ent=None,
                    temperature: float = 1.0):
    """A scored reply's per-token log-probs (and entropies) with the pointer's part put in, as this
    module's header defines it: lp/ent are flat tensors, flat_of(position) their index of a
    sequence position. Returns new tensors (the gradient flows through the head and the states)."""
    torch = _torch()
    lpp = torch.log_softmax(site_logits(model, lay, hidden, offset).float() / temperature, dim=-1)
    lp = lp.clone()
    ent = ent.clone() if ent is not None else None
    for i, (s, c) in enumerate(zip(lay.sites, choices, strict=True)):
        first = s.digits[0] if s.digits else s.query + 1
        at = flat_of(first)
        if at is None:
            continue
        h = -(lpp[i].exp() * lpp[i]).sum()
        if c < lay.none:
            lp[at] = lpp[i, c]
            for d in s.digits[1:]:
                j = flat_of(d)
                if j is not None:
                    lp[j] = lp[j].detach() * 0.0
                    if ent is not None:
                        ent[j] = ent[j].detach() * 0.0
            if ent is not None:
                ent[at] = h
        else:
            lp[at] = lp[at] + lpp[i, c]
            if ent is not None:
                ent[at] = ent[at] + h
    return lp if ent is None else (lp, ent)


# ---------------------------------------------------------------- generation: choose and rewrite


def choose(logits, temperature: float, generator=None) -> tuple[list[int], list[float]]:
    """Per row of logits [Q, K + 1]: the choice (argmax at temperature 0, else a sample of
    softmax(logits / T)) and its log-probability under that distribution (T 1 when greedy)."""
    torch = _torch()
    lp = torch.log_softmax(logits.float() / (temperature if temperature > 0 else 1.0), dim=-1)
    if temperature > 0:
        picks = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(1)
    else:
        picks = lp.argmax(-1)
    return picks.tolist(), lp.gather(1, picks.unsqueeze(1)).squeeze(1).tolist()


def rewrite(tokenizer, lay: Layout, n_prompt: int, reply_ids: list[int], reply_lps: list[float],
            choices: list[int], choice_lps: list[float]) -> tuple[list[int], list[float]]:
    """The reply with each site's digits replaced by its chosen entry's centre (ids and per-token
    log-probs as this module's header defines them). Sites are in order; positions are absolute."""
    ids, lps = list(reply_ids), list(reply_lps)
    # right to left, so earlier positions stay valid
    for s, k, klp in sorted(zip(lay.sites, choices, choice_lps, strict=True), key=lambda x: -x[0].query):
        a = s.query + 1 - n_prompt  # the first digit's index in the reply
        b = a + len(s.digits)
        if k >= lay.none:  # no entry: the model's own digits, the choice's log-prob on the first
            if a < len(lps):
                lps[a] += klp
            continue
        cx, cy = lay.entries[k].center
        forced = tokenizer(f"{cx},{cy}", add_special_tokens=False)["input_ids"]
        ids[a:b] = forced
        lps[a:b] = [klp] + [0.0] * (len(forced) - 1)
    return ids, lps


def rewritten_from(lay: Layout, n_prompt: int) -> int | None:
    """The reply index from which a generation's recorded log-probs no longer describe the reply it
    returns: the token after the first site whose digits the pointer wrote. The model sampled the
    tokens after it, and chose any later site from hidden states, in the context of its own digits;
    the reply carries the entry's, so a learner rescoring it sees another context (up to 14 nats
    apart on the token after the digits, measured on the default model). None: nothing rewritten."""
    for s in lay.sites:
        if s.choice is not None and s.choice < lay.none:
            return (s.digits[-1] if s.digits else s.query) + 1 - n_prompt
    return None


def list_start(tokenizer, ids) -> int | None:
    """The token index where the last element list of a prompt starts, or None without one: a
    generation that reuses cached keys and values must compute the list's tokens itself, since the
    head reads their hidden states (agent.vlm.batch)."""
    import bisect

    _, starts, text = _spelled(tokenizer, [int(i) for i in ids])
    at = text.rfind(HEADER)
    return None if at < 0 else bisect.bisect_right(starts, at) - 1


def generated_hidden(out, b: int, row_len: int, width: int):
    """A function: absolute positions of row b -> its last hidden states [n, H], from a
    `generate(..., output_hidden_states=True)` whose input was `width` columns wide with the row's
    row_len tokens right-aligned (left padding, and any cached prefix, before them). None for a
    position whose hidden state this call did not compute (it came from a cache)."""
    torch = _torch()
    prefill = out.hidden_states[0][-1][b]  # the columns this call computed: the last ones
    computed = prefill.shape[0]

    def at(positions):
        rows = []
        for p in positions:
            if p < row_len:
                col = width - row_len + p - (width - computed)
                if col < 0:
                    return None
                rows.append(prefill[col])
            else:
                j = p - row_len  # generated token j is fed back, and its state computed, at step j + 1
                if j + 1 >= len(out.hidden_states):
                    return None
                rows.append(out.hidden_states[j + 1][-1][b, -1])
        return torch.stack(rows)

    return at


def apply_to_generation(model, tokenizer, prompt_ids, reply_ids, reply_lps, hidden_at, temperature: float):
    """Choose an entry for each site of a generated reply and rewrite it: (ids, log-probs, choices),
    or None when the model has no head, the prompt no list or the reply no site."""
    if head_of(model) is None or not reply_ids:
        return None
    n = len(prompt_ids)
    lay = layout(tokenizer, list(prompt_ids) + list(reply_ids), n)
    if lay is None:
        return None
    h = hidden_at(lay.keys + [s.query for s in lay.sites])
    if h is None:
        return None
    torch = _torch()
    hidden = torch.zeros(max(lay.keys + [s.query for s in lay.sites]) + 1, h.shape[-1], device=h.device, dtype=h.dtype)
    hidden[torch.tensor(lay.keys + [s.query for s in lay.sites], device=h.device)] = h
    with torch.no_grad():
        logits = site_logits(model, lay, hidden)
    choices, lps = choose(logits, temperature)
    ids, new_lps = rewrite(tokenizer, lay, n, reply_ids, reply_lps, choices, lps)
    return ids, new_lps, choices
