"""An OpenAI-compatible chat-completions endpoint (vLLM, SGLang or hosted) with screenshots.

Images travel as base64 data URLs. Only the newest `max_images` screenshots are sent (vLLM
refuses more than its --limit-mm-per-prompt); older ones become a short text marker. Network
errors, timeouts, 429 and 5xx are retried with exponential backoff; other HTTP errors are not
(a wrong model name will not fix itself). Uses the standard library's urllib: httpx is not a
dependency of this project.
"""
from __future__ import annotations

import base64
import json
import math
import urllib.error
import urllib.request

from agent.policies.base import Policy, PolicyError
from agent.retry import Backoff, retry

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class _Transient(Exception):
    """A failed request worth another try (the network, a timeout, a status in RETRY_STATUS)."""


class EndpointPolicy(Policy):
    name = "endpoint"

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout: float = 60.0,
                 retries: int = 3, backoff: float = 1.0, max_images: int = 5, max_tokens: int = 512,
                 temperature: float = 0.0, image_format: str = "jpeg", extra_body: dict | None = None, **kw):
        super().__init__(version=kw.pop("version", None) or f"endpoint:{model}", **kw)
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if max_images < 1:
            raise ValueError(f"max_images must be at least 1 (the current screenshot), got {max_images}")
        self.url = base_url.rstrip("/") + ("" if base_url.rstrip("/").endswith("/chat/completions") else "/chat/completions")
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_images = max_images
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.image_format = image_format
        self.extra_body = extra_body or {}
        self.last_request: dict | None = None

    # ---------------------------------------------------------------- request
    def to_openai(self, messages: list[dict]) -> list[dict]:
        """Neutral messages -> OpenAI chat messages, keeping only the newest max_images screenshots."""
        n_images = sum(1 for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")
        skip = max(0, n_images - self.max_images)
        out = []
        for m in messages:
            c = m["content"]
            if isinstance(c, str):
                out.append({"role": m["role"], "content": c})
                continue
            parts = []
            for p in c:
                if p["type"] == "text":
                    parts.append({"type": "text", "text": p["text"]})
                elif skip > 0:
                    skip -= 1
                    parts.append({"type": "text", "text": "(an earlier screenshot, omitted)"})
                else:
                    data, mime = p["frame"].encode(self.image_format)
                    url = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
                    parts.append({"type": "image_url", "image_url": {"url": url}})
            out.append({"role": m["role"], "content": parts})
        return out

    def generate(self, messages: list[dict]) -> str:
        body = {"model": self.model, "messages": self.to_openai(messages), "max_tokens": self.max_tokens,
                "temperature": self.temperature, **self.extra_body}
        self.last_request = body
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"

        def once() -> str:
            req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    return self._content(r.read())
            except urllib.error.HTTPError as e:
                detail = e.read()[:300].decode("utf-8", errors="replace")
                if e.code in RETRY_STATUS:
                    raise _Transient(f"HTTP {e.code} from {self.url}: {detail}") from None
                raise PolicyError(f"HTTP {e.code} from {self.url}: {detail}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                raise _Transient(f"cannot reach {self.url}: {getattr(e, 'reason', e)}") from None

        try:  # delays backoff, 2 x backoff, 4 x backoff, ...
            return retry(once, attempts=self.retries + 1, backoff=Backoff(self.backoff, math.inf, 2.0, jitter=0.0),
                         retry_if=lambda e: isinstance(e, _Transient))
        except _Transient as e:
            raise PolicyError(f"{e} (gave up after {self.retries + 1} attempts)") from None

    def _content(self, payload: bytes) -> str:
        try:
            d = json.loads(payload)
            content = d["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise PolicyError(f"{self.url} answered something that is not a chat completion: {payload[:200]!r}") from None
        if isinstance(content, list):  # some servers return content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if content is None:
            return ""  # an empty answer is a bad output (re-asked), not a transport failure
        return str(content)
