"""Request bodies of the OpenAI API (and the vLLM extensions a probe uses), validated by pydantic.

Unknown fields are ignored, as vLLM does. Fields that would change the answer if silently ignored
(sampling temperature, penalties, logit bias, n > 1, echo, structured output, tools: see
`UNSUPPORTED_EXTENSIONS`) are refused by `check_greedy`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flakecheck.serve.errors import APIError, bad_request

# The engine records the top-2 candidates of every step (greedy top-1 and the runner-up).
MAX_TOP_LOGPROBS = 2
# Extensions (OpenAI's and vLLM's) that would change or add to the answer, with their neutral values:
# any other value is refused rather than silently ignored.
UNSUPPORTED_EXTENSIONS: dict[str, tuple[object, ...]] = {
    "response_format": (None, {"type": "text"}), "tools": (None, []), "functions": (None, []),
    "min_tokens": (None, 0), "stop_token_ids": (None, []), "bad_words": (None, []), "allowed_token_ids": (None,),
    "guided_json": (None,), "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
    "structured_outputs": (None,), "logits_processors": (None,), "prompt_logprobs": (None, 0),
    "length_penalty": (None, 1, 1.0), "use_beam_search": (None, False),
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The fields chat and completions requests share."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None  # absent: the one served model
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None  # accepted; decoding is greedy, so it changes nothing
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = None  # irrelevant under greedy decoding
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM extensions
    return_tokens_as_token_ids: bool = False  # logprob tokens as "token_id:N"
    cache_salt: str | None = None  # requests with different salts never share prefix-cache blocks
    ignore_eos: bool = False
    repetition_penalty: float | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(s == "" for s in stops):
            raise bad_request("stop strings must not be empty", "stop")
        return tuple(stops)

    def check_greedy(self) -> None:
        if self.temperature not in (None, 0):
            raise bad_request(
                f"temperature {self.temperature} is not supported: this server decodes greedily (temperature 0), "
                "the setting whose run-to-run variance flakecheck studies; send temperature 0 or omit it",
                "temperature", "unsupported_value")
        if self.n != 1:
            raise bad_request("n must be 1: greedy decoding gives one answer per prompt", "n", "unsupported_value")
        for name, neutral in (("presence_penalty", 0), ("frequency_penalty", 0), ("repetition_penalty", 1)):
            if getattr(self, name) not in (None, neutral):
                raise bad_request(f"{name} is not supported (it would change the greedy answer)", name,
                                  "unsupported_value")
        if self.logit_bias:
            raise bad_request("logit_bias is not supported (it would change the greedy answer)", "logit_bias",
                              "unsupported_value")
        for name, neutral in UNSUPPORTED_EXTENSIONS.items():
            value = (self.model_extra or {}).get(name)
            if not any(value == n and type(value) is type(n) for n in neutral):
                raise bad_request(f"{name} is not supported by this server", name, "unsupported_value")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed when stream is true", "stream_options")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text"]
    text: str


# The roles the OpenAI chat API defines; any other (a typo, "wizard") is a 400 naming messages.N.role, never
# passed to the chat template, which would render it as if it meant something.
ChatRole = Literal["system", "developer", "user", "assistant", "tool", "function"]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: ChatRole
    content: str | list[TextPart] | None = None

    def as_template_input(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": self.role, "content": content or ""}


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens

    def top_n(self) -> int | None:
        """How many alternatives per token to return, or None for no logprobs."""
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
        if not self.logprobs:
            return None
        n = self.top_logprobs or 0
        _check_top(n, "top_logprobs")
        return n

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def top_n(self) -> int | None:
        if self.logprobs is not None:
            _check_top(self.logprobs, "logprobs")
        return self.logprobs

    def check_greedy(self) -> None:
        super().check_greedy()
        if self.echo:
            raise bad_request("echo is not supported", "echo", "unsupported_value")
        if self.suffix:
            raise bad_request("suffix is not supported", "suffix", "unsupported_value")
        if self.best_of not in (None, 1):
            raise bad_request("best_of must be 1: greedy decoding gives one answer per prompt", "best_of",
                              "unsupported_value")


def _check_top(n: int, param: str) -> None:
    if n > MAX_TOP_LOGPROBS:
        raise bad_request(
            f"{param} {n} is more than this server records: the engine keeps the top {MAX_TOP_LOGPROBS} "
            f"candidates of every token (the greedy choice and the runner-up); ask for at most {MAX_TOP_LOGPROBS}",
            param, "unsupported_value")


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", "model", "model_not_found")


class TokenizeRequest(BaseModel):
    """vLLM's POST /tokenize: a raw prompt, or chat messages through the chat template."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    """vLLM's POST /detokenize: token ids back to text (special tokens kept)."""

    model_config = ConfigDict(extra="allow", strict=True)
    model: str | None = None
    tokens: list[int]
