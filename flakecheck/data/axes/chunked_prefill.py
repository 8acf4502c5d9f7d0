"""Chunked prefill: a prompt prefilled `chunk` tokens a step (its prefill shares steps with other sequences'
decodes), instead of whole in one step."""

from __future__ import annotations

from typing import Any

from flakecheck.data.axes.base import Axis, AxisField, AxisFix, Pricer, optional_integer, optional_integer_text, renamed


def _price(pricer: Pricer, compositions: Any) -> dict[str, tuple[float | None, str]]:
    """One step prefilling the suite's longest prompt whole vs one chunk of it: the longest a decode sharing
    that step waits (the tokens computed are the same, so throughput barely moves)."""
    chunks = sorted({c.chunk for c in compositions if c.chunk is not None})
    if not chunks:
        return {}
    chunk, longest = chunks[0], pricer.longest_prompt()
    if longest <= chunk:
        return {"no_chunked_prefill": (1.0, f"no prompt is longer than the {chunk}-token chunk: nothing is split")}
    step_s = pricer.step_seconds({"whole": (1, longest, longest), "chunk": (1, chunk, longest)})
    factor = step_s["whole"] / step_s["chunk"]
    return {"no_chunked_prefill": (factor, f"the longest prompt ({longest} tokens) prefilled in one step takes "
                                           f"{step_s['whole'] * 1e3:.0f} ms instead of {step_s['chunk'] * 1e3:.0f} "
                                           f"ms for a {chunk}-token chunk ({factor:.1f}x): decodes sharing that step "
                                           "wait that long; the tokens computed are the same")}


def _note(c: Any) -> str:
    if not c.chunk:
        return ""
    return (f"\nThe divergent composition prefills in chunks of {c.chunk} tokens: start the server with the same "
            f"budget (vLLM: --enable-chunked-prefill --max-num-batched-tokens {c.chunk}).\n")


AXIS = Axis(
    name="chunked_prefill", label="chunked prefill", rank=30,
    fields=(AxisField("chunk", "int | None", None, optional_integer, optional_integer_text,
                      lambda v: None if v is None or v >= 1 else f"chunk must be >= 1 (or none), got {v}",
                      example=16),),
    name_part=lambda c: None if c.chunk is None else f"c{c.chunk}",
    engine=lambda c: {"max_num_batched_tokens": c.chunk},
    present=lambda c, reference: c.chunk is not None,
    absent=lambda c: f"{c.name} prefills whole prompts",
    strip=lambda c, reference: {"chunk": None},
    pair=lambda d, reference: (renamed(d, "whole", chunk=None), d),
    fixes=(AxisFix("no_chunked_prefill", "no chunked prefill", "--no-enable-chunked-prefill",
                   "--chunked-prefill-size -1", changes=lambda c, reference: {"chunk": None}),),
    price=_price,
    repro_note=_note,
)

