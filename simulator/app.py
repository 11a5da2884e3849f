"""The simulated endpoint as a Starlette app speaking the OpenAI and Ollama wire formats.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models`` (OpenAI-compatible);
``POST /api/chat``, ``GET /api/tags`` (Ollama); ``GET /_stats`` and ``POST /_reset``
(observability for tests and benchmarks, no auth).

Every answer's randomness comes from (config seed, model name, sha256 of the prompt text,
per-(model, prompt) request counter), so identical request sequences give identical answers
whatever else is interleaved. The prompt is the text between the lines
``--- BEGIN PROMPT ---`` and ``--- END PROMPT ---`` of the last user message (the whole
message if the markers are absent); its annotations are the true structure.
All state (caches, counters, stats) lives in the ``SimState`` of one app instance.

Streaming (``"stream": true``; Ollama's default): OpenAI server-sent events (a role chunk, the
reasoning then answer in ``stream_chunk_chars`` pieces, a ``finish_reason`` chunk, a usage chunk
when ``stream_options.include_usage``, ``data: [DONE]``) or Ollama NDJSON (pieces, then the
``done`` line with the counts), paced ``stream_chunk_interval_ms`` apart; the latency draw is the
wait before the first chunk, and ``stall_prob`` pauses ``stall_s`` after the first token.
Gateway behaviours: each 429 carries the ``retry_after_headers`` forms (``retry-after`` seconds
or date, ``retry-after-ms``, ``x-ratelimit-reset-*`` Go durations, ``llm_provider-retry-after``);
``unknown_model_status = 400`` answers an unknown model as LiteLLM does; ``context_tokens`` makes
a longer prompt a 400 worded as llama-cpp-python words it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import hashlib
import hmac
import json
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from storage.annotations import AnnotationSet, parse_annotations
from simulator.config import SimConfig, SimModel
from simulator.model import (
    apply_token_budget,
    count_tokens,
    inferred_pool,
    reasoning_text,
    render_answer,
    simulate_ir,
)

BEGIN_MARKER = "--- BEGIN PROMPT ---"
END_MARKER = "--- END PROMPT ---"


def extract_prompt(message: str) -> str:
    """The text between the marker lines, or the whole message when they are absent."""
    lines = message.split("\n")
    stripped = [ln.strip() for ln in lines]
    if BEGIN_MARKER in stripped:
        start = stripped.index(BEGIN_MARKER) + 1
        end = stripped.index(END_MARKER, start) if END_MARKER in stripped[start:] else len(lines)
        return "\n".join(lines[start:end])
    return message


def go_duration(seconds: float) -> str:
    """``seconds`` as a Go ``time.Duration`` string, the form of OpenAI's
    ``x-ratelimit-reset-*`` headers: ``20ms``, ``1s``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds < 1:
        return f"{round(seconds * 1000, 3):g}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = f"{int(hours)}h" if hours else ""
    if hours or minutes:
        out += f"{int(minutes)}m"
    return out + f"{round(secs, 3):g}s"


def retry_after_headers(forms: tuple[str, ...], retry_after_s: float, now_s: float) -> dict[str, str]:
    """The 429 headers for each form in ``forms`` (``simulator.config.RetryAfterForm``)."""
    ra = retry_after_s
    seconds = str(int(ra)) if float(ra).is_integer() else f"{ra:g}"
    headers: dict[str, str] = {}
    for form in forms:
        if form == "retry-after":
            headers["Retry-After"] = seconds
        elif form == "retry-after-date":  # HTTP-dates have whole seconds: round up, never early
            headers["Retry-After"] = email.utils.formatdate(math.ceil(now_s + ra), usegmt=True)
        elif form == "retry-after-ms":
            headers["retry-after-ms"] = str(int(ra * 1000))
        elif form in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"):
            headers[form] = go_duration(ra)
        elif form == "llm_provider-retry-after":
            headers["llm_provider-retry-after"] = seconds
    return headers


