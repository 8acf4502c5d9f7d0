"""What a conformance check sends: units of work, one axis and one level each, every unit a list of bursts.

Each axis changes one thing from a baseline and keeps the rest:

- run_to_run (serial): the serial requests sent again, against the serial reference;
- co_resident (n2, n4, ...): one burst of n requests in flight, the targets first (as many as fit, one after
  another) and the others right behind them, against the reference;
- arrival (middle, last): a target in the middle or last of a burst, against the same target sent first in
  a burst of the same size with the same others (the first ARRIVAL_TARGETS targets);
- prefix_cache (cold, warm, warm_unsalted): the target right after a sibling prompt that shares its prefix
  (another salt; the same salt; no salt at all), against the reference;
- chunked_prefill (long): a prompt longer than the chunk budget, sent just after another request began to
  decode, against the same prompt sent alone;
- request_shape (max_tokens, stop, top1, n2): a shorter max_tokens, a stop sequence, one logprob instead of
  two, n=2, against the reference on what both answers have (a shorter answer must be its prefix).

The reference unit sends every target (and the long prompt) alone, one after another, each with its own
`cache_salt`, so no request can reuse another's cached prompt; so does every unit, except where the prefix
cache is the point. A unit is saved whole as soon as it finishes (see flakecheck.probe.conformance.pipeline).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flakecheck.probe.conformance.workload import Prompt, Workload

REFERENCE = "reference"
AXES = ("run_to_run", "co_resident", "arrival", "prefix_cache", "chunked_prefill", "request_shape")
AXIS_TITLES = {"run_to_run": "run to run", "co_resident": "co-resident sequences", "arrival": "arrival position",
               "prefix_cache": "prefix cache", "chunked_prefill": "chunked prefill", "request_shape": "request shape"}
# How to compare a unit's answers with its baseline's: every token and logprob (full), the tokens both have
# (prefix: a shorter answer of the same request), or the chosen tokens only (top1: a request for fewer logprobs).
COMPARE = ("full", "prefix", "top1")
STAGGER_S = 0.3  # the chunked-prefill target leaves this long after the decoder, so that one is decoding
# Requests of a burst that must reach the server in order leave this far apart: far enough that they arrive in
# that order (the arrival-position axis depends on it), close enough that they are all in flight together.
GAP_S = 0.02
ARRIVAL_TARGETS = 2  # targets sent at each arrival position (a burst each: the axis's cost, 3 positions x this)


@dataclass(frozen=True)
class Request:
    label: str  # the target's name (its traces' case_id), or a filler's
    prompt: Prompt
    salt: str | None  # the cache_salt; None: no salt (the server's default sharing)
    target: bool = True  # a target's answer is kept and compared; a filler only adds load
    share_cache: bool = False  # llama.cpp's cache_prompt: the prefix pairs only
    max_tokens: int | None = None  # None: the prompt's own
    stop: tuple[str, ...] | None = None  # None: the prompt's own
    top_logprobs: int = 2
    n: int = 1
    delay_s: float = 0.0  # sent this long after its burst starts


@dataclass(frozen=True)
class Unit:
    axis: str  # one of AXES, or REFERENCE
    level: str
    in_flight: int  # requests in flight at once (1: serial)
    bursts: tuple[tuple[Request, ...], ...]  # in turn; the requests of one burst are in flight together
    baseline: str | None = REFERENCE  # the unit its targets are compared with; None: it is a baseline itself
    compare: str = "full"

    @property
    def name(self) -> str:
        return REFERENCE if self.axis == REFERENCE else f"{self.axis}.{self.level}"

    def with_compare(self, compare: str) -> Unit:
        return replace(self, compare=compare)


def _salt(unit: str, label: str, k: int = 0) -> str:
    return f"flakecheck-conformance-{unit}-{label}-{k}"


def _serial(axis: str, level: str, targets: list[Prompt], **change: object) -> Unit:
    name = f"{axis}.{level}"
    bursts = tuple((Request(t.name, t, _salt(name, t.name), **change),) for t in targets)  # type: ignore[arg-type]
    return Unit(axis, level, 1, bursts)


def reference_unit(targets: list[Prompt], long: Prompt) -> Unit:
    bursts = tuple((Request(t.name, t, _salt(REFERENCE, t.name)),) for t in [*targets, long])
    return Unit(REFERENCE, "serial", 1, bursts, baseline=None)


def axis_units(workload: Workload, targets: list[Prompt], sizes: tuple[int, ...], burst: int,
               reference_texts: dict[str, str]) -> list[Unit]:
    """Every unit after the reference, axis by axis. `reference_texts`: each target's reference answer, which
    picks the stop sequence of the request-shape axis."""
    long = workload.long_prompt()
    units = [Unit("run_to_run", "serial", 1,
                  tuple((Request(t.name, t, _salt("run_to_run", t.name)),) for t in [*targets, long]))]
    fillers = [workload.filler(i) for i in range(max(max(sizes), burst))]
    for size in sizes:
        # one burst a size: the targets first (as many as fit), then others to fill it, all in flight together
        name = f"co_resident.n{size}"
        inside = targets[:size]
        units.append(Unit("co_resident", f"n{size}", size, ((
            *(Request(t.name, t, _salt(name, t.name), delay_s=i * GAP_S) for i, t in enumerate(inside)),
            *(Request(f.name, f, _salt(name, f.name), target=False, delay_s=len(inside) * GAP_S)
              for f in fillers[: size - len(inside)])),)))
    positions = {"first": 0, "middle": burst // 2, "last": burst - 1}
    for level, position in positions.items():
        name = f"arrival.{level}"
        bursts = []
        for t in targets[:ARRIVAL_TARGETS]:
            others = [Request(f.name, f, _salt(name, f"{t.name}-{f.name}"), target=False) for f in fillers[: burst - 1]]
            ordered = [*others[:position], Request(t.name, t, _salt(name, t.name)), *others[position:]]
            bursts.append(tuple(replace(r, delay_s=i * GAP_S) for i, r in enumerate(ordered)))
        units.append(Unit("arrival", level, burst, tuple(bursts),
                          baseline=None if level == "first" else "arrival.first"))
    for level in ("cold", "warm", "warm_unsalted"):
        name = f"prefix_cache.{level}"
        bursts = []
        for t in targets:
            sibling = workload.prefix_sibling(t)
            shared = None if level == "warm_unsalted" else _salt(name, t.name)
            first_salt = _salt(name, sibling.name) if level == "cold" else shared
            # two bursts of one request each: the sibling has finished (its blocks cached) when the target starts
            bursts.append((Request(sibling.name, sibling, first_salt, target=False, share_cache=level != "cold"),))
            bursts.append((Request(t.name, t, shared if level != "cold" else _salt(name, t.name),
                                   share_cache=level != "cold"),))
        units.append(Unit("prefix_cache", level, 1, tuple(bursts)))
    decoder = fillers[0]
    name = "chunked_prefill.long"
    units.append(Unit("chunked_prefill", "long", 2, (
        # twice the target's tokens: still decoding through the long prompt's prefill chunks, which start 0.3 s in
        (Request(decoder.name, decoder, _salt(name, decoder.name), target=False, max_tokens=2 * long.max_tokens),
         Request(long.name, long, _salt(name, long.name), delay_s=STAGGER_S)),)))
    units.append(_serial("request_shape", "max_tokens", targets, max_tokens=max(1, workload.max_tokens // 2))
                 .with_compare("prefix"))
    stops = {t.name: stop_sequence(reference_texts.get(t.name, "")) for t in targets}
    stopped = [t for t in targets if stops[t.name]]
    if stopped:
        units.append(Unit("request_shape", "stop", 1, tuple(
            (Request(t.name, t, _salt("request_shape.stop", t.name), stop=(stops[t.name],)),) for t in stopped),
            compare="prefix"))
    units.append(_serial("request_shape", "top1", targets, top_logprobs=1).with_compare("top1"))
    units.append(_serial("request_shape", "n2", targets, n=2))
    return units


def stop_sequence(text: str) -> str | None:
    """A stop sequence that cuts `text` about halfway: the word that starts nearest its middle (None when the
    text has no word after its first)."""
    words = text.split(" ")
    if len(words) < 3:
        return None
    middle = len(words) // 2
    word = " " + words[middle]
    return word if word.strip() else None
