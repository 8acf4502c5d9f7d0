"""The load a request meets on a busy server, and compositions drawn from it.

A load model is a distribution of how many sequences share a forward pass with the request (the batch size,
the request itself included). Two sources:

- `poisson:L`: L other sequences on average run beside the request (batch = 1 + Poisson(L));
- `uniform:LO-HI`: the batch size is uniform on LO..HI;
- a file: a histogram of batch sizes as a server saw them — `flakecheck serve`'s `GET /stats` JSON
  (`running_seqs_histogram`), a JSON object {"size": weight, ...}, a JSON list of sampled sizes, or text with
  one sample a line (e.g. vLLM's `vllm:num_requests_running` gauge scraped over time; a Prometheus line
  `name{labels} value` reads its value), or a probe's meta.json (each load level's requests in flight plus
  its fillers, equally weighted: the loads the probe put on the server). A size of 0 (an idle server)
  counts as 1: the request itself.

`sample_compositions` draws N whole-suite compositions from one seeded generator: the batch size, the
arrival order (where each case lands in its batch), the chunked-prefill budget, prefix caching, and filler
requests that keep the batch at that size (their count, prompt and output lengths, seed, arrival), and with
`--tp 1,2,4,8` the tensor-parallel size of the server the request lands on (uniform over the sizes given,
from a generator of its own: the other axes draw as without it). The same
(load, N, seed) gives the same compositions on every machine: random.Random with a string seed hashes it
with SHA-512, independent of PYTHONHASHSEED.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from flakecheck.data.compositions import Composition, Fillers
from flakecheck.errors import UserError

DEFAULT_LOAD = "poisson:16"
SAMPLE_PREFIX = "draw-"  # sampled compositions are named draw-01, draw-02, ...
CHUNKS = (16, 32, 64, 128, 256)  # prefill budgets a server is configured with (max_num_batched_tokens-like)
P_CHUNKED = 0.5  # share of draws with chunked prefill
P_PREFIX = 0.25  # share of draws with prefix caching on
P_STAGGERED = 0.5  # share of draws whose fillers keep arriving during decode
MAX_BATCH = 256  # the simulation's KV slots bound a batch


@dataclass(frozen=True)
class LoadModel:
    """A distribution of batch sizes: (size, weight) pairs, sizes >= 1, weights > 0."""

    spec: str  # what the user gave, recorded in meta.json
    sizes: tuple[int, ...]
    weights: tuple[float, ...]

    @property
    def mean(self) -> float:
        return sum(s * w for s, w in zip(self.sizes, self.weights)) / sum(self.weights)

    def draw(self, rng: random.Random) -> int:
        return rng.choices(self.sizes, weights=self.weights)[0]

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> LoadModel:
        """A load read back from meta.json: a file's recorded histogram, or a named shape made again."""
        spec, histogram = str(data["spec"]), data.get("histogram")
        if not isinstance(histogram, dict):
            return parse_load(spec)
        sizes = tuple(sorted(int(s) for s in histogram))
        return cls(spec, sizes, tuple(float(histogram[str(s)]) for s in sizes))

    def to_dict(self) -> dict[str, object]:
        """What meta.json records: a named shape by its name, a file's histogram in full (the file may go)."""
        data: dict[str, object] = {"spec": self.spec, "mean_batch": round(self.mean, 3)}
        if not re.match(r"(poisson|uniform):", self.spec):
            data["histogram"] = {str(s): w for s, w in zip(self.sizes, self.weights)}
        return data


def parse_load(text: str) -> LoadModel:
    """`poisson:16`, `uniform:1-32`, or a histogram file; UserError naming --load otherwise."""
    spec = text.strip()
    named = re.fullmatch(r"(poisson|uniform):(.+)", spec)
    if named:
        kind, arg = named.groups()
        if kind == "poisson":
            return _poisson(spec, arg)
        return _uniform(spec, arg)
    path = Path(spec)
    if not path.is_file():
        raise UserError(f"--load {text!r}: expected poisson:MEAN, uniform:LO-HI or a histogram file "
                        f"(no such file)")
    return _from_file(spec, path)


def _poisson(spec: str, arg: str) -> LoadModel:
    try:
        mean = float(arg)
    except ValueError:
        mean = -1.0
    if not (math.isfinite(mean) and 0 <= mean <= MAX_BATCH - 1):
        raise UserError(f"--load {spec!r}: the Poisson mean must be a number in 0..{MAX_BATCH - 1}")
    # the pmf out to where the tail is negligible, computed in logs (no overflow for large means)
    sizes, weights = [], []
    for k in range(MAX_BATCH):
        log_p = -mean + (k * math.log(mean) if mean > 0 else (0.0 if k == 0 else -math.inf)) - math.lgamma(k + 1)
        p = math.exp(log_p)
        if p > 1e-12:
            sizes.append(1 + k)
            weights.append(p)
    return LoadModel(spec, tuple(sizes), tuple(weights))


