"""The settings of one `flakecheck run`, typed, frozen and validated once.

A RunConfig is built from the command line or the Python API, checked in one place, and from then
on is the only description of the run: it yields the trace fingerprint that `--resume` compares,
the `config` block of meta.json, and the command lines the reports print (resume, the fixed-order
rerun) — regenerated from fields, never edited as strings.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from flakecheck.analysis.flip.load import DEFAULT_LOAD, parse_load, sample_compositions
from flakecheck.data.compositions import DEFAULT_COMPOSITIONS, Composition, order_compositions
from flakecheck.data.input_format import INPUT_FORMATS
from flakecheck.errors import UserError
from flakecheck.grading.external import DEFAULT_TIMEOUT_S as GRADER_TIMEOUT_S
from flakecheck.grading.external import check_timeout, grader_argv
from flakecheck.kernels.policy import KernelPolicy

DEFAULT_MODEL = "smollm2"
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
class RunConfig:
    suite: Path
    model: str = DEFAULT_MODEL
    dtype: str = "bfloat16"
    kernels: KernelPolicy = KernelPolicy("splitk", "splitk", "splitk")  # a policy text is parsed once, here
    backend: str = "auto"
    profile: str = "h100"
    compositions: tuple[Composition, ...] = DEFAULT_COMPOSITIONS
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
    grader: tuple[str, ...] = ()  # argv of an external grader (flakecheck.grading.external); () grades by the checks
    grader_timeout: float = GRADER_TIMEOUT_S
    # where simulated replay runs: None in this process; "local" (a local Ray cluster), "auto" or an address
    ray: str | None = None
    workers: int = 2
    cpus_per_worker: int | None = None
    allow_mixed_devices: bool = False
    # flip probability (flakecheck.analysis.flip): compositions drawn from a load model, beside the named ones
    sample: int = 0
    load: str = DEFAULT_LOAD
    sample_seed: int = 0

    def __post_init__(self) -> None:
        normalise_common(self)
        self._add_draws()
        object.__setattr__(self, "compositions", tuple(order_compositions(list(self.compositions))))
        object.__setattr__(self, "grader", grader_argv(self.grader) if self.grader else ())
        object.__setattr__(self, "grader_timeout", check_timeout(self.grader_timeout))
        check_common(self, (("max_tokens", 1), ("gap_window", 1), ("repeat", 1), ("workers", 1)))
        if self.cpus_per_worker is not None and (isinstance(self.cpus_per_worker, bool) or self.cpus_per_worker < 1):
            raise UserError(f"--cpus-per-worker must be an integer >= 1, got {self.cpus_per_worker!r}")
        from flakecheck.engine.spec import check_settings, parse_kernels

        object.__setattr__(self, "kernels", parse_kernels(self.kernels))
        check_settings(self.backend, self.profile, self.dtype)
        if self.input_format not in INPUT_FORMATS:
            raise UserError(f"--input-format must be one of {', '.join(INPUT_FORMATS)}, got {self.input_format!r}")
        if self.replay not in REPLAY_MODES:
            raise UserError(f"--replay must be one of {', '.join(REPLAY_MODES)}, got {self.replay!r}")
        if self.replay == "simulated" and self.kernels.physical:
            raise UserError("--replay simulated: native kernels depend on the physical batch, so their "
                            "compositions can only be replayed physically (use --replay physical or auto)")

    def _add_draws(self) -> None:
        """Check the sampling flags and put the drawn compositions after the named ones (a config read back
        from meta.json already lists them: they are drawn again, identically, and not listed twice)."""
        for name, flag in (("sample", "--sample"), ("sample_seed", "--seed")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{flag} must be an integer >= 0, got {value!r}")
        load = parse_load(self.load)  # a bad --load is refused even without --sample
        drawn = sample_compositions(load, self.sample, self.sample_seed) if self.sample else []
        named = [c for c in self.compositions if c not in drawn]
        object.__setattr__(self, "compositions", tuple(named + drawn))

    @property
    def drawn(self) -> tuple[str, ...]:
        """The names of the sampled compositions (the draws), in draw order."""
        if not self.sample:
            return ()
        return tuple(c.name for c in sample_compositions(parse_load(self.load), self.sample, self.sample_seed))

    @property
    def named(self) -> tuple[Composition, ...]:
        drawn = set(self.drawn)
        return tuple(c for c in self.compositions if c.name not in drawn)

    def sampling(self) -> dict[str, Any] | None:
        """What meta.json records of the sampling (None without it)."""
        if not self.sample:
            return None
        return {"n": self.sample, "seed": self.sample_seed, "load": parse_load(self.load).to_dict()}

    def with_changes(self, **changes: Any) -> RunConfig:
        return replace(self, **changes)

    # ------------------------------------------------------------------------------------ the command

    def argv(self) -> list[str]:
        """`flakecheck run ...` that makes this run again: every setting that differs from its default."""
        args = ["flakecheck", "run", str(self.suite)]
        defaults = RunConfig(self.suite)
        for name, flag in (("model", "--model"), ("dtype", "--dtype"), ("kernels", "--kernels"),
                           ("backend", "--backend"), ("profile", "--profile"), ("max_tokens", "--max-tokens"),
                           ("gap_threshold", "--gap-threshold"), ("gap_window", "--gap-window"),
                           ("repeat", "--repeat"), ("limit", "--limit"), ("replay", "--replay"),
                           ("input_format", "--input-format")):
            value = getattr(self, name)
            if value != getattr(defaults, name):
                args += [flag, value.name if isinstance(value, KernelPolicy) else str(value)]
        if self.named != defaults.compositions:
            for composition in self.named:
                args += ["--composition", composition.to_spec()]
        if self.sample:
            args += ["--sample", str(self.sample)]
            if self.load != defaults.load:
                args += ["--load", self.load]
            if self.sample_seed != defaults.sample_seed:
                args += ["--seed", str(self.sample_seed)]
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
        """The same run with fixed-order kernels everywhere, into a new directory: confirms the fix."""
        return self.with_changes(kernels="invariant", out=None).command()

    # ------------------------------------------------------------------------------- what is recorded

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "compositions":
                value = [c.to_dict() for c in value]
            elif isinstance(value, KernelPolicy):
                value = value.name
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            data[f.name] = value
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if "compositions" in values:
            values["compositions"] = tuple(Composition.from_dict(c) for c in values["compositions"])
        if "ids" in values:
            values["ids"] = tuple(values["ids"] or ())
        return cls(**values)

    def trace_settings(self) -> dict[str, Any]:
        """The settings that decide the traces (a resume must not change them). Thresholds and the grader
        only change the analysis, and simulated and physical replay give the same bits, so all may change."""
        return {
            "model": self.model, "dtype": self.dtype, "kernels": self.kernels.name, "backend": self.backend,
            "profile": self.profile, "max_tokens": self.max_tokens, "repeat": self.repeat,
            "compositions": [c.to_dict() for c in self.compositions], "input_format": self.input_format,
        }


def parse_ids(text: str | None) -> tuple[str, ...]:
    return tuple(i.strip() for i in text.split(",") if i.strip()) if text else ()


def config_from_options(suite: Path | str, compositions: Sequence[Composition] | None = None,
                        **options: Any) -> RunConfig:
    """A RunConfig from API keyword options (None means the default)."""
    given = {k: v for k, v in options.items() if v is not None}
    if compositions is not None:
        given["compositions"] = tuple(compositions)
    if "ids" in given:
        given["ids"] = tuple(given["ids"])
    return RunConfig(Path(suite), **given)
