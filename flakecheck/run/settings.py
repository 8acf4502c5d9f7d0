"""The settings of one `flakecheck run`, typed, frozen and validated once.

The options are declared once in flakecheck/run/options.py. `RunConfig.parse` takes them as keywords: it is
where their text (the command line's, the Python API's, meta.json's `config` block) becomes typed: the engine
settings (the kernel policy a `KernelPolicy`), the compositions, the load model and its draws (drawn once,
here). From then on the RunConfig is the only description of the run: it
yields the trace fingerprint that `--resume` compares, the `config` block of meta.json, and the command lines
the reports print (resume, the fixed-order rerun) — regenerated from fields, never edited as strings.
"""

from __future__ import annotations

import inspect
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flakecheck.analysis.flip.adaptive import AutoDraws
from flakecheck.analysis.flip.server_load import LoadModel, parse_load, parse_tp_sizes, sample_compositions
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS, Composition, order_compositions
from flakecheck.data.input_format import INPUT_FORMATS
from flakecheck.engine.settings import EngineSettings
from flakecheck.errors import UserError
from flakecheck.grading.external import check_timeout, grader_argv
from flakecheck.kernels.policy import UNIFORM_POLICIES, KernelPolicy
from flakecheck.machine.device import Device
from flakecheck.run.options import CONFIG_OPTIONS, ENGINE_OPTIONS, FIELD_OPTIONS, OPTIONS, keywords, signature

REPLAY_MODES = ("auto", "simulated", "physical")


def normalise_common(settings: Any) -> None:
    """The fields a run and a probe share, in canonical form (their dataclasses are frozen)."""
    object.__setattr__(settings, "suite", Path(settings.suite))
    if settings.out is not None:
        object.__setattr__(settings, "out", Path(settings.out))
    object.__setattr__(settings, "ids", tuple(str(i).strip() for i in settings.ids if str(i).strip()))


def check_common(settings: Any, int_minimums: Sequence[tuple[str, int]]) -> None:
    """UserError (exit 2) naming the flag of the first shared field out of range: integers >= their minimum,
    --limit (None or >= 1), --gap-threshold > 0."""
    for name, low in int_minimums:
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UserError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")
    limit = settings.limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise UserError(f"--limit must be an integer >= 1, got {limit!r}")
    if not (isinstance(settings.gap_threshold, (int, float)) and settings.gap_threshold > 0):
        raise UserError(f"--gap-threshold must be > 0, got {settings.gap_threshold!r}")


@dataclass(frozen=True)
class Sampling:
    """Compositions drawn from a load model (flip probability), drawn once when the settings are made."""

    load: LoadModel
    n: int
    seed: int
    draws: tuple[Composition, ...]
    tp_sizes: tuple[int, ...] = (1,)  # the tensor-parallel sizes a draw may get

    @classmethod
    def draw(cls, load: LoadModel, n: int, seed: int, tp_sizes: tuple[int, ...] = (1,)) -> Sampling | None:
        """N draws from `load` with `seed`; None for N = 0. UserError naming the flag of a bad count or seed."""
        for value, flag in ((n, "--sample"), (seed, "--seed")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{flag} must be an integer >= 0, got {value!r}")
        return cls(load, n, seed, tuple(sample_compositions(load, n, seed, tp_sizes)), tp_sizes) if n else None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.draws)

    def to_dict(self) -> dict[str, Any]:
        """What meta.json's flip block records of the sampling."""
        return {"n": self.n, "seed": self.seed, "load": self.load.to_dict(), "tp": list(self.tp_sizes)}


