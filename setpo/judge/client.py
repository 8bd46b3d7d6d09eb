"""Judges over HTTP: any OpenAI-compatible chat endpoint (``vllm serve``, ``transformers serve``, a hosted API).

A judge is any object with ``name`` (its identity in cache keys: model and decoding settings, never a secret),
``concurrency`` (how many requests may be in flight), ``describe()`` (a dict for records, never a secret) and
``reply(messages) -> str | None``, which raises ``JudgeUnavailable`` when the judge cannot be reached (the
evaluation stops, with one clear line) and ``JudgeRejected`` when it refuses one request (that set's score is
missing, not cached). ``OpenAIJudge`` is the HTTP one; ``setpo.judge.backends.TransformersJudge`` runs a chat
model in-process. The ``openai`` client is imported when the first request is made, not with this module.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger("setpo.judge")

#: What the openai client is given when no key is set: vLLM and transformers serve accept any key unless
#: started with one, and the client refuses to start without one.
NO_KEY = "EMPTY"
#: Replies longer than this (characters) are cut before they are parsed or cached: max_tokens bounds an honest
#: server, this bounds a broken one.
MAX_REPLY_CHARS = 65536


class JudgeError(RuntimeError):
    """A judge request failed."""


class JudgeUnavailable(JudgeError):
    """The judge cannot be used (down, too slow, wrong key or model): the evaluation stops."""


class JudgeRejected(JudgeError):
    """The judge refused one request (e.g. too long for its context): that set's score is missing."""


class Judge(Protocol):
    name: str
    concurrency: int

    def describe(self) -> dict: ...

    def reply(self, messages: list[dict]) -> str | None: ...


