"""Compositions: the scheduling configurations a suite is replayed under.

A composition sets how many sequences share a step (`max_batch`), the arrival order (`order_seed`; null keeps
suite order), synthetic filler requests and when those arrive — the core fields, here — and each composition
axis's fields, declared in its own file of flakecheck/data/axes/ (field, parsing, validation, engine knobs,
explain's mechanism and fix, repro's text): the prefill token budget per step (`chunk`: chunked_prefill.py),
prefix-cache reuse (`prefix_cache`: prefix_cache.py), and the server's tensor parallelism (tensor_parallel.py):
`tp` ranks (1: one device) whose partial sums an all-reduce adds (`allreduce`: auto | ring | tree | oneshot;
see flakecheck/kernels/tensor_parallel.py). The Composition class is built from the core fields and the
declared axes' when this module loads. The reference is the composition named "solo" (else the first given);
it is always listed first.

Sources, in order: `--compositions FILE` (.jsonl: one object a line, blank and `#` lines skipped; .json: a
list of objects), then each `--composition key=value,...`; with neither, DEFAULT_COMPOSITIONS. Keys, in a
spec or a file: name, max_batch, order_seed, chunk, prefix_cache, fillers (a count, or in a file an object
{count, prompt_len, output_len, seed}), filler_prompt_len and filler_output_len ("16-64", or one number),
filler_seed, arrival (together | staggered), tp, allreduce. A missing name is derived from the fields that
differ from the defaults: "max_batch=4,chunk=16" -> "b4-c16", "tp=3" -> "tp3" (all defaults -> "solo").

Fillers: background requests of random token ids, drawn from random.Random seeded by (fillers.seed, repeat),
never using the special ids. Arrival "together": all at step 0, queued with the cases. Arrival "staggered":
filler k arrives at step 1 + floor(k * horizon / count), spread evenly over `horizon = waves * longest filler
output`, where waves = ceil(n_cases / max_batch) is how many rounds of cases the batch needs — an estimate of
the suite's decode span, so fillers keep joining while cases are mid-decode rather than all at the start.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field, make_dataclass
from pathlib import Path
from typing import Any

from flakecheck.data.axes import declared
from flakecheck.data.axes.base import (
    Axis,
    AxisField,
    integer,
    integer_text,
    optional_integer,
    optional_integer_text,
    string,
    string_text,
)
from flakecheck.data.axes.tensor_parallel import ALLREDUCES
from flakecheck.errors import InputError, UserError

__all__ = ["ALLREDUCES", "ARRIVALS", "AXES", "DEFAULT_COMPOSITIONS", "REFERENCE", "Composition", "FillerRequest",
           "Fillers", "arrival_order", "derive_name", "load_compositions", "make_fillers", "order_compositions",
           "parse_composition_spec", "resolve_compositions"]

REFERENCE = "solo"
ARRIVALS = ("together", "staggered")
AXES: tuple[Axis, ...] = declared()  # every composition axis (flakecheck/data/axes/), by rank
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")


@dataclass(frozen=True)
class Fillers:
    count: int = 0
    prompt_len: tuple[int, int] = (16, 64)  # inclusive range, tokens
    output_len: tuple[int, int] = (8, 32)  # inclusive range of max_tokens
    seed: int = 0

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"fillers must be >= 0, got {self.count}")
        for label, (lo, hi) in (("filler_prompt_len", self.prompt_len), ("filler_output_len", self.output_len)):
            if not 1 <= lo <= hi:
                raise ValueError(f"{label} must be a range lo-hi with 1 <= lo <= hi, got {lo}-{hi}")


# the core fields every composition has, each with its rank (an axis's fields sit among them by its rank)
_CORE: tuple[tuple[int, AxisField], ...] = (
    (10, AxisField("max_batch", "int", 1, integer, integer_text,
                   lambda v: None if v >= 1 else f"max_batch must be >= 1, got {v}")),
    (20, AxisField("order_seed", "int | None", None, optional_integer, optional_integer_text)),
    (60, AxisField("arrival", "str", "together", string, string_text,
                   lambda v: None if v in ARRIVALS else f"arrival must be one of {', '.join(ARRIVALS)}, got {v!r}")),
)
_FILLERS_RANK = 50
# every scalar field (core and axes') in rank order: the dataclass's order, to_dict's and to_spec's
_SCALARS: tuple[tuple[int, AxisField], ...] = tuple(sorted(
    _CORE + tuple((axis.rank, f) for axis in AXES for f in axis.fields), key=lambda rf: rf[0]))
_BY_NAME = {f.name: f for _, f in _SCALARS}
_FILLER_KEYS = ("filler_prompt_len", "filler_output_len", "filler_seed")


class _CompositionMethods:
    """The methods of Composition, whose fields are built below from the core fields and the axes'."""

    name: str
    max_batch: int
    order_seed: int | None
    fillers: Fillers
    arrival: str
    shape_only: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"name {self.name!r} must be 1-64 of letters, digits, '_', '.', '+', '-'")
        for _, f in _SCALARS:
            problem = f.check(getattr(self, f.name))
            if problem:
                raise ValueError(problem)

    @property
    def cases_alone(self) -> bool:
        """Whether each case computes alone: one request a step and no axis that lets a case read what another
        computed (a prefix cache), so no other case or filler reaches its steps or its keys and values."""
        return self.max_batch == 1 and not any(axis.couples_cases(self) for axis in AXES)

    def engine_knobs(self) -> dict[str, Any]:
        """The engine knobs (flakecheck.engine.Knobs keywords) this composition sets, from its axes."""
        knobs: dict[str, Any] = {"max_num_seqs": self.max_batch}
        for axis in AXES:
            knobs.update(axis.engine(self))
        return knobs

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)  # type: ignore[call-overload]
        data["fillers"]["prompt_len"] = list(self.fillers.prompt_len)
        data["fillers"]["output_len"] = list(self.fillers.output_len)
        del data["shape_only"]  # a round's detail of one run, not part of what the composition is
        return data

    def measured(self, case_ids: Sequence[str]) -> list[str]:
        """The cases this composition reports: all but its shape-only ones, in the given order."""
        shaped = {case for case, _ in self.shape_only}
        return [c for c in case_ids if c not in shaped]

    def to_spec(self) -> str:
        """The `--composition` text that parses back to this composition (non-default fields only)."""
        filler_default = Fillers()
        parts = [f"name={self.name}"]
        for _, f in _SCALARS:
            value = getattr(self, f.name)
            if value != f.default:
                parts.append(f"{f.name}={str(value).lower() if isinstance(value, bool) else value}")
        fl = self.fillers
        if fl.count != filler_default.count:
            parts.append(f"fillers={fl.count}")
        for key, value, base in (("filler_prompt_len", fl.prompt_len, filler_default.prompt_len),
                                 ("filler_output_len", fl.output_len, filler_default.output_len)):
            if value != base:
                parts.append(f"{key}={value[0]}-{value[1]}")
        if fl.seed != filler_default.seed:
            parts.append(f"filler_seed={fl.seed}")
        return ",".join(parts)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Composition:
        """The inverse of to_dict; also takes the flat spec keys. ValueError on a bad key or value."""
        return _build(data, _typed_value)


