"""A mixture of experts' routing in a response, where vLLM puts it (`--enable-return-routed-experts`): a
choice's `routed_experts`, base64 `.npy` [tokens, layers, k]. serve returns the rows that chose each generated
token (vLLM returns the prompt's rows before them too: a reader takes the last rows either way). A dense model's
choices carry no such field."""

from __future__ import annotations

from typing import Any

from flakecheck.data.routing import encode_routed_experts
from flakecheck.serve.engine_loop import Update


def routed_experts_field(update: Update) -> dict[str, Any]:
    """{"routed_experts": ...} for a choice of a mixture of experts that generated tokens, else {}."""
    if not update.routed_experts:
        return {}
    return {"routed_experts": encode_routed_experts(update.routed_experts)}
