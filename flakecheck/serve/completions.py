"""POST /v1/completions: raw prompts (a string, token ids, or a list of either), greedy decoding."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from flakecheck.engine import encode_prompt
from flakecheck.serve.access_log import GENERATION
from flakecheck.serve.engine_loop import Update
from flakecheck.serve.errors import bad_request
from flakecheck.serve.generation import Generation, plan_prompt
from flakecheck.serve.logprobs import completion_logprobs
from flakecheck.serve.routed_experts import routed_experts_field
from flakecheck.serve.schemas import CompletionRequest
from flakecheck.serve.state import ServerState
from flakecheck.serve.streaming import stream_response

router = APIRouter()
DEFAULT_MAX_TOKENS = 16  # what OpenAI's (and vLLM's) completions endpoint generates when none is asked


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    state: ServerState = request.app.state.serve
    state.check_model(body.model)
    body.check_greedy()
    top_n = body.top_n()
    prompts = [plan_prompt(state, ids, body.max_tokens, DEFAULT_MAX_TOKENS, "prompt")
               for ids in prompt_ids(state, body.prompt)]
    gen = Generation(state, "cmpl", prompts, body)
    setattr(request.state, GENERATION, gen)  # the access log's id and token counts
    head = {"id": gen.id, "object": "text_completion", "created": int(time.time()), "model": state.model_id,
            "system_fingerprint": state.fingerprint}
    as_id = body.return_tokens_as_token_ids
    gen.start()
    if body.stream:
        offsets: dict[int, int] = {}  # where each choice's next token starts in its text
        chunk_head = {**head, "usage": None} if body.include_usage else head

        def chunk(index: int, update: Update, delta: str) -> dict[str, Any] | None:
            if not delta and not update.last and (top_n is None or not update.token_ids):
                return None
            logprobs = None
            if top_n is not None:
                logprobs = completion_logprobs(update, state.texts, top_n, as_id, offsets.get(index, 0))
                offsets[index] = offsets.get(index, 0) + sum(len(state.texts.text(t)) for t in update.token_ids)
            choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": update.finish_reason}
            return {**chunk_head, "choices": [choice]}

        usage = (lambda: {**chunk_head, "choices": [], "usage": gen.usage()}) if body.include_usage else None
        return stream_response(gen, chunk, [], usage)

    results = await gen.collect(request)
    choices = [{"index": i, "text": r.text or "", "finish_reason": r.finish_reason,
                "logprobs": None if top_n is None else completion_logprobs(r, state.texts, top_n, as_id),
                **routed_experts_field(r)}
               for i, r in enumerate(results)]
    return {**head, "choices": choices, "usage": gen.usage()}


def prompt_ids(state: ServerState, prompt: str | list[str] | list[int] | list[list[int]],
               param: str = "prompt") -> list[list[int]]:
    """One token-id list per prompt; token ids are checked against the vocabulary."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise bad_request(f"{param} must not be an empty list", param)
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]  # type: ignore[list-item]  # one prompt given as token ids
    vocab = state.loaded.config.vocab_size
    out = []
    for p in prompt:
        if isinstance(p, str):
            with state.tokenizer_lock:
                out.append(encode_prompt(state.loaded, p))
            continue
        bad = next((t for t in p if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param)
        out.append(list(p))
    return out