def _dataclass_fields() -> list[tuple[str, Any, Any]]:
    scalars = [(rank, (f.name, f.annotation, field(default=f.default))) for rank, f in _SCALARS]
    fillers = (_FILLERS_RANK, ("fillers", "Fillers", field(default_factory=Fillers)))
    ordered = [spec for _, spec in sorted(scalars + [fillers], key=lambda rs: rs[0])]
    # (case id, tokens): cases no longer measured (`run --sample auto`), each a shape-only request of its
    # prompt and that many tokens in its place, so its batch-mates' steps keep their shapes; never in a spec
    return [("name", "str", field())] + ordered + [("shape_only", "tuple[tuple[str, int], ...]", field(default=()))]


Composition = make_dataclass("Composition", _dataclass_fields(), bases=(_CompositionMethods,), frozen=True)
Composition.__module__ = __name__  # pickled by name (the Ray cluster ships jobs)
Composition.__doc__ = ("One scheduling configuration: its name, the core fields (max_batch, order_seed, fillers, "
                       "arrival) and every declared axis's fields (flakecheck/data/axes/).")


DEFAULT_COMPOSITIONS: tuple[Composition, ...] = (
    Composition("solo"),
    Composition("batch8", max_batch=8),
    Composition("batch32", max_batch=32, order_seed=1),
    Composition("chunked", max_batch=16, chunk=32),
    # Serial like solo, so a divergence here is the prefix cache's alone.
    Composition("prefix", prefix_cache=True),
    Composition("load", max_batch=32, fillers=Fillers(count=16), arrival="staggered"),
)


# ------------------------------------------------------------------------------------ building from fields

# every key a spec or a file may give, in rank order (the error for an unknown key lists them)
_FIELDS = ("name",) + tuple(name for _, name in sorted(
    [(rank, f.name) for rank, f in _SCALARS] + [(_FILLERS_RANK, k) for k in ("fillers", *_FILLER_KEYS)],
    key=lambda rank_name: rank_name[0]))


