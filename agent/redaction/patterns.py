"""Text recognizers for personal data, each a pattern plus a check that cuts false alarms.

    email   local@domain.tld
    phone   international (+CC ...) or national numbers with 9 to 15 digits, or 7+ digits written
            with a leading + or an area code in parentheses; dates, times, versions and IP
            addresses are not phones
    card    13 to 19 digits (spaces or dashes between groups) that pass the Luhn check
    iban    country code, check digits and account, length per country, mod-97 check
    ip      IPv4 (each part 0..255) and IPv6 (parsed by the standard library)
    key     API keys and tokens: well-known prefixes (sk-, ghp_, AKIA, AIza, xoxb-, glpat-, hf_,
            JWTs) and long mixed-case random-looking strings

find_pii(text) returns non-overlapping spans, longest and most specific first. The same
functions run on typed text, thoughts and the text OCR reads off a screenshot.
"""
from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

KINDS = ("email", "phone", "card", "iban", "ip", "key")
PLACEHOLDERS = {k: f"<{k}>" for k in KINDS}
# Priority when spans overlap: the more specific recognizer wins (a card number also looks like a
# phone number; an IBAN contains digit runs).
_PRIORITY = {"key": 0, "email": 1, "iban": 2, "card": 3, "ip": 4, "phone": 5}


@dataclass(frozen=True)
class Span:
    kind: str
    start: int
    end: int  # exclusive
    text: str

    def to_dict(self) -> dict:  # without the text: a record of where, never of what
        return {"kind": self.kind, "start": self.start, "end": self.end}


# ---------------------------------------------------------------- checks
def luhn_ok(digits: str) -> bool:
    """The payment-card checksum over a string of digits."""
    if not digits.isdigit() or len(digits) < 2:
        return False
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
    "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24,
    "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21,
    "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28,
    "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31,
    "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22,
    "SA": 24, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}


def iban_ok(compact: str) -> bool:
    """An IBAN without spaces: known country, its length, and the mod-97 check."""
    s = compact.upper()
    if len(s) < 15 or not s[:2].isalpha() or not s[2:4].isdigit() or not s.isalnum():
        return False
    if _IBAN_LENGTHS.get(s[:2]) != len(s):
        return False
    moved = s[4:] + s[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


def _entropy(s: str) -> float:
    counts = {c: s.count(c) for c in set(s)}
    return -sum(n / len(s) * math.log2(n / len(s)) for n in counts.values())


# ---------------------------------------------------------------- patterns
_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![\w-])")
_CARD = re.compile(r"(?<![\d.-])\d(?:[ -]?\d){12,18}(?![\d-])")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])")
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
_PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,5}\)[ .-]?)?\d{1,8}(?:[ .-]\d{2,8}){0,5}(?![\w])")
_PHONE_BARE = re.compile(r"(?<![\w+])(?:0\d{9,10}|[2-9]\d{2}[2-9]\d{6})(?![\w])")  # 0 + national, or NANP
_DATE = re.compile(r"^\d{4}[-./]\d{1,2}[-./]\d{1,2}$|^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$")
_KEY_PREFIXED = re.compile(
    r"(?<![\w-])(?:"
    r"sk-(?:live-|test-|proj-|ant-)?[A-Za-z0-9_-]{16,}"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}|pk_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}"
    r"|glpat-[A-Za-z0-9_-]{20,}|hf_[A-Za-z0-9]{30,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r")(?![\w-])")
_KEY_GENERIC = re.compile(r"(?<![\w/+.-])[A-Za-z0-9_+/-]{24,}={0,2}(?![\w/+.=-])")


def _digits(s: str) -> str:
    return "".join(c for c in s if c.isdigit())


def _emails(text: str):
    for m in _EMAIL.finditer(text):
        yield Span("email", m.start(), m.end(), m.group())


