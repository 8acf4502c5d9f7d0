"""What a composition axis declares (one `Axis` a file in this folder), and the value parsers its fields use.

An axis is one scheduling or deployment feature a server may vary between requests of the same suite
(chunked prefill, prefix cache, tensor parallelism, ...). Its file says, in one place:

- its field(s) of a Composition: name, default, how a JSON value and a `--composition` text value become the
  field's value, and what a valid value is;
- the engine knobs it sets (keywords of flakecheck.engine.Knobs) for a composition;
- its mechanism for `explain`: whether a composition has it, the pair of compositions that isolates it, the
  field changes that remove it, and whether it changes the reductions themselves (then every other mechanism
  is replayed with this axis at the reference's setting);
- its candidate fixes (the vLLM and SGLang settings that correspond) and how `explain` prices them, with the
  measuring tools a `Pricer` offers;
- what `repro` writes for it: the `flakecheck probe` options and a README note.

Nothing here imports the engine or the kernels: the declarations are data and small functions over a
Composition; the packages above read them (flakecheck/data/compositions.py builds the Composition's fields,
replay the engine knobs, explain the mechanisms, fixes, prices and repro text).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

Changes = Mapping[str, Any]  # composition field -> value


def integer(key: str, value: Any) -> int:
    """A JSON integer (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {json.dumps(value)}")
    return value


def integer_text(key: str, text: str) -> int:
    if not re.fullmatch(r"-?\d+", text.strip()):
        raise ValueError(f"{key} must be an integer, got {text.strip()!r}")
    return int(text)


def optional_integer(key: str, value: Any) -> int | None:
    return None if value is None else integer(key, value)


def optional_integer_text(key: str, text: str) -> int | None:
    return None if text.strip().lower() in ("none", "null", "") else integer_text(key, text)


def boolean(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {json.dumps(value)}")
    return value


def boolean_text(key: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{key} must be true or false, got {text.strip()!r}")


def string(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {json.dumps(value)}")
    return value


def string_text(key: str, text: str) -> str:
    return text.strip()


@dataclass(frozen=True)
class AxisField:
    """One field of a Composition: its JSON reading (`from_json`: a file's or meta.json's value) and its text
    reading (`from_text`: a `--composition` value), each raising ValueError naming the key; `check` gives the
    error message of an invalid value (None: valid); `example`, a valid value other than the default (the
    tests round-trip it)."""

    name: str
    annotation: str
    default: Any
    from_json: Callable[[str, Any], Any]
    from_text: Callable[[str, str], Any]
    check: Callable[[Any], str | None] = lambda value: None
    example: Any = None


class Pricer(Protocol):
    """The measurements `explain` offers an axis to price its fix with (flakecheck/explain/costs.py)."""

    def prefill(self, composition: Any, **knobs: Any) -> tuple[float, int, int]:
        """The first prompts of `composition`'s arrival order prefilled (one token generated) under the engine
        knobs `composition` sets, overridden by `knobs`: (seconds, prompt tokens a prefix cache served, prompt
        tokens)."""
        ...

    def longest_prompt(self) -> int:
        ...

    def step_seconds(self, shapes: Mapping[str, tuple[int, int, int]]) -> dict[str, float]:
        """Each named engine step (batch, tokens a sequence, context) timed in turns: median seconds."""
        ...


@dataclass(frozen=True)
class AxisFix:
    """A candidate fix: `changes(composition, reference)` gives the composition fields it sets, `kernels` the
    op classes' orders it sets; `vllm` and `sglang` name the production settings that correspond."""

    id: str
    label: str
    vllm: str
    sglang: str
    changes: Callable[[Any, Any], Changes] = lambda composition, reference: {}
    kernels: Mapping[str, str] = field(default_factory=dict)


def _nothing(*_: Any) -> Any:
    return ()


@dataclass(frozen=True)
class Axis:
    """One composition axis (the module docstring says what each part is for).

    `rank` places its fields among a Composition's (and its part of a derived name): the core fields take
    name 0, max_batch 10, order_seed 20, fillers 50, arrival 60."""

    name: str  # its mechanism in attribution.parquet
    label: str  # the mechanism as reports name it
    rank: int
    fields: tuple[AxisField, ...]
    name_part: Callable[[Any], str | None]  # its part of a derived composition name (None: at its default)
    engine: Callable[[Any], Changes]  # the engine knobs (flakecheck.engine.Knobs keywords) it sets
    present: Callable[[Any, Any], bool]  # (composition, reference): whether the composition has the mechanism
    absent: Callable[[Any], str]  # why a composition is not a candidate (its name in the text)
    strip: Callable[[Any, Any], Changes]  # (composition, reference): the changes that remove it
    pair: Callable[[Any, Any], tuple[Any, Any]]  # (divergent, reference): the two compositions that isolate it
    changes_reductions: bool = False  # other mechanisms are replayed with this axis at the reference's setting
    couples_cases: Callable[[Any], bool] = lambda composition: False  # one case's steps read another's data
    fixes: tuple[AxisFix, ...] = ()
    offers_fixes: Callable[[Sequence[Any], Any], bool] = lambda compositions, reference: True
    # (pricer, the run's compositions, repeat 0) -> {fix id: (factor or None, text)}
    price: Callable[[Pricer, Sequence[Any]], Mapping[str, tuple[float | None, str]]] = lambda pricer, cs: {}
    probe_args: Callable[[Any], Sequence[str]] = _nothing  # `flakecheck probe` options for this composition
    repro_note: Callable[[Any], str] = lambda composition: ""  # a README paragraph of a repro


def renamed(composition: Any, suffix: str, **changes: Any) -> Any:
    """The composition with `changes`, named `<name>-<suffix>` (within the 64 characters a name may have)."""
    return replace(composition, name=f"{composition.name[:63 - len(suffix)]}-{suffix}", **changes)