def _build(values_in: Mapping[str, Any], convert: Callable[[str, Any], Any]) -> Composition:
    unknown = [k for k in values_in if k not in _FIELDS]
    if unknown:
        raise ValueError(f"unknown key '{unknown[0]}' (known: {', '.join(_FIELDS)})")
    values = {key: convert(key, raw) for key, raw in values_in.items()}
    filler_fields: dict[str, Any] = {}
    fillers = values.get("fillers")
    if isinstance(fillers, Fillers):
        filler_fields = asdict(fillers)
    elif fillers is not None:
        filler_fields["count"] = fillers
    for flat, nested in (("filler_prompt_len", "prompt_len"), ("filler_output_len", "output_len"),
                         ("filler_seed", "seed")):
        if flat in values:
            filler_fields[nested] = values[flat]
    kwargs = {k: v for k, v in values.items() if k in _BY_NAME}
    kwargs["fillers"] = Fillers(**filler_fields)
    name = values.get("name")
    if name is None:
        name = derive_name(Composition(REFERENCE, **kwargs))
    return Composition(name, **kwargs)


def derive_name(composition: Composition) -> str:
    """A name from the fields that differ from the defaults: b4-s3-c16-p-f8-stag-tp2-ring; all defaults ->
    "solo". Each axis names its own part (in rank order among the core fields')."""
    c, f, default = composition, composition.fillers, Fillers()
    ranked: list[tuple[int, str | None]] = [
        (10, f"b{c.max_batch}" if c.max_batch != 1 else None),
        (20, f"s{c.order_seed}" if c.order_seed is not None else None),
        (_FILLERS_RANK, f"f{f.count}" if f.count else None),
        (_FILLERS_RANK, f"fp{f.prompt_len[0]}-{f.prompt_len[1]}" if f.prompt_len != default.prompt_len else None),
        (_FILLERS_RANK, f"fo{f.output_len[0]}-{f.output_len[1]}" if f.output_len != default.output_len else None),
        (_FILLERS_RANK, f"fs{f.seed}" if f.seed != default.seed else None),
        (60, "stag" if c.arrival != "together" else None),
    ] + [(axis.rank, axis.name_part(c)) for axis in AXES]
    parts = [part for _, part in sorted(ranked, key=lambda rp: rp[0]) if part]
    return "-".join(parts) or REFERENCE


def _typed_value(key: str, value: Any) -> Any:
    """A JSON value (from a file or to_dict) checked for its key."""
    if key == "name":
        return string(key, value)
    if key in _BY_NAME:
        return _BY_NAME[key].from_json(key, value)
    if key == "filler_seed":
        return integer(key, value)
    if key in ("filler_prompt_len", "filler_output_len"):
        return _range(key, value)
    # fillers: a count, or the nested object to_dict writes
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in ("count", "prompt_len", "output_len", "seed")]
        if unknown:
            raise ValueError(f"unknown key 'fillers.{unknown[0]}' (known: count, prompt_len, output_len, seed)")
        nested: dict[str, Any] = {}
        if "count" in value:
            nested["count"] = integer("fillers.count", value["count"])
        if "seed" in value:
            nested["seed"] = integer("fillers.seed", value["seed"])
        for part in ("prompt_len", "output_len"):
            if part in value:
                nested[part] = _range(f"fillers.{part}", value[part])
        return Fillers(**nested)
    return integer(key, value)


def _range(key: str, value: Any) -> tuple[int, int]:
    if isinstance(value, str):
        return _range_from_text(key, value)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return integer(key, value[0]), integer(key, value[1])
    return (integer(key, value),) * 2  # one number: a fixed length