@dataclass(frozen=True)
class RunConfig:
    suite: Path
    engine: EngineSettings = EngineSettings()
    named: tuple[Composition, ...] = DEFAULT_COMPOSITIONS  # the compositions the user named, the reference first
    sampling: Sampling | None = None  # compositions drawn from a load, replayed after the named ones
    load: LoadModel = parse_load(OPTIONS["load"].default)  # checked even without --sample: a bad --load is refused
    # the `field` options (flakecheck/run/options.py), typed; their defaults are the declared ones
    max_tokens: int = OPTIONS["max_tokens"].default
    gap_threshold: float = OPTIONS["gap_threshold"].default
    gap_window: int = OPTIONS["gap_window"].default
    repeat: int = OPTIONS["repeat"].default
    limit: int | None = OPTIONS["limit"].default
    ids: tuple[str, ...] = OPTIONS["ids"].default
    replay: str = OPTIONS["replay"].default
    out: Path | None = OPTIONS["out"].default
    html: bool = OPTIONS["html"].default
    input_format: str = OPTIONS["input_format"].default
    grader: tuple[str, ...] = ()  # argv of an external grader (flakecheck.grading.external); () grades by checks
    grader_timeout: float = OPTIONS["grader_timeout"].default
    # where simulated replay runs: None in this process; "local" (a local Ray cluster), "auto" or an address
    ray: str | None = OPTIONS["ray"].default
    workers: int = OPTIONS["workers"].default
    cpus_per_worker: int | None = OPTIONS["cpus_per_worker"].default
    allow_mixed_devices: bool = OPTIONS["allow_mixed_devices"].default
    # `--sample auto`: the draws in rounds of DRAWS_PER_ROUND (replayed ROUNDS_PER_REPLAY at a time), a case
    # measured only while it is undecided
    auto: AutoDraws | None = None

    def __post_init__(self) -> None:
        normalise_common(self)
        object.__setattr__(self, "named", tuple(order_compositions(list(self.named))))
        if self.sampling is not None:
            order_compositions(list(self.compositions))  # a named one may not take a draw's name
        object.__setattr__(self, "grader_timeout", check_timeout(self.grader_timeout))
        check_common(self, (("max_tokens", 1), ("gap_window", 1), ("repeat", 1), ("workers", 1)))
        if self.cpus_per_worker is not None and (isinstance(self.cpus_per_worker, bool) or self.cpus_per_worker < 1):
            raise UserError(f"--cpus-per-worker must be an integer >= 1, got {self.cpus_per_worker!r}")
        if self.input_format not in INPUT_FORMATS:
            raise UserError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, got {self.input_format!r}")
        if self.replay not in REPLAY_MODES:
            raise UserError(f"--replay must be one of {', '.join(REPLAY_MODES)}, got {self.replay!r}")
        if self.auto is not None and (self.ray is not None or self.repeat != 1):
            raise UserError("--sample auto decides each round from the one before: it runs in this process (no "
                            "--ray) and draws each composition once (no --repeat)")
        if self.replay == "simulated" and self.engine.policy.physical:
            raise UserError("--replay simulated: native kernels depend on the physical batch, so their "
                            "compositions can only be replayed physically (use --replay physical or auto)")

    @classmethod
    def parse(cls, suite: Path | str, **options: Any) -> RunConfig:
        """The settings from the options' text (the command line's, the Python API's, meta.json's): the one
        place text becomes typed. The keywords are the run options (flakecheck/run/options.py; `kernels` and
        `device` may be a KernelPolicy or a Device already, `compositions` a list of Compositions)."""
        o = keywords(options, CONFIG_OPTIONS, "RunConfig.parse")
        engine = EngineSettings.parse(**{name: o[name] for name in ENGINE_OPTIONS})
        load_model = o["load"] if isinstance(o["load"], LoadModel) else parse_load(o["load"])
        named = tuple(o["compositions"]) if o["compositions"] is not None else DEFAULT_COMPOSITIONS
        draws, auto = parse_sample(o["sample"])  # a number of draws, or 'auto'
        sampling = Sampling.draw(load_model, draws, o["sample_seed"], parse_tp_sizes(o["sample_tp"]))
        fields = {name: o[name] for name in FIELD_OPTIONS}
        fields.update(ids=tuple(fields["ids"]), out=Path(fields["out"]) if fields["out"] is not None else None,
                      grader=grader_argv(fields["grader"]) if fields["grader"] else ())
        return cls(Path(suite), engine, named, sampling, load_model, **fields, auto=auto)

    @property
    def policy(self) -> KernelPolicy:
        return self.engine.policy

    @property
    def compositions(self) -> tuple[Composition, ...]:
        """What is replayed: the named compositions, then the draws."""
        return self.named + (self.sampling.draws if self.sampling else ())

    @property
    def draws(self) -> tuple[str, ...]:
        """The names of the sampled compositions, in draw order."""
        return self.sampling.names if self.sampling else ()

    @property
    def reference(self) -> str:
        return self.named[0].name

    def with_changes(self, **changes: Any) -> RunConfig:
        return replace(self, **changes)

    # ------------------------------------------------------------------------------------ the command

    def argv(self) -> list[str]:
        """`flakecheck run ...` that makes this run again: every setting that differs from its default."""
        defaults = RunConfig(self.suite)
        args = ["flakecheck", "run", str(self.suite)]
        for option in CONFIG_OPTIONS:
            if option.name == "compositions":  # the command line names the named ones; the draws come from --sample
                if self.named != defaults.named:
                    args += [a for c in self.named for a in ("--composition", c.to_spec())]
            else:
                args += option.argv(self, defaults)
        return args

    def command(self) -> str:
        return shlex.join(self.argv())

    def resume_command(self, out: Path) -> str:
        return shlex.join([*self.with_changes(out=out).argv(), "--resume"])

    def fixed_order_command(self) -> str:
        """The same run with fixed-order kernels everywhere, into a new directory: confirms the fix (the
        tp-invariant order where the compositions' TP sizes differ: fixed-order kernels do not hold those)."""
        tp_varies = len({(c.tp, c.allreduce if c.tp > 1 else "") for c in self.compositions}) > 1
        fixed = self.engine.with_policy(UNIFORM_POLICIES["tp-invariant" if tp_varies else "invariant"])
        return self.with_changes(engine=fixed, out=None).command()

    # ------------------------------------------------------------------------------- what is recorded

    def to_dict(self) -> dict[str, Any]:
        """meta.json's `config` block: the options as `parse` takes them (a file's load histogram in full, so
        the run can be read back when the file has gone)."""
        return {"suite": str(self.suite), **{o.name: o.record(self) for o in CONFIG_OPTIONS},
                "load_model": self.load.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], device: str | Device | None = None) -> RunConfig:
        """A config read back from meta.json. Its compositions list the draws too: they are drawn again,
        identically, from the recorded load (a file's histogram is in the record: the file may have gone).
        `device`: replay on another device than the recorded one (`auto`, `cpu`, `cuda:N`)."""
        options = {o.name: o.read(data) for o in CONFIG_OPTIONS}
        recorded = data.get("load_model")
        load = LoadModel.from_dict(recorded) if isinstance(recorded, dict) else parse_load(options["load"])
        (sample, _), seed, tp = parse_sample(options["sample"]), int(options["sample_seed"]), options["sample_tp"]
        tp_sizes = parse_tp_sizes(tp if isinstance(tp, str) else tuple(tp))
        drawn = {c.name for c in sample_compositions(load, sample, seed, tp_sizes)} if sample else set()
        named = [c for c in map(Composition.from_dict, options["compositions"] or []) if c.name not in drawn]
        options.update(compositions=named or None, load=load, sample_seed=seed, sample_tp=tp_sizes,
                       ids=tuple(options["ids"]), grader=tuple(options["grader"] or ()))
        if device is not None:
            options["device"] = device
        return cls.parse(str(data["suite"]), **options)

    def trace_settings(self) -> dict[str, Any]:
        """The settings that decide the traces (a resume must not change them). Thresholds and the grader
        only change the analysis, and simulated and physical replay give the same bits, so all may change."""
        engine = {k: v for k, v in self.engine.to_dict().items() if k != "gpu_memory_utilization"}  # no bit of it
        return {
            **engine, "max_tokens": self.max_tokens,
            "repeat": self.repeat, "compositions": [c.to_dict() for c in self.compositions],
            "input_format": self.input_format,
            **({"sample_auto": self.auto.to_dict()} if self.auto is not None else {}),
        }


