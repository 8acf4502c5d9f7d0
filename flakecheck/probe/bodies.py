"""The JSON bodies a probe sends: greedy, with the top-2 logprobs of every token.

Isolation `salt` (the default) keeps requests from reusing each other's cached prompt KV: a
unique `cache_salt` per request (vLLM: cached blocks are shared only between requests with the
same salt) and `cache_prompt: false` (llama.cpp's per-request switch). Servers that know neither
field ignore it; a strict one that rejects them needs `--isolation none`, and then its prefix
cache must be turned off on the server (vLLM `--no-enable-prefix-caching`, SGLang
`--disable-radix-cache`) or a probe measures the cache along with the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flakecheck.data.input_format import AppliedFormat, resolve_inputs
from flakecheck.data.suite import Messages, Suite

APIS = ("chat", "completions")
ISOLATIONS = ("salt", "none")


@dataclass(frozen=True)
class CasePrompt:
    """One case as the server is sent it."""

    case_id: str
    api: str  # chat | completions
    prompt: str | Messages
    max_tokens: int
    stop: tuple[str, ...] = ()  # the case's stop sequences, sent as the request's `stop`


@dataclass(frozen=True)
class BodyOptions:
    model: str
    isolation: str = "salt"
    token_ids: bool = True  # vLLM's return_tokens_as_token_ids; dropped for a server that rejects it


def completion_body(options: BodyOptions, api: str, prompt: str | Messages, max_tokens: int, *,
                    salt: str | None, share_cache: bool = False, logprobs: bool = True,
                    stop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A greedy request; `salt` names the requests allowed to share cached prefixes (None: the server's
    default); `share_cache` lets llama.cpp reuse its slot's cache (the prefix level's warm-up pair)."""
    body: dict[str, Any] = {"model": options.model, "max_tokens": max_tokens, "temperature": 0, "n": 1,
                            "stream": False}
    if stop:
        body["stop"] = list(stop)
    if api == "chat":
        body["messages"] = prompt
        if logprobs:
            body.update(logprobs=True, top_logprobs=2)
    else:
        body["prompt"] = prompt
        if logprobs:
            body["logprobs"] = 2
    if logprobs and options.token_ids:
        body["return_tokens_as_token_ids"] = True
    if options.isolation == "salt":
        if salt is not None:
            body["cache_salt"] = salt
        body["cache_prompt"] = share_cache
    return body


# --api as the input convention of flakecheck.data.input_format: chat sends every case as chat messages,
# completions every case as raw text; unset, `prompt` strings are raw and everything else is chat.
INPUT_FORMAT_OF_API = {None: "auto", "chat": "chat", "completions": "raw"}


def case_prompts(suite: Suite, api: str | None, max_tokens: int) -> tuple[list[CasePrompt], AppliedFormat]:
    """Each case as it is sent, by the suite's input convention (a server is taken to have a chat
    template: one without answers the chat check request with an error), and what was applied."""
    prompts, applied = resolve_inputs(suite, INPUT_FORMAT_OF_API[api], has_chat_template=True)
    cases = [CasePrompt(case.id, "chat" if isinstance(prompts[case.id], list) else "completions", prompts[case.id],
                        case.max_tokens or max_tokens, case.stop) for case in suite.cases]
    return cases, applied