def _int_of(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


@dataclass
class ModelStats:
    requests: int = 0
    by_status: Counter = field(default_factory=Counter)
    arrivals_s: list[float] = field(default_factory=list)
    # one [arrived_s, replied_s, status, client_port] per request, in reply order: replied_s is
    # when the handler returned (a 429's headers are sent right after), on the same clock
    exchanges: list[list[float | int]] = field(default_factory=list)


@dataclass
class SimState:
    """Mutable per-app state. ``truth_cache`` is keyed by (model, prompt sha256)."""

    truth_cache: dict[tuple[str, str], tuple[AnnotationSet, list[str]]] = field(default_factory=dict)
    prompt_counters: dict[tuple[str, str], int] = field(default_factory=dict)
    model_requests: Counter = field(default_factory=Counter)
    unknown_requests: Counter = field(default_factory=Counter)  # requests naming no configured model
    stats: dict[str, ModelStats] = field(default_factory=dict)

    def reset(self) -> None:
        self.prompt_counters.clear()
        self.model_requests.clear()
        self.unknown_requests.clear()
        self.stats.clear()


class _Reject(Exception):
    """A non-2xx answer: status, message, machine code, extra headers."""

    def __init__(self, status: int, message: str, code: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


_OPENAI_TYPES = {401: "authentication_error", 404: "invalid_request_error", 410: "invalid_request_error",
                 429: "rate_limit_error", 400: "invalid_request_error"}


def _error_response(fmt: str, rej: _Reject) -> Response:
    if fmt == "openai":
        body: Any = {"error": {"message": rej.message, "type": _OPENAI_TYPES.get(rej.status, "server_error"),
                               "param": None, "code": rej.code}}
    else:
        body = {"error": rej.message}
    return JSONResponse(body, status_code=rej.status, headers=rej.headers)


@dataclass(frozen=True)
class _Answer:
    content: str
    reasoning: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    answer_id: str
    elapsed_ns: int
    stall_s: float = 0.0  # a streamed answer pauses this long after its first chunk
    chunk_chars: int = 16
    chunk_interval_s: float = 0.0


class SimApp:
    """Builds the Starlette app. ``wall_clock``/``monotonic``/``sleep`` are injectable."""

    def __init__(
        self,
        config: SimConfig,
        *,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        truth_cache_max_entries: int = 10_000,
    ) -> None:
        self.config = config
        self.state = SimState()
        self._wall_clock, self._monotonic, self._sleep = wall_clock, monotonic, sleep
        self._cache_max = truth_cache_max_entries
        self._model_ints = {name: _int_of(name) for name in config.models}
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self.openai_chat, methods=["POST"]),
            Route("/v1/models", self.openai_models, methods=["GET"]),
            Route("/api/chat", self.ollama_chat, methods=["POST"]),
            Route("/api/tags", self.ollama_tags, methods=["GET"]),
            Route("/_stats", self.stats, methods=["GET"]),
            Route("/_reset", self.reset, methods=["POST"]),
        ])

    # ---- helpers -------------------------------------------------------------------------
    def _check_auth(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        given = header[7:] if header[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(given.encode("utf-8"), key.encode("utf-8")):
            # Never echo the key (expected or given).
            raise _Reject(401, "Missing or invalid API key: send 'Authorization: Bearer <key>' with the "
                               "simulator's configured api_key.", "invalid_api_key")

    def _truth(self, name: str, p: SimModel, sha: str, prompt: str) -> tuple[AnnotationSet, list[str]]:
        """Parsed annotations and this model's inferred pool, cached per (model, prompt sha)."""
        hit = self.state.truth_cache.get((name, sha))
        if hit is None:
            if len(self.state.truth_cache) >= self._cache_max:
                self.state.truth_cache.clear()  # bounded memory; re-parsing is cheap
            truth = parse_annotations(prompt)
            hit = self.state.truth_cache[(name, sha)] = (truth, inferred_pool(truth, f"prompt-{sha[:12]}", p))
        return hit

    def _record_arrival(self, model: str, at_s: float) -> ModelStats:
        """Count a request of ``model`` that reached the handler at monotonic ``at_s``."""
        st = self.state.stats.setdefault(model, ModelStats())
        st.requests += 1
        st.arrivals_s.append(at_s)
        return st

    async def _body(self, request: Request) -> dict:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _Reject(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
        if not isinstance(body, dict):
            raise _Reject(400, "request body must be a JSON object", "invalid_body")
        return body

    @staticmethod
    def _user_text(body: dict) -> str:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise _Reject(400, "'messages' must be a non-empty list", "invalid_messages")
        users = [m for m in msgs if isinstance(m, dict) and m.get("role") == "user"]
        content = (users or msgs)[-1].get("content", "") if isinstance((users or msgs)[-1], dict) else ""
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise _Reject(400, "message content must be a string", "invalid_messages")
        return content

    @staticmethod
    def _budget(value: Any, name: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Reject(400, f"'{name}' must be an integer, got {value!r}", "invalid_max_tokens")
        return value if value >= 0 else None  # Ollama: -1 = no limit

    def _retired_message(self, name: str, p: SimModel) -> str:
        msg = f"The model '{name}' was retired"
        if p.retired_on:
            msg += f" on {p.retired_on}"
        if p.retirement_reference:
            msg += f" (reference {p.retirement_reference})"
        msg += "."
        if p.replacement_model:
            msg += f" Use '{p.replacement_model}' instead."
        return msg

    def _model_for(self, body: dict) -> tuple[str, SimModel]:
        """The requested model, counted; raises ``_Reject`` for an unknown or retired one."""
        name = body.get("model")
        if not isinstance(name, str) or name not in self.config.models:
            self.state.unknown_requests[str(name)] += 1
            if self.config.unknown_model_status == 400:  # a gateway (LiteLLM's wording)
                raise _Reject(400, f"Invalid model name passed in model={name}. Call `/v1/models` to view "
                                   "available models for your key.", "400")
            raise _Reject(404, f"The model '{name}' does not exist on this endpoint.", "model_not_found")
        p = self.config.models[name]
        self.state.model_requests[name] += 1
        if p.retired_after_requests is not None and self.state.model_requests[name] > p.retired_after_requests:
            raise _Reject(410, self._retired_message(name, p), "model_retired")
        return name, p

    async def _answer(self, body: dict, max_tokens: int | None, reasoning_on: bool, structured: bool) -> _Answer:
        """The shared request path after auth and body parsing. Raises ``_Reject``."""
        t0 = time.perf_counter_ns()
        name, p = self._model_for(body)
        message = self._user_text(body)
        prompt_tokens = count_tokens(message, p.chars_per_token)
        if p.context_tokens is not None and prompt_tokens >= p.context_tokens:
            # llama-cpp-python's server words it this way (llama_cpp/server/errors.py)
            completion = max_tokens or 0
            raise _Reject(400, f"This model's maximum context length is {p.context_tokens} tokens. However, you "
                               f"requested {prompt_tokens + completion} tokens ({prompt_tokens} in the messages, "
                               f"{completion} in the completion). Please reduce the length of the messages or "
                               "completion.", "context_length_exceeded")
        prompt = extract_prompt(message)
        sha = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        key = (name, sha)
        counter = self.state.prompt_counters.get(key, 0)
        self.state.prompt_counters[key] = counter + 1
        # One generator per answer, seeded by (seed, model, prompt, counter); the failure draws
        # come first and are always made, so content draws do not depend on failure settings.
        rng = np.random.default_rng([self.config.seed, self._model_ints[name], int(sha, 16), counter])
        u = rng.random(5)
        if u[0] < p.rate_limit_prob:
            raise _Reject(429, f"Rate limit reached for model '{name}'; retry after {p.retry_after_s:g} s.",
                          "rate_limited", retry_after_headers(p.retry_after_headers, p.retry_after_s,
                                                              self._wall_clock()))
        if u[1] < p.server_error_prob:
            status = 500 if u[2] < 0.5 else 503
            raise _Reject(status, f"Simulated server error {status} for model '{name}'.", "server_error")
        delay_s = 0.0
        if p.latency_ms_median > 0:
            z = float(np.sqrt(-2.0 * np.log(max(u[4], 1e-300))) * np.cos(2.0 * np.pi * u[2]))  # Box-Muller N(0,1)
            delay_s = p.latency_ms_median * math.exp(p.latency_sigma * z) / 1000.0
        if u[3] < p.hang_prob:
            delay_s += p.hang_s
        truth, pool = self._truth(name, p, sha, prompt)
        ir = simulate_ir(truth, f"prompt-{sha[:12]}", p, rng, pool=pool)
        reasoning = reasoning_text(p, rng) if reasoning_on else ""
        text = render_answer(ir, p, rng, structured=structured)
        out = apply_token_budget(text, reasoning, max_tokens, p.chars_per_token)
        # stalls draw from their own generator so every other draw stays as it was
        stalls = p.stall_prob > 0 and np.random.default_rng(
            [self.config.seed, self._model_ints[name], int(sha, 16), counter, 1]).random() < p.stall_prob
        # the latency counts from the request's arrival here: the answer's own building (and,
        # with 1,000 requests open, the loop's turn) is inside it, not added to it
        delay_s -= (time.perf_counter_ns() - t0) / 1e9
        if delay_s > 0:
            await self._sleep(delay_s)
        return _Answer(out.content, out.reasoning, out.finish_reason, prompt_tokens,
                       out.completion_tokens, out.reasoning_tokens, f"{counter}-{sha[:12]}-{name}",
                       time.perf_counter_ns() - t0, p.stall_s if stalls else 0.0, p.stream_chunk_chars,
                       p.stream_chunk_interval_ms / 1000.0)

    async def _paced(self, a: _Answer, frames: list[bytes], first_token: int) -> AsyncIterator[bytes]:
        """Yield the frames of a streamed answer ``chunk_interval_s`` apart, with the stall (if
        any) right after frame ``first_token`` (the first carrying a token)."""
        for i, frame in enumerate(frames):
            if i == first_token + 1 and a.stall_s > 0:
                await self._sleep(a.stall_s)
            elif i > 0 and a.chunk_interval_s > 0:
                await self._sleep(a.chunk_interval_s)
            yield frame

    @staticmethod
    def _pieces(a: _Answer) -> list[tuple[str, str]]:
        """``(kind, text)`` chunks, reasoning first, each at most ``chunk_chars`` long."""
        n = a.chunk_chars
        return ([("reasoning", a.reasoning[i:i + n]) for i in range(0, len(a.reasoning), n)]
                + [("content", a.content[i:i + n]) for i in range(0, len(a.content), n)])

    async def _serve(self, request: Request, fmt: str, build: Callable[[dict], Awaitable[Response]]) -> Response:
        st: ModelStats | None = None
        # the arrival is when the request reached us, before its body is read: a starved
        # simulator must not make a rate window look fuller than it was on the wire
        arrived_s = self._monotonic()
        try:
            body = await self._body(request)
            name = body.get("model")
            st = self._record_arrival(name if isinstance(name, str) else "<missing>", arrived_s)
            self._check_auth(request)
            resp = await build(body)
        except _Reject as rej:
            resp = _error_response(fmt, rej)
        if st is None:
            st = self._record_arrival("<invalid>", arrived_s)
        st.by_status[resp.status_code] += 1
        st.exchanges.append([arrived_s, self._monotonic(), resp.status_code,
                             request.client.port if request.client else 0])
        return resp

    def _served(self, name: str) -> dict[str, str]:
        """The served-identity fields of an OpenAI answer of model ``name``."""
        p = self.config.models[name]
        out = {"model": p.served_model or name}
        if p.system_fingerprint is not None:
            out["system_fingerprint"] = p.system_fingerprint
        return out

    # ---- OpenAI --------------------------------------------------------------------------
    async def openai_chat(self, request: Request) -> Response:
        async def build(body: dict) -> Response:
            mt = body.get("max_completion_tokens", body.get("max_tokens"))
            rf = body.get("response_format")
            structured = isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema")
            a = await self._answer(body, self._budget(mt, "max_tokens"), True, structured)
            usage = {"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
                     "total_tokens": a.prompt_tokens + a.completion_tokens,
                     "completion_tokens_details": {"reasoning_tokens": a.reasoning_tokens}}
            if body.get("stream"):
                return self._openai_stream(body, a, usage)
            message: dict[str, Any] = {"role": "assistant", "content": a.content}
            if a.reasoning:
                message["reasoning_content"] = a.reasoning
            return JSONResponse({
                "id": f"chatcmpl-{a.answer_id}", "object": "chat.completion",
                "created": int(self._wall_clock()), **self._served(body["model"]),
                "choices": [{"index": 0, "message": message, "finish_reason": a.finish_reason}],
                "usage": usage,
            })
        return await self._serve(request, "openai", build)

    def _openai_stream(self, body: dict, a: _Answer, usage: dict) -> Response:
        """Server-sent events as OpenAI sends them: a role chunk, one chunk per piece, a chunk
        with ``finish_reason``, the usage chunk (``stream_options.include_usage``), ``[DONE]``."""
        head = {"id": f"chatcmpl-{a.answer_id}", "object": "chat.completion.chunk",
                "created": int(self._wall_clock()), **self._served(body["model"])}

        def event(choices: list, **extra: Any) -> bytes:
            return b"data: " + json.dumps({**head, "choices": choices, **extra}).encode() + b"\n\n"

        frames = [event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])]
        for kind, text in self._pieces(a):
            key = "reasoning_content" if kind == "reasoning" else "content"
            frames.append(event([{"index": 0, "delta": {key: text}, "finish_reason": None}]))
        frames.append(event([{"index": 0, "delta": {}, "finish_reason": a.finish_reason}]))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            frames.append(event([], usage=usage))
        frames.append(b"data: [DONE]\n\n")
        return StreamingResponse(self._paced(a, frames, 1), media_type="text/event-stream")

    async def openai_models(self, request: Request) -> Response:
        try:
            self._check_auth(request)
        except _Reject as rej:
            return _error_response("openai", rej)
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "irbench-sim"}
                for n, p in self.config.models.items() if p.listed]
        return JSONResponse({"object": "list", "data": data})

    # ---- Ollama --------------------------------------------------------------------------
    async def ollama_chat(self, request: Request) -> Response:
        async def build(body: dict) -> Response:
            options = body.get("options") or {}
            if not isinstance(options, dict):
                raise _Reject(400, "'options' must be an object", "invalid_options")
            a = await self._answer(body, self._budget(options.get("num_predict"), "options.num_predict"),
                                   body.get("think") is not False, bool(body.get("format")))
            message: dict[str, Any] = {"role": "assistant", "content": a.content}
            if a.reasoning:
                message["thinking"] = a.reasoning
            created = dt.datetime.fromtimestamp(self._wall_clock(), dt.UTC).isoformat().replace("+00:00", "Z")
            eval_ns = max(a.elapsed_ns - 1, 0)
            served = self.config.models[body["model"]].served_model or body["model"]
            final = {"model": served, "created_at": created, "message": message, "done": True,
                     "done_reason": a.finish_reason, "total_duration": a.elapsed_ns, "load_duration": 0,
                     "prompt_eval_count": a.prompt_tokens, "prompt_eval_duration": 1,
                     "eval_count": a.completion_tokens, "eval_duration": eval_ns}
            if body.get("stream", True) is False:
                return JSONResponse(final)
            # Ollama streams by default: one line per piece, then the final (empty) done line.
            lines = []
            for kind, text in self._pieces(a):
                msg = {"role": "assistant", "content": "", "thinking": text} if kind == "reasoning" else \
                    {"role": "assistant", "content": text}
                lines.append(json.dumps({"model": body["model"], "created_at": created, "message": msg,
                                         "done": False}).encode() + b"\n")
            final_chunk = {**final, "message": {"role": "assistant", "content": ""}}
            lines.append(json.dumps(final_chunk).encode() + b"\n")
            return StreamingResponse(self._paced(a, lines, 0), media_type="application/x-ndjson")
        return await self._serve(request, "ollama", build)

    async def ollama_tags(self, request: Request) -> Response:
        try:
            self._check_auth(request)
        except _Reject as rej:
            return _error_response("ollama", rej)
        models = [{"name": n, "model": n, "modified_at": "2026-01-01T00:00:00Z", "size": 0,
                   "digest": p.served_digest or hashlib.sha256(n.encode()).hexdigest(),
                   "details": {"format": "sim", "family": "irbench-sim", "parameter_size": "0B",
                               "quantization_level": "none"}}
                  for n, p in self.config.models.items() if p.listed]
        return JSONResponse({"models": models})

    # ---- observability -------------------------------------------------------------------
    async def stats(self, request: Request) -> Response:
        """``{"now_s": monotonic, "models": {name: {requests, by_status{"200": n}, arrivals_s[],
        exchanges[[arrived_s, replied_s, status, client_port]]}}}``."""
        models = {n: {"requests": s.requests, "by_status": {str(k): v for k, v in sorted(s.by_status.items())},
                      "arrivals_s": list(s.arrivals_s), "exchanges": [list(e) for e in s.exchanges]}
                  for n, s in self.state.stats.items()}
        return JSONResponse({"now_s": self._monotonic(), "models": models})

    async def reset(self, request: Request) -> Response:
        self.state.reset()
        return JSONResponse({"reset": True})


def create_app(config: SimConfig, **kwargs: Any) -> Starlette:
    """A fresh Starlette app (with its own state) for ``config``; kwargs go to ``SimApp``."""
    return SimApp(config, **kwargs).app