def _uniform(spec: str, arg: str) -> LoadModel:
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", arg)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)) <= MAX_BATCH:
        raise UserError(f"--load {spec!r}: expected uniform:LO-HI with 1 <= LO <= HI <= {MAX_BATCH}")
    lo, hi = int(match.group(1)), int(match.group(2))
    return LoadModel(spec, tuple(range(lo, hi + 1)), (1.0,) * (hi - lo + 1))


def _from_file(spec: str, path: Path) -> LoadModel:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--load {spec!r}: cannot read the file: {err}") from None
    counts: dict[int, float] = {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            value = line.split()[-1]  # a Prometheus sample line ends with its value
            try:
                _add(counts, float(value), 1.0)
            except ValueError:
                raise UserError(f"--load {spec!r}: line {number}: expected a number, got {line!r}") from None
    if isinstance(data, dict) and isinstance(data.get("running_seqs_histogram"), dict):
        data = data["running_seqs_histogram"]
    elif isinstance(data, dict) and data.get("source") == "probe" and isinstance(data.get("compositions"), list):
        levels = [c for c in data["compositions"] if isinstance(c, dict) and isinstance(c.get("concurrency"), int)]
        data = [c["concurrency"] + int(c.get("fillers") or 0) for c in levels]
    if isinstance(data, dict):
        for key, weight in data.items():
            try:
                size, w = float(key), float(weight)
            except (TypeError, ValueError):
                raise UserError(f"--load {spec!r}: histogram entry {key!r}: {weight!r} is not size: weight") from None
            if w < 0:
                raise UserError(f"--load {spec!r}: histogram entry {key!r} has a negative weight")
            _add(counts, size, w)
    elif isinstance(data, list):
        for item in data:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                raise UserError(f"--load {spec!r}: a list of samples must hold numbers, got {item!r}")
            _add(counts, float(item), 1.0)
    elif data is not None:
        raise UserError(f"--load {spec!r}: expected a histogram object, a list of samples or one number a line")
    counts = {s: w for s, w in counts.items() if w > 0}
    if not counts:
        raise UserError(f"--load {spec!r}: the histogram is empty")
    sizes = tuple(sorted(counts))
    return LoadModel(spec, sizes, tuple(counts[s] for s in sizes))


def _add(counts: dict[int, float], size: float, weight: float) -> None:
    if not math.isfinite(size) or size < 0:
        raise ValueError(size)
    batch = min(MAX_BATCH, max(1, round(size)))  # an idle server (0 running) still runs the request itself
    counts[batch] = counts.get(batch, 0.0) + weight


def parse_tp_sizes(text: str | Sequence[int]) -> tuple[int, ...]:
    """`--tp 1,2,4,8`: the TP sizes a draw may get (distinct, in order); UserError naming --tp otherwise."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(p) for p in text]
    if not parts or not all(re.fullmatch(r"\d+", p) and int(p) >= 1 for p in parts):
        raise UserError(f"--tp {text!r}: expected TP sizes >= 1 separated by commas, e.g. 1,2,4,8")
    return tuple(dict.fromkeys(int(p) for p in parts))


def sample_compositions(load: LoadModel, n: int, seed: int, tp_sizes: Sequence[int] = (1,)) -> list[Composition]:
    """N compositions drawn from `load` (and `tp_sizes`) with random.Random(seed)."""
    rng, tp_rng = random.Random(f"flakecheck-sample:{seed}"), random.Random(f"flakecheck-sample-tp:{seed}")
    width = max(2, len(str(n)))
    return [replace(_draw(load, rng, f"{SAMPLE_PREFIX}{i + 1:0{width}d}"), tp=tp_rng.choice(tuple(tp_sizes)))
            for i in range(n)]


def _draw(load: LoadModel, rng: random.Random, name: str) -> Composition:
    batch = load.draw(rng)
    order_seed = rng.randrange(1 << 30)
    chunk = rng.choice(CHUNKS) if rng.random() < P_CHUNKED else None
    prefix = rng.random() < P_PREFIX
    # background traffic of the same order as the batch, so the batch stays near its size even when the
    # suite alone is smaller than it or has mostly finished
    fillers = 0 if batch == 1 else rng.randint(batch // 2, batch)
    prompt_lo = rng.randint(8, 64)
    output_lo = rng.randint(4, 32)
    filler = Fillers(count=fillers, prompt_len=(prompt_lo, prompt_lo + rng.randint(0, 192)),
                     output_len=(output_lo, output_lo + rng.randint(0, 64)), seed=rng.randrange(1 << 30))
    arrival = "staggered" if fillers and rng.random() < P_STAGGERED else "together"
    return Composition(name, max_batch=batch, order_seed=order_seed, chunk=chunk, prefix_cache=prefix,
                       fillers=filler if fillers else Fillers(), arrival=arrival)