def _cards(text: str):
    for m in _CARD.finditer(text):
        d = _digits(m.group())
        if 13 <= len(d) <= 19 and luhn_ok(d) and len(set(d)) > 1:
            yield Span("card", m.start(), m.end(), m.group())


def _ibans(text: str):
    for m in _IBAN.finditer(text):
        s = m.group()
        # the account part may run into the next word: try the longest prefix that checks out
        compact = s.replace(" ", "")
        want = _IBAN_LENGTHS.get(compact[:2])
        if want is None or len(compact) < want:
            continue
        n, end = 0, 0
        for c in s:
            end += 1
            n += c != " "
            if n == want:
                break
        if iban_ok(s[:end].replace(" ", "")):
            yield Span("iban", m.start(), m.start() + end, s[:end])


def _ips(text: str):
    for m in _IPV4.finditer(text):
        if all(int(p) <= 255 for p in m.group().split(".")):
            yield Span("ip", m.start(), m.end(), m.group())
    for m in _IPV6.finditer(text):
        s = m.group()
        if s.count(":") < 2 or sum(c.isalnum() for c in s) < 4:
            continue
        try:
            ipaddress.IPv6Address(s)
        except ValueError:
            continue
        yield Span("ip", m.start(), m.end(), s)


def _phones(text: str):
    for m in _PHONE.finditer(text):
        s = m.group().rstrip(" .-")
        d = _digits(s)
        marked = s.startswith("+") or "(" in s
        if not (9 <= len(d) <= 15 or (marked and 7 <= len(d) <= 15)):
            continue
        if _DATE.match(s) or (" " not in s and "-" not in s and "(" not in s and not s.startswith("+") and len(d) > 12):
            continue  # a date, or one long digit run (an id, an amount): not written like a phone
        yield Span("phone", m.start(), m.start() + len(s), s)
    for m in _PHONE_BARE.finditer(text):
        yield Span("phone", m.start(), m.end(), m.group())


def _keys(text: str):
    for m in _KEY_PREFIXED.finditer(text):
        yield Span("key", m.start(), m.end(), m.group())
    for m in _KEY_GENERIC.finditer(text):
        s = m.group()
        classes = sum((any(c.islower() for c in s), any(c.isupper() for c in s), any(c.isdigit() for c in s)))
        if classes == 3 and _entropy(s) >= 3.5:
            yield Span("key", m.start(), m.end(), s)


_RECOGNIZERS = {"email": _emails, "card": _cards, "iban": _ibans, "ip": _ips, "phone": _phones, "key": _keys}


def find_pii(text: str, kinds=KINDS) -> list[Span]:
    """Personal data in `text`: non-overlapping spans in text order. Unknown kinds are refused."""
    unknown = [k for k in kinds if k not in _RECOGNIZERS]
    if unknown:
        raise ValueError(f"unknown kind of personal data {unknown[0]!r}; known: {', '.join(KINDS)}")
    if not text:
        return []
    found = [s for k in kinds for s in _RECOGNIZERS[k](text)]
    found.sort(key=lambda s: (_PRIORITY[s.kind], -(s.end - s.start), s.start))
    kept: list[Span] = []
    for s in found:
        if all(s.end <= k.start or s.start >= k.end for k in kept):
            kept.append(s)
    return sorted(kept, key=lambda s: s.start)


def mask(text: str, spans) -> str:
    """`text` with each span (kind, start, end) replaced by its kind's placeholder, e.g. <card>."""
    out, at = [], 0
    for s in sorted(spans, key=lambda s: s.start):
        if s.start < at:
            raise ValueError(f"spans overlap at {s.start}: {s.to_dict()}")
        if not (0 <= s.start < s.end <= len(text)):
            raise ValueError(f"span {s.to_dict()} lies outside a text of {len(text)} characters")
        out.append(text[at:s.start])
        out.append(PLACEHOLDERS.get(s.kind, "<redacted>"))
        at = s.end
    out.append(text[at:])
    return "".join(out)
