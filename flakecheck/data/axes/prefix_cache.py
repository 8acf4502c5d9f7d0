"""Prefix cache: a prompt reuses the keys and values an earlier prompt with the same first blocks computed,
instead of recomputing them (so a case's numbers can depend on which prompt wrote its prefix)."""

from __future__ import annotations

from typing import Any

from flakecheck.data.axes.base import Axis, AxisField, AxisFix, Pricer, boolean, boolean_text, renamed

PREFIX_SAMPLE = 16  # prompts prefilled twice to price the prefix cache (a serial prefill is slow on a CPU)


def _price(pricer: Pricer, compositions: Any) -> dict[str, tuple[float | None, str]]:
    """The first PREFIX_SAMPLE prompts in the arrival order of each composition that caches prefixes, prefilled
    with and without the cache; the share of prompt tokens the cache served is stated."""
    cached = [c for c in compositions if c.prefix_cache]
    if not cached:
        return {}
    seconds = {True: 0.0, False: 0.0}
    hits = prompts = 0
    for composition in cached:
        for use_cache in (False, True):
            took, hit, prompt = pricer.prefill(composition, enable_prefix_caching=use_cache)
            seconds[use_cache] += took
            if use_cache:
                hits, prompts = hits + hit, prompts + prompt
    factor = seconds[False] / seconds[True]
    names = ", ".join(c.name for c in cached)
    return {"no_prefix_cache": (
        factor, f"the prefix cache served {hits / max(prompts, 1):.0%} of the prompt tokens of {names} ({hits} of "
                f"{prompts}, the first {PREFIX_SAMPLE} prompts in arrival order); prefilling them without it took "
                f"{factor:.2f}x as long ({seconds[False]:.1f} vs {seconds[True]:.1f} s)")}


AXIS = Axis(
    name="prefix_cache", label="prefix cache", rank=40,
    fields=(AxisField("prefix_cache", "bool", False, boolean, boolean_text, example=True),),
    name_part=lambda c: "p" if c.prefix_cache else None,
    engine=lambda c: {"enable_prefix_caching": c.prefix_cache},
    present=lambda c, reference: c.prefix_cache,
    absent=lambda c: f"{c.name} has no prefix cache",
    strip=lambda c, reference: {"prefix_cache": False},
    pair=lambda d, reference: (renamed(d, "nocache", prefix_cache=False), d),
    couples_cases=lambda c: c.prefix_cache,  # a case reads the keys and values other prompts wrote
    fixes=(AxisFix("no_prefix_cache", "no prefix cache", "--no-enable-prefix-caching", "--disable-radix-cache",
                   changes=lambda c, reference: {"prefix_cache": False}),),
    price=_price,
    probe_args=lambda c: ["--prefix"] if c.prefix_cache else [],
)
