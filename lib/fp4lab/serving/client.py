"""Single requests to a running server: SGLang's native ``/generate`` and the OpenAI-style
``/v1/completions``, each timed, with the text and token counts the server returned."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

from fp4lab.core import params
from fp4lab.serving.server import Server


class RequestFailed(RuntimeError):
    """The server answered with an error status, or not at all."""


def _post(url: str, body: dict, timeout_s: float) -> tuple[dict, float]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as exc:
        raise RequestFailed(f"POST {url}: HTTP {exc.code}: {exc.read()[:500]!r}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise RequestFailed(f"POST {url}: {exc}") from None
    return answer, time.perf_counter() - started


def generate(
    server: Server, prompt: str, *, max_new_tokens: int = 16, timeout_s: float = 120.0
) -> dict:
    """Greedy ``/generate``: the text, prompt and completion tokens, and seconds for the request."""
    params.positive("max_new_tokens", max_new_tokens)
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    answer, seconds = _post(server.base_url + "/generate", body, timeout_s)
    meta = answer.get("meta_info", {})
    return {
        "endpoint": "/generate", "prompt": prompt, "text": answer.get("text"), "seconds": seconds,
        "prompt_tokens": meta.get("prompt_tokens"), "completion_tokens": meta.get("completion_tokens"),
    }  # fmt: skip


def complete(
    server: Server, prompt: str, *, max_tokens: int = 16, timeout_s: float = 120.0
) -> dict:
    """Greedy OpenAI-style ``/v1/completions``: the same fields as ``generate``."""
    params.positive("max_tokens", max_tokens)
    body = {
        "model": str(server.config.model_path),
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    answer, seconds = _post(server.base_url + "/v1/completions", body, timeout_s)
    choices, usage = answer.get("choices") or [{}], answer.get("usage") or {}
    return {
        "endpoint": "/v1/completions", "prompt": prompt, "text": choices[0].get("text"), "seconds": seconds,
        "prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens"),
    }  # fmt: skip
