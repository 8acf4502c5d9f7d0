"""POST /v1/chat/completions: messages through the model's chat template, greedy decoding."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from jinja2 import TemplateError

from flakecheck.engine import encode_prompt
from flakecheck.serve.access_log import GENERATION
from flakecheck.serve.engine_loop import Update
from flakecheck.serve.errors import bad_request
from flakecheck.serve.generation import Generation, plan_prompt
from flakecheck.serve.logprobs import chat_logprobs
from flakecheck.serve.routed_experts import routed_experts_field
from flakecheck.serve.schemas import ChatCompletionRequest
from flakecheck.serve.state import ServerState
from flakecheck.serve.streaming import stream_response

router = APIRouter()


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    state: ServerState = request.app.state.serve
    state.check_model(body.model)
    body.check_greedy()
    top_n = body.top_n()
    ids = encode_messages(state, [m.as_template_input() for m in body.messages])
    gen = Generation(state, "chatcmpl", [plan_prompt(state, ids, body.requested_max_tokens(), None, "messages")], body)
    setattr(request.state, GENERATION, gen)  # the access log's id and token counts
    head = {"id": gen.id, "object": "chat.completion", "created": int(time.time()), "model": state.model_id,
            "system_fingerprint": state.fingerprint}

    def logprobs(update: Update) -> dict[str, Any] | None:
        if top_n is None:
            return None
        return {"content": chat_logprobs(update, state.texts, top_n, body.return_tokens_as_token_ids)}

    gen.start()
    if body.stream:
        chunk_head = {**head, "object": "chat.completion.chunk"}
        if body.include_usage:
            chunk_head["usage"] = None

        def chunk(index: int, update: Update, delta: str) -> dict[str, Any] | None:
            if not delta and not update.last and (top_n is None or not update.token_ids):
                return None
            choice = {"index": index, "delta": {"content": delta} if delta else {},
                      "logprobs": logprobs(update), "finish_reason": update.finish_reason}
            return {**chunk_head, "choices": [choice]}

        first = {**chunk_head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]}
        usage = (lambda: {**chunk_head, "choices": [], "usage": gen.usage()}) if body.include_usage else None
        return stream_response(gen, chunk, [first], usage)

    [result] = await gen.collect(request)
    choice = {"index": 0, "message": {"role": "assistant", "content": result.text or ""},
              "logprobs": logprobs(result), "finish_reason": result.finish_reason, **routed_experts_field(result)}
    return {**head, "choices": [choice], "usage": gen.usage()}


def encode_messages(state: ServerState, messages: list[dict[str, Any]]) -> list[int]:
    if not getattr(state.loaded.tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template: send a raw prompt to /v1/completions", "messages")
    try:
        with state.tokenizer_lock:
            return encode_prompt(state.loaded, messages)
    except (TemplateError, ValueError, TypeError, KeyError) as exc:  # the template's refusal, e.g. of a role
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from exc