def redact_url(url: str) -> str:
    """``url`` without user name or password (``https://user:pw@host/v1`` -> ``https://host/v1``)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host, else a ValueError naming it."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"judge URL must look like http://HOST:PORT/v1 (an OpenAI-compatible server), got "
                         f"{redact_url(url) if isinstance(url, str) else url!r}")
    return url.rstrip("/")


def check_api_key(key: str | None, where: str = "the API key") -> str | None:
    """``key`` if an HTTP header can carry it (printable ASCII, no spaces), else a ValueError naming ``where`` it came
    from (never the key itself). None and "" mean no key."""
    if key is not None and not isinstance(key, str):
        raise ValueError(f"{where} must be text, got {type(key).__name__}")
    if key and not all(33 <= ord(c) < 127 for c in key):
        raise ValueError(f"{where} holds characters an HTTP header cannot carry (spaces, line breaks, non-ASCII); "
                         "copy the key again without them")
    return key


def check_positive(name: str, value, kind=float):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")
    if kind is int and int(value) != value:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    return kind(value)


class OpenAIJudge:
    """A judge behind any OpenAI-compatible ``/v1/chat/completions`` endpoint.

    model: the name the server serves (``vllm serve MODEL`` serves it as MODEL). base_url: e.g.
    ``http://127.0.0.1:8000/v1``; default ``$OPENAI_BASE_URL``. api_key: default ``$OPENAI_API_KEY``, else
    none (servers started without ``--api-key`` accept any). Each call gives up after ``timeout`` seconds and is
    tried ``retries`` more times (waits ``retry_wait``·2^i, at most 30 s) after a connection error, a timeout,
    a 408/409/429 or a 5xx; a wrong key (401/403) or model (404) stops at once. At most ``concurrency``
    requests are in flight. Decoding is greedy (temperature 0) with at most ``max_tokens`` tokens.
    The key is kept out of ``repr``, ``describe()``, every log line and every error (and out of any reply that
    echoes it); the URL is recorded without user name or password.
    """

    def __init__(self, model: str | None = None, base_url: str | None = None, api_key: str | None = None, *,
                 timeout: float = 120.0, retries: int = 2, concurrency: int = 8, max_tokens: int = 1024,
                 temperature: float = 0.0, retry_wait: float = 1.0):
        if not isinstance(model, str) or not model.strip():
            raise ValueError("the judge needs a model name: the one the server serves (vllm serve MODEL serves "
                             f"it as MODEL), got {model!r}")
        base_url = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL")
        if not base_url:
            raise ValueError("no judge server: pass base_url (e.g. http://127.0.0.1:8000/v1 for `vllm serve`) or "
                             "set OPENAI_BASE_URL")
        self.base_url = check_url(base_url)
        self.model = model
        self.timeout = check_positive("timeout", timeout)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {retries!r}")
        self.retries = retries
        self.concurrency = check_positive("concurrency", concurrency, int)
        self.max_tokens = check_positive("max_tokens", max_tokens, int)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise ValueError(f"temperature must be a number in [0, 2], got {temperature!r}")
        self.temperature = float(temperature)
        self.retry_wait = float(retry_wait) if retry_wait == 0 else check_positive("retry_wait", retry_wait)
        key = check_api_key(api_key) if api_key is not None else \
            check_api_key(os.environ.get("OPENAI_API_KEY"), "$OPENAI_API_KEY")
        self._api_key = key or NO_KEY
        self._client = None
        self._client_lock = threading.Lock()
        # The identity of the judge for cache keys: what decides its answers, not where it is served from (a
        # restarted server on another port reuses the cache).
        self.name = f"openai:{model}|T={self.temperature:g}|max_tokens={self.max_tokens}"

    def __repr__(self) -> str:
        return f"OpenAIJudge(model={self.model!r}, base_url={redact_url(self.base_url)!r})"

    def describe(self) -> dict:
        return {"backend": "openai", "model": self.model, "base_url": redact_url(self.base_url),
                "temperature": self.temperature, "max_tokens": self.max_tokens, "timeout_s": self.timeout,
                "retries": self.retries, "concurrency": self.concurrency, "name": self.name}

    def redact(self, text: str) -> str:
        """``text`` with the API key replaced by ``***`` (for anything that may end up on screen or disk)."""
        if self._api_key != NO_KEY and self._api_key in text:
            text = text.replace(self._api_key, "***")
        return text

    def _openai(self):
        with self._client_lock:
            if self._client is None:
                from openai import OpenAI  # here, not at import: the core loads no client library

                try:
                    self._client = OpenAI(base_url=self.base_url, api_key=self._api_key, timeout=self.timeout,
                                          max_retries=0)  # retries are ours: counted, logged, one final message
                except Exception as err:  # noqa: BLE001 - what fails here is the environment's proxy/TLS settings
                    detail = self.redact(" ".join(str(err).split()))[:200]
                    raise JudgeUnavailable(
                        f"cannot set up the HTTP client for the judge server ({type(err).__name__}: {detail}); check "
                        "the proxy and TLS variables of the environment (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, "
                        "NO_PROXY, SSL_CERT_FILE)") from None
            return self._client

    def reply(self, messages: list[dict]) -> str | None:
        import openai

        client = self._openai()
        where = redact_url(self.base_url)
        tries = self.retries + 1
        last = "no answer"
        for attempt in range(tries):
            try:
                response = client.chat.completions.create(model=self.model, messages=messages,
                                                          max_tokens=self.max_tokens, temperature=self.temperature)
            except openai.APITimeoutError:
                last = f"no answer within {self.timeout:g} s"
            except openai.APIConnectionError as err:
                cause = err.__cause__ or err
                # a server that answered but closed the connection mid-body (it crashed, a proxy cut it) is retried
                # like one that cannot be reached; the message says which it was
                what = "answer cut off" if type(cause).__name__ == "RemoteProtocolError" else "cannot connect"
                last = f"{what} ({(self.redact(str(cause)).splitlines() or [type(cause).__name__])[0][:200]})"
            except openai.APIStatusError as err:
                status = err.status_code
                body = err.body if isinstance(err.body, dict) else {}
                detail = body["message"] if isinstance(body.get("message"), str) else str(err)
                detail = self.redact(" ".join(detail.split()))[:300]
                if status in (401, 403):
                    raise JudgeUnavailable(
                        f"judge server {where} refused the API key (HTTP {status}); set OPENAI_API_KEY to the key "
                        "the server was started with") from None
                if status == 404:
                    raise JudgeUnavailable(
                        f"judge server {where} has no model {self.model!r} or no /chat/completions (HTTP 404); give "
                        "the model name the server serves and a base URL ending in /v1") from None
                if status in (408, 409, 429) or status >= 500:
                    last = f"HTTP {status}: {detail}"
                else:
                    raise JudgeRejected(f"rejected by the judge server (HTTP {status}): {detail}") from None
            except openai.APIError as err:  # a 200 whose body is not a chat completion
                raise JudgeRejected(f"malformed answer from the judge server: {self.redact(str(err))[:200]}") from None
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):  # a 200 whose body is not JSON:
                # broken, cut short with its length, nested without end, an HTML page sent as JSON (json's error,
                # quoting the body, stays out of records)
                raise JudgeRejected("malformed answer from the judge server (not JSON)") from None
            else:
                return self._content(response)
            if attempt + 1 < tries:
                wait = min(self.retry_wait * 2 ** attempt, 30.0)
                log.warning("judge request to %s failed (%s); try %d of %d in %.2g s", where, last, attempt + 2,
                            tries, wait)
                time.sleep(wait)
        raise JudgeUnavailable(f"judge server {where} is down or too slow: {last} (tried {tries} time"
                               f"{'s' if tries > 1 else ''}, {self.timeout:g} s each); start it or check the URL")

    def _content(self, response) -> str | None:
        try:
            content = response.choices[0].message.content
        except (AttributeError, IndexError, KeyError, TypeError):
            raise JudgeRejected("malformed answer from the judge server (no choices[0].message)") from None
        if content is None:
            return None
        if not isinstance(content, str):
            raise JudgeRejected(f"malformed answer from the judge server (content is {type(content).__name__})")
        return self.redact(content[:MAX_REPLY_CHARS])