# help(RunConfig.parse) and an editor show every option's keyword and default
RunConfig.parse.__func__.__signature__ = signature(  # type: ignore[attr-defined]
    [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in ("cls", "suite")],
    CONFIG_OPTIONS, "RunConfig")


# `--sample auto`: the draws a round gives each case it measures. Rounds of 2 made 2.1x the forward passes
# (1.4x the time) on the demo: a replay's passes follow its draws' schedules, whatever it measures
DRAWS_PER_ROUND = 4
# the rounds each replay (one lockstep) runs at once: the first alone, for every case, then the later ones in
# twos and threes, where the budget (DEFAULT_AUTO_DRAWS a case on average) leaves about half the cases undecided;
# together the 8 rounds of a flat `--sample 32`
ROUNDS_PER_REPLAY = (1, 2, 2, 3)
# the draws a case gets on average under a plain `--sample auto`
DEFAULT_AUTO_DRAWS = 8
# where the observed rates are not expected to rank the cases this well against a flat `--sample 32`
# (Spearman), the budget grows 4 draws a case at a time, up to RANK_DRAWS_MOST a case (or N, if more): where
# nearly every case flips, 8 draws a case rank them no better than a flat pass of 8 does (0.88 on a held-out
# suite where 37-39 of 40 cases flip), and the demo, where 43-45 of 111 never flip, is expected at 0.92-0.93
RANK_GOAL = 0.91
RANK_DRAWS_MOST = 16


def parse_sample(value: int | str) -> tuple[int, AutoDraws | None]:
    """`--sample N`, `--sample auto` or `--sample auto:N`: (the draws, None) or (the most draws, the target:
    rounds of DRAWS_PER_ROUND draws, 8 at most — the 32 of a flat `--sample 32` — and N draws a case on
    average, DEFAULT_AUTO_DRAWS where not given)."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto" or text.startswith("auto:"):
            target = auto_target(text)
            return DRAWS_PER_ROUND * target.max_rounds, target
        try:
            return int(value), None
        except ValueError:
            raise UserError(f"--sample must be an integer >= 0, 'auto' or 'auto:N', got {value!r}") from None
    return value, None


def auto_target(text: str) -> AutoDraws:
    """`auto` or `auto:N` (N: the draws a case gets on average, from one round's to a flat pass's)."""
    rounds = sum(ROUNDS_PER_REPLAY)  # a flat `--sample 32`'s
    draws = DEFAULT_AUTO_DRAWS
    if text != "auto":
        number = text.removeprefix("auto:")
        draws = int(number) if number.isdigit() else 0
        if not DRAWS_PER_ROUND <= draws <= DRAWS_PER_ROUND * rounds:
            raise UserError(f"--sample auto:N: N is the draws a case gets on average, an integer from "
                            f"{DRAWS_PER_ROUND} to {DRAWS_PER_ROUND * rounds}, got {text!r}")
    spec = "auto" if draws == DEFAULT_AUTO_DRAWS else f"auto:{draws}"
    return AutoDraws(budget_rounds=draws / DRAWS_PER_ROUND, max_rounds=rounds, rarely_flips=True, rank_decided=True,
                     rank_goal=RANK_GOAL, budget_most=max(draws, RANK_DRAWS_MOST) / DRAWS_PER_ROUND, spec=spec)
