"""Read one OpenAI-style completion answer: the generated tokens with their top-2 logprobs.

Three shapes reach us:

- chat completions: `choices[0].logprobs.content[]`, each `{token, logprob, bytes, top_logprobs[]}`;
- legacy completions: `choices[0].logprobs` = `{tokens[], token_logprobs[], top_logprobs[{token: logprob}]}`;
- llama.cpp's completions: the chat `content[]` shape under `/v1/completions`.

A token is identified by the server's id where it gives one: vLLM's `return_tokens_as_token_ids`
spells tokens "token_id:N", llama.cpp adds an `id` field. Otherwise only its text and bytes are
known, and the caller interns them (flakecheck.probe.vocab).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from flakecheck.data.routing import decode_routed_experts

TOKEN_ID_PLACEHOLDER = re.compile(r"token_id:(\d+)")
# vLLM clamps -inf to this; we do the same so every logprob stays a finite float in parquet.
FLOOR_LOGPROB = -9999.0


class AnswerError(ValueError):
    """The answer is not an OpenAI-style completion with logprobs; the message says what is missing."""


@dataclass(frozen=True)
class TokenRef:
    """A token as the server reported it: its id where known, its text, its bytes where given."""

    id: int | None
    text: str
    raw: bytes | None = None

    @property
    def key(self) -> int | bytes:
        """What makes two reports the same token: the id, else the bytes (else the text's UTF-8)."""
        if self.id is not None:
            return self.id
        return self.raw if self.raw is not None else self.text.encode("utf-8")


@dataclass(frozen=True)
class Step:
    """One generated token and the server's top alternatives at that step (it may list the token itself)."""

    token: TokenRef
    logprob: float
    alternatives: tuple[tuple[TokenRef, float], ...]

    def top2(self) -> tuple[tuple[TokenRef, float], tuple[TokenRef, float] | None]:
        """The best and second-best (token, logprob) among the chosen token and its alternatives.

        On an exact tie the chosen token ranks first: it is the one the server picked."""
        best: dict[int | bytes, tuple[TokenRef, float]] = {self.token.key: (self.token, self.logprob)}
        for ref, logprob in self.alternatives:
            if ref.key not in best or logprob > best[ref.key][1]:
                best[ref.key] = (ref, logprob)
        chosen = self.token.key
        ranked = sorted(best.items(), key=lambda kv: (-kv[1][1], kv[0] != chosen))
        return ranked[0][1], (ranked[1][1] if len(ranked) > 1 else None)


@dataclass(frozen=True)
class Answer:
    """What one request produced."""

    text: str
    steps: list[Step]
    finish_reason: str
    system_fingerprint: str | None
    model: str | None
    # a mixture of experts served with its routing returned (vLLM's --enable-return-routed-experts):
    # [rows, layers, k], the last rows those that chose each generated token (flakecheck.data.routing)
    routed_experts: list[list[list[int]]] | None = None


def parse_answer(body: Any, api: str, with_logprobs: bool = True) -> Answer:
    """An Answer from a decoded JSON body of /v1/chat/completions (api "chat") or /v1/completions;
    `with_logprobs=False` for requests that did not ask for them (their steps are left empty)."""
    if not isinstance(body, dict):
        raise AnswerError(f"expected a JSON object, got {type(body).__name__}")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise AnswerError("no 'choices' list: not an OpenAI-compatible completion")
    choice = choices[0]
    if api == "chat":
        message = choice.get("message")
        if not isinstance(message, dict):
            raise AnswerError("choices[0] has no 'message' object: not a chat completion")
        text = message.get("content") or ""
    else:
        text = choice.get("text")
        if not isinstance(text, str):
            raise AnswerError("choices[0] has no 'text' string: not a completion")
    if not isinstance(text, str):
        raise AnswerError("the answer's content is not a string")
    steps = _steps(choice.get("logprobs")) if with_logprobs else []
    fingerprint = body.get("system_fingerprint")
    model = body.get("model")
    routed = None
    if choice.get("routed_experts") is not None:
        try:
            routed = decode_routed_experts(choice["routed_experts"])
        except ValueError as exc:
            raise AnswerError(f"choices[0]: {exc}") from None
    return Answer(text, steps, str(choice.get("finish_reason") or "unknown"),
                  fingerprint if isinstance(fingerprint, str) else None, model if isinstance(model, str) else None,
                  routed)


def _steps(logprobs: Any) -> list[Step]:
    if logprobs is None:
        raise AnswerError("the answer has no logprobs (the server ignored `logprobs`, or does not support it)")
    if not isinstance(logprobs, dict):
        raise AnswerError("'logprobs' is not an object")
    if "content" in logprobs:  # chat, and llama.cpp's completions
        content = logprobs["content"]
        if content is None:
            content = []
        if not isinstance(content, list):
            raise AnswerError("'logprobs.content' is not a list")
        return [_content_step(entry, i) for i, entry in enumerate(content)]
    if "tokens" in logprobs:
        return _legacy_steps(logprobs)
    raise AnswerError("'logprobs' has neither 'content' nor 'tokens'")


def _content_step(entry: Any, index: int) -> Step:
    if not isinstance(entry, dict):
        raise AnswerError(f"logprobs.content[{index}] is not an object")
    token = _ref(entry, f"logprobs.content[{index}]")
    alternatives = entry.get("top_logprobs")
    if not isinstance(alternatives, list):
        raise AnswerError(f"logprobs.content[{index}] has no 'top_logprobs' list")
    alts = tuple((_ref(alt, f"logprobs.content[{index}].top_logprobs[{k}]"),
                  _logprob(alt.get("logprob"), f"logprobs.content[{index}].top_logprobs[{k}]"))
                 for k, alt in enumerate(alternatives) if isinstance(alt, dict))
    return Step(token, _logprob(entry.get("logprob"), f"logprobs.content[{index}]"), alts)


def _legacy_steps(logprobs: dict[str, Any]) -> list[Step]:
    tokens, values, tops = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
    if not (isinstance(tokens, list) and isinstance(values, list) and len(tokens) == len(values)):
        raise AnswerError("'logprobs.tokens' and 'logprobs.token_logprobs' are not lists of one length")
    if not isinstance(tops, list) or len(tops) != len(tokens):
        raise AnswerError("'logprobs.top_logprobs' is missing or not one entry per token")
    steps = []
    for i, (token, value, top) in enumerate(zip(tokens, values, tops)):
        if not isinstance(token, str):
            raise AnswerError(f"logprobs.tokens[{i}] is not a string")
        if not isinstance(top, dict):
            raise AnswerError(f"logprobs.top_logprobs[{i}] is not an object")
        alts = tuple((_ref({"token": text}, f"logprobs.top_logprobs[{i}]"),
                      _logprob(lp, f"logprobs.top_logprobs[{i}]")) for text, lp in top.items())
        steps.append(Step(_ref({"token": token}, f"logprobs.tokens[{i}]"), _logprob(value, f"logprobs.tokens[{i}]"),
                          alts))
    return steps


def _ref(entry: dict[str, Any], where: str) -> TokenRef:
    text = entry.get("token")
    if not isinstance(text, str):
        raise AnswerError(f"{where} has no 'token' string")
    raw = entry.get("bytes")
    raw_bytes = bytes(raw) if isinstance(raw, list) and all(isinstance(b, int) and 0 <= b < 256 for b in raw) \
        else None
    token_id = entry.get("id")
    if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
        token_id = None
    placeholder = TOKEN_ID_PLACEHOLDER.fullmatch(text)
    if placeholder:
        # vLLM's "bytes" then spell the placeholder itself (no information); a server that sends the
        # token's real bytes beside the placeholder gives us its text too.
        real = raw_bytes if raw_bytes is not None and raw_bytes != text.encode("utf-8") else None
        return TokenRef(int(placeholder.group(1)), text, real)
    return TokenRef(token_id, text, raw_bytes)


def _logprob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AnswerError(f"{where} has no numeric 'logprob'")
    value = float(value)
    if math.isnan(value):
        raise AnswerError(f"{where}: logprob is NaN")
    return max(value, FLOOR_LOGPROB)
