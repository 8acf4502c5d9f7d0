"""A generated token's choice of experts as a trace keeps it: one 64-bit digest of the experts every sparse layer
chose for the row that produced the token (the same digest whether the engine recorded them or a server
returned them), and the first step at which two traces' choices differ — a routing divergence.

A layer's choice is a set: the same k experts ranked in another order run the same experts (only the weights
they are combined with move, which is rounding), so each layer's experts are sorted before they are digested.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


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