def _range_from_text(key: str, text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not match:
        raise ValueError(f"{key} must be a length or a range like 16-64, got {text!r}")
    lo = int(match.group(1))
    return lo, int(match.group(2) or lo)


def _text_value(key: str, text: str) -> Any:
    """A spec's text value converted for its key."""
    if key == "name":
        return text.strip()
    if key in _BY_NAME:
        return _BY_NAME[key].from_text(key, text)
    if key in ("filler_prompt_len", "filler_output_len"):
        return _range_from_text(key, text)
    return integer_text(key, text)


# ------------------------------------------------------------------------------------------------ sources


def parse_composition_spec(spec: str) -> Composition:
    """`--composition "name=b4,max_batch=4,chunk=16"`; UserError on a bad key or value."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"--composition {spec!r}: expected key=value, got {part.strip()!r}")
        if key in fields:
            raise UserError(f"--composition {spec!r}: '{key}' given twice")
        fields[key] = value
    if not fields:
        raise UserError(f"--composition {spec!r}: empty (give key=value pairs, e.g. max_batch=4)")
    try:
        return _build(fields, _text_value)
    except (ValueError, TypeError) as err:
        raise UserError(f"--composition {spec!r}: {err}") from None


def load_compositions(path: str | Path) -> list[Composition]:
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(name, None, None, "compositions file not found") from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(name, None, None, f"cannot read the compositions file: {err}") from None
    entries: list[tuple[int | None, Any]] = []
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise InputError(name, err.lineno, None, f"malformed JSON: {err.msg}") from None
        if not isinstance(data, list):
            raise InputError(name, None, None, "a .json compositions file must hold a list of objects")
        entries = [(_line_of_item(text, i), item) for i, item in enumerate(data)]
    else:
        for number, raw in enumerate(text.split("\n"), start=1):
            if not raw.strip() or raw.lstrip().startswith(("#", "//")):
                continue
            try:
                entries.append((number, json.loads(raw)))
            except json.JSONDecodeError as err:
                raise InputError(name, number, None, f"malformed JSON: {err.msg} (column {err.colno})") from None
    compositions = []
    for line, item in entries:
        if not isinstance(item, dict):
            raise InputError(name, line, None, "each composition must be a JSON object")
        try:
            compositions.append(Composition.from_dict(item))
        except (ValueError, TypeError) as err:
            raise InputError(name, line, _field_of(str(err), item), str(err)) from None
    if not compositions:
        raise InputError(name, None, None, "no compositions in the file")
    return compositions


def _line_of_item(text: str, index: int) -> int | None:
    """The line where the index-th top-level object of a JSON list starts (None when it cannot be told)."""
    decoder, position, depth_start = json.JSONDecoder(), text.index("[") + 1, 0
    for i in range(index + 1):
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        depth_start = position
        try:
            _, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return None
        if i == index:
            break
    return text.count("\n", 0, depth_start) + 1


def _field_of(message: str, item: Mapping[str, Any]) -> str | None:
    """The field an error message is about: the quoted unknown key, or the key it starts with."""
    quoted = re.match(r"unknown key '([^']+)'", message)
    if quoted:
        return quoted.group(1)
    first = re.match(r"([a-z_.]+)", message)
    return first.group(1) if first and first.group(1).split(".")[0] in item else None


def resolve_compositions(path: Path | None, specs: Sequence[str]) -> list[Composition]:
    """The compositions of a run, the reference first. File entries come before --composition flags."""
    compositions: list[Composition] = []
    if path is not None:
        compositions.extend(load_compositions(path))
    compositions.extend(parse_composition_spec(spec) for spec in specs)
    return order_compositions(compositions or list(DEFAULT_COMPOSITIONS))


def order_compositions(compositions: Sequence[Composition]) -> list[Composition]:
    """Distinct names (each names a partial file and a report column), the reference first."""
    seen: set[str] = set()
    for composition in compositions:
        if composition.name in seen:
            raise UserError(f"two compositions are named '{composition.name}'; give each a distinct name=")
        seen.add(composition.name)
    if not compositions:
        raise UserError("no compositions to replay")
    reference = next((c for c in compositions if c.name == REFERENCE), compositions[0])
    return [reference] + [c for c in compositions if c is not reference]


# -------------------------------------------------------------------------------------- order and fillers


def arrival_order(n_cases: int, composition: Composition, repeat: int) -> list[int]:
    """Case indices in arrival order: suite order for an unshuffled first repeat, else a seeded shuffle."""
    order = list(range(n_cases))
    if composition.order_seed is None and repeat == 0:
        return order
    # A string seed is hashed with SHA-512 by random.Random: stable across processes and PYTHONHASHSEED.
    random.Random(f"order:{composition.order_seed}:{repeat}").shuffle(order)
    return order


@dataclass(frozen=True)
class FillerRequest:
    prompt_ids: list[int]
    max_tokens: int
    arrival: int  # engine step at which it may be scheduled


def make_fillers(composition: Composition, vocab_size: int, avoid_ids: Collection[int], repeat: int,
                 n_cases: int) -> list[FillerRequest]:
    fillers = composition.fillers
    if fillers.count == 0:
        return []
    avoid = {i for i in avoid_ids if 0 <= i < vocab_size}
    if len(avoid) >= vocab_size:
        raise ValueError("no token ids left to draw fillers from")
    rng = random.Random(f"fillers:{fillers.seed}:{repeat}")

    def draw_token() -> int:
        while True:  # rejection: the special ids are a handful among tens of thousands
            token = rng.randrange(vocab_size)
            if token not in avoid:
                return token

    arrivals = _arrivals(composition, n_cases)
    requests = []
    for k in range(fillers.count):
        length = rng.randint(*fillers.prompt_len)
        prompt = [draw_token() for _ in range(length)]
        requests.append(FillerRequest(prompt, rng.randint(*fillers.output_len), arrivals[k]))
    return requests


def _arrivals(composition: Composition, n_cases: int) -> list[int]:
    count = composition.fillers.count
    if composition.arrival == "together":
        return [0] * count
    waves = max(1, math.ceil(n_cases / composition.max_batch))
    horizon = waves * composition.fillers.output_len[1]
    return [1 + (k * horizon) // count for k in range(count)]
