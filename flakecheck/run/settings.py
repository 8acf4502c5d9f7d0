"""The settings of one `flakecheck run`, typed, frozen and validated once.

`RunConfig.parse` is where the options' text (the command line's, the Python API's, meta.json's `config`
block) becomes typed: the engine settings (the kernel policy a `KernelPolicy`), the compositions, the load
model and its draws (drawn once, here). From then on the RunConfig is the only description of the run: it
yields the trace fingerprint that `--resume` compares, the `config` block of meta.json, and the command lines
the reports print (resume, the fixed-order rerun) — regenerated from fields, never edited as strings.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from flakecheck.analysis.flip.adaptive import AutoDraws
from flakecheck.analysis.flip.load import DEFAULT_LOAD, LoadModel, parse_load, parse_tp_sizes, sample_compositions
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS, Composition, order_compositions
from flakecheck.data.input_format import INPUT_FORMATS
from flakecheck.engine.loader import DEFAULT_MODEL
from flakecheck.engine.settings import DEFAULT_GPU_MEMORY_UTILIZATION, EngineSettings
from flakecheck.errors import UserError
from flakecheck.grading.external import DEFAULT_TIMEOUT_S as GRADER_TIMEOUT_S
from flakecheck.grading.external import check_timeout, grader_argv
from flakecheck.kernels.policy import UNIFORM_POLICIES, KernelPolicy
from flakecheck.machine.device import Device

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


def parse_ids(text: str | None) -> tuple[str, ...]:
    return tuple(i.strip() for i in text.split(",") if i.strip()) if text else ()


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
    load: LoadModel = parse_load(DEFAULT_LOAD)  # checked even without --sample: a bad --load is refused
    max_tokens: int = 64
    gap_threshold: float = 0.05
    gap_window: int = 50
    repeat: int = 1
    limit: int | None = None
    ids: tuple[str, ...] = ()
    replay: str = "auto"
    out: Path | None = None
    html: bool = True
    input_format: str = "auto"
    grader: tuple[str, ...] = ()  # argv of an external grader (flakecheck.grading.external); () grades by checks
    grader_timeout: float = GRADER_TIMEOUT_S
    # where simulated replay runs: None in this process; "local" (a local Ray cluster), "auto" or an address
    ray: str | None = None
    workers: int = 2
    cpus_per_worker: int | None = None
    allow_mixed_devices: bool = False
    # `--sample auto`: the draws in rounds of DRAWS_PER_ROUND, a case measured only while it is undecided
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
    def parse(cls, suite: Path | str, *, model: str = DEFAULT_MODEL, dtype: str = "bfloat16",
              kernels: str | KernelPolicy = "splitk", backend: str = "auto", profile: str = "auto",
              device: str | Device = "auto",
              gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
              compositions: Sequence[Composition] | None = None, max_tokens: int = 64, gap_threshold: float = 0.05,
              gap_window: int = 50, repeat: int = 1, limit: int | None = None, ids: Sequence[str] = (),
              replay: str = "auto", out: Path | str | None = None, html: bool = True, input_format: str = "auto",
              grader: str | Sequence[str] | None = None, grader_timeout: float = GRADER_TIMEOUT_S,
              ray: str | None = None, workers: int = 2, cpus_per_worker: int | None = None,
              allow_mixed_devices: bool = False, sample: int | str = 0, load: str | LoadModel = DEFAULT_LOAD,
              sample_seed: int = 0, sample_tp: str | Sequence[int] = (1,)) -> RunConfig:
        """The settings from the options' text: the one place text becomes typed. `sample`: a number of draws,
        or 'auto'."""
        sample, auto = parse_sample(sample)
        engine = EngineSettings.parse(model=model, dtype=dtype, kernels=kernels, backend=backend, profile=profile,
                                      device=device, gpu_memory_utilization=gpu_memory_utilization)
        load_model = load if isinstance(load, LoadModel) else parse_load(load)
        named = tuple(compositions) if compositions is not None else DEFAULT_COMPOSITIONS
        sampling = Sampling.draw(load_model, sample, sample_seed, parse_tp_sizes(sample_tp))
        return cls(Path(suite), engine, named, sampling, load_model,
                   max_tokens, gap_threshold, gap_window, repeat, limit, tuple(ids), replay,
                   Path(out) if out is not None else None, html, input_format,
                   grader_argv(grader) if grader else (), grader_timeout, ray, workers, cpus_per_worker,
                   allow_mixed_devices, auto)

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
        args = ["flakecheck", "run", str(self.suite)]
        engine, default_engine = self.engine.to_dict(), EngineSettings().to_dict()
        for name, value in engine.items():
            if value != default_engine[name]:
                args += [f"--{name.replace('_', '-')}", str(value)]
        defaults = RunConfig(self.suite)
        for name in ("max_tokens", "gap_threshold", "gap_window", "repeat", "limit", "replay", "input_format"):
            value = getattr(self, name)
            if value != getattr(defaults, name):
                args += [f"--{name.replace('_', '-')}", str(value)]
        if self.named != defaults.named:
            for composition in self.named:
                args += ["--composition", composition.to_spec()]
        if self.sampling is not None:
            args += ["--sample", "auto" if self.auto is not None else str(self.sampling.n)]
        if self.load.spec != defaults.load.spec:
            args += ["--load", self.load.spec]
        if self.sampling is not None and self.sampling.seed != 0:
            args += ["--seed", str(self.sampling.seed)]
        if self.sampling is not None and self.sampling.tp_sizes != (1,):
            args += ["--tp", ",".join(map(str, self.sampling.tp_sizes))]
        if self.ids:
            args += ["--ids", ",".join(self.ids)]
        if self.out is not None:
            args += ["--out", str(self.out)]
        if not self.html:
            args.append("--no-html")
        if self.grader:
            args += ["--grader", shlex.join(self.grader)]
        if self.grader_timeout != defaults.grader_timeout:
            args += ["--grader-timeout", f"{self.grader_timeout:g}"]
        if self.ray is not None:
            args += ["--ray", self.ray, "--workers", str(self.workers)]
            if self.cpus_per_worker is not None:
                args += ["--cpus-per-worker", str(self.cpus_per_worker)]
            if self.allow_mixed_devices:
                args.append("--allow-mixed-devices")
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
        return {
            "suite": str(self.suite), **self.engine.to_dict(),
            "compositions": [c.to_dict() for c in self.compositions],
            "max_tokens": self.max_tokens, "gap_threshold": self.gap_threshold, "gap_window": self.gap_window,
            "repeat": self.repeat, "limit": self.limit, "ids": list(self.ids), "replay": self.replay,
            "out": str(self.out) if self.out is not None else None, "html": self.html,
            "input_format": self.input_format, "grader": list(self.grader), "grader_timeout": self.grader_timeout,
            "ray": self.ray, "workers": self.workers, "cpus_per_worker": self.cpus_per_worker,
            "allow_mixed_devices": self.allow_mixed_devices,
            "sample": self.sampling.n if self.sampling else 0, "load": self.load.spec,
            "load_model": self.load.to_dict(), "sample_seed": self.sampling.seed if self.sampling else 0,
            "sample_tp": list(self.sampling.tp_sizes) if self.sampling else [1],
            "sample_auto": self.auto.to_dict() if self.auto is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], device: str | Device | None = None) -> RunConfig:
        """A config read back from meta.json. Its compositions list the draws too: they are drawn again,
        identically, from the recorded load (a file's histogram is in the record: the file may have gone).
        `device`: replay on another device than the recorded one (`auto`, `cpu`, `cuda:N`)."""
        def get(key: str, default: Any) -> Any:
            return default if data.get(key) is None else data[key]

        recorded = data.get("load_model")
        load = LoadModel.from_dict(recorded) if isinstance(recorded, dict) else parse_load(get("load", DEFAULT_LOAD))
        sample, seed, tp = int(get("sample", 0)), int(get("sample_seed", 0)), tuple(get("sample_tp", [1]))
        drawn = {c.name for c in sample_compositions(load, sample, seed, tp)} if sample else set()
        named = [c for c in map(Composition.from_dict, get("compositions", [])) if c.name not in drawn]
        return cls.parse(
            str(data["suite"]), model=get("model", DEFAULT_MODEL), dtype=get("dtype", "bfloat16"),
            kernels=get("kernels", "splitk"), backend=get("backend", "auto"), profile=get("profile", "h100"),
            device=device if device is not None else get("device", "cpu"),
            gpu_memory_utilization=get("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION),
            compositions=named or None, max_tokens=get("max_tokens", 64),
            gap_threshold=get("gap_threshold", 0.05), gap_window=get("gap_window", 50), repeat=get("repeat", 1),
            limit=data.get("limit"), ids=tuple(get("ids", ())), replay=get("replay", "auto"), out=data.get("out"),
            html=get("html", True), input_format=get("input_format", "auto"), grader=tuple(get("grader", ())),
            grader_timeout=get("grader_timeout", GRADER_TIMEOUT_S), ray=data.get("ray"), workers=get("workers", 2),
            cpus_per_worker=data.get("cpus_per_worker"), allow_mixed_devices=get("allow_mixed_devices", False),
            sample="auto" if data.get("sample_auto") else sample, load=load, sample_seed=seed, sample_tp=tp)

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


DRAWS_PER_ROUND = 4  # `--sample auto`: the draws a round gives each case it measures


def parse_sample(value: int | str) -> tuple[int, AutoDraws | None]:
    """`--sample N` or `--sample auto`: (the draws, None) or (the most draws, the target: rounds of
    DRAWS_PER_ROUND draws, 8 at most — the 32 of a flat `--sample 32` — and 2 a case on average)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        target = AutoDraws(budget_rounds=2.0, max_rounds=8)
        return DRAWS_PER_ROUND * target.max_rounds, target
    if isinstance(value, str):
        try:
            return int(value), None
        except ValueError:
            raise UserError(f"--sample must be an integer >= 0 or 'auto', got {value!r}") from None
    return value, None
