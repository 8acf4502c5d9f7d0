"""vLLM's POST /tokenize and /detokenize, so a client can turn the server's token ids into text."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from flakecheck.serve.chat import encode_messages
from flakecheck.serve.completions import prompt_ids
from flakecheck.serve.errors import bad_request
from flakecheck.serve.schemas import DetokenizeRequest, TokenizeRequest
from flakecheck.serve.state import ServerState

router = APIRouter()


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.serve
    state.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        raise bad_request("send either prompt or messages", "prompt")
    if body.messages is not None:
        ids = encode_messages(state, [m.as_template_input() for m in body.messages])
    elif body.add_special_tokens:
        [ids] = prompt_ids(state, body.prompt)
    else:
        with state.tokenizer_lock:
            ids = list(state.loaded.tokenizer(body.prompt, add_special_tokens=False)["input_ids"])
    return {"count": len(ids), "max_model_len": state.max_context, "tokens": ids}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict[str, Any]:
    state: ServerState = request.app.state.serve
    state.check_model(body.model)
    [ids] = prompt_ids(state, [body.tokens] if body.tokens else [[]], param="tokens")
    with state.tokenizer_lock:
        return {"prompt": state.loaded.tokenizer.decode(ids)}
