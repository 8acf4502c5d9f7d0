"""A generated token's choice of experts as a trace keeps it: one 64-bit digest of the experts every sparse layer
chose for the row that produced the token (the same digest whether the engine recorded them or a server
returned them), and the first step at which two traces' choices differ — a routing divergence.

On the wire (vLLM's `--enable-return-routed-experts`, and `flakecheck serve` for a mixture of experts) a
choice's `routed_experts` is a base64 `.npy` integer array [rows, layers, k]: vLLM's rows are every forwarded
position (prompt and generated tokens but the last), serve's only the rows that chose each generated token;
either way the last rows, one per generated token, are those that chose them.

A layer's choice is a set: the same k experts ranked in another order run the same experts (only the weights
they are combined with move, which is rounding), so each layer's experts are sorted before they are digested.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from collections.abc import Sequence

import numpy as np


def routing_digest(experts: Sequence[Sequence[int]]) -> int:
    """A signed 64-bit digest of one token's experts, per sparse layer in layer order."""
    text = ";".join(",".join(map(str, sorted(layer))) for layer in experts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def routing_divergence(reference: Sequence[int] | None, other: Sequence[int] | None) -> int | None:
    """The first step whose digests differ, over the steps both traces have; None when they agree there or
    either trace carries no routing (a dense model, a server that returns none)."""
    if not reference or not other:
        return None
    return next((step for step, (a, b) in enumerate(zip(reference, other)) if a != b), None)


def encode_routed_experts(experts: Sequence[Sequence[Sequence[int]]]) -> str:
    """[rows, layers, k] experts as the base64 `.npy` text vLLM returns in a choice's `routed_experts`."""
    buffer = io.BytesIO()
    np.save(buffer, np.asarray(experts, dtype=np.int32), allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_routed_experts(text: object) -> list[list[list[int]]]:
    """A choice's `routed_experts` back to [rows, layers, k] integers. ValueError saying what is wrong."""
    if not isinstance(text, str):
        raise ValueError(f"'routed_experts' is a {type(text).__name__}, not base64 .npy text")
    try:
        array = np.load(io.BytesIO(base64.b64decode(text, validate=True)), allow_pickle=False)
    except (binascii.Error, ValueError, OSError) as exc:
        raise ValueError(f"'routed_experts' is not base64 .npy data: {exc}") from None
    if array.ndim != 3 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"'routed_experts' is a {array.ndim}-D {array.dtype} array, not [tokens, layers, k] integers")
    return array.tolist()


def generated_digests(rows: Sequence[Sequence[Sequence[int]]], generated: int) -> list[int] | None:
    """One digest per generated token from a server's routed-experts rows (the last `generated` rows); None
    when there are fewer rows than tokens or no tokens."""
    if generated == 0 or len(rows) < generated:
        return None
    return [routing_digest(row) for row in rows[len(rows) - generated:]]
