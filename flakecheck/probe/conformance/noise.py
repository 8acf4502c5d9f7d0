"""The server's noise profile: every gap shift a conformance check measured, per axis and level.

A shift is the change of a top-1/top-2 logprob gap between a target's baseline answer and its answer on one
level of one axis, at a step where both still read the same context and rank the same two tokens first (the
noise flakecheck.analysis.flip.predict measures on a run). Kept in `noise.json` in the conformance
directory, every shift (not a summary), per level.

A prediction is for the draws of one load, and a draw runs at one load: its answer differs from the serial
reference by the shifts of that load, at every step. So the noise a prediction uses is the level measured at
that load against the serial reference, not a pool of every level up to it:

- n requests in flight (n > 1): the co-resident level of the largest size measured that is at most n (the
  same requests among others in flight, against the serial reference: run-to-run noise included);
- 1 in flight (a serial repeat): run to run;
- no load given: the largest co-resident level measured;
- with the prefix level, the warm prefix-cache levels' shifts are added to that pool.

Pooling the levels up to a load would mix each serial level's zeros into every step of a loaded draw, and so
dilute a loaded server's noise by however many serial units the check happened to send. The arrival-position
levels are left out: their shifts are measured against another loaded answer, not against the reference.
A server whose shifts are all 0 at a load flips nothing there: every case is predicted 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakecheck.analysis.flip.predict import NoiseModel, measure_noise
from flakecheck.data.traces import Trace
from flakecheck.errors import UserError

NOISE_FILE = "noise.json"
WARM_PREFIX = ("warm", "warm_unsalted")  # the prefix-cache levels a probe's prefix level reproduces


@dataclass(frozen=True)
class LevelNoise:
    axis: str
    level: str
    in_flight: int
    shifts: tuple[float, ...]


@dataclass(frozen=True)
class ServerNoise:
    """The profile as measured; `model(...)` is the noise a prediction for one load uses."""

    unit: str
    dtype: str
    levels: tuple[LevelNoise, ...]
    endpoint: str | None = None
    server_version: str | None = None

    @classmethod
    def measure(cls, pairs: dict[tuple[str, str, int], Sequence[tuple[Trace, Trace]]], dtype: str | None,
                endpoint: str | None, server_version: str | None) -> ServerNoise:
        """`pairs`: per (axis, level, in flight), the (baseline, other) traces of its targets."""
        levels = []
        unit, name = "logprob", dtype or "float32"
        for (axis, level, in_flight), those in pairs.items():
            model = measure_noise(list(those), dtype)
            unit, name = model.unit, model.dtype
            levels.append(LevelNoise(axis, level, in_flight, model.shifts))
        return cls(unit, name, tuple(levels), endpoint, server_version)

    def model(self, in_flight: int | None = None, prefix: bool = False) -> NoiseModel:
        """The shifts a draw at `in_flight` requests in flight shows against the serial reference (None: the
        largest load measured), and the warm prefix cache's with `prefix`."""
        shifts = [s for lv in self.used_levels(in_flight, prefix) for s in lv.shifts]
        return NoiseModel(self.unit, self.dtype, tuple(sorted(shifts)))

    def used_levels(self, in_flight: int | None, prefix: bool) -> list[LevelNoise]:
        loaded = [lv for lv in self.levels
                  if lv.axis == "co_resident" and (in_flight is None or lv.in_flight <= in_flight)]
        if loaded and (in_flight is None or in_flight > 1):
            top = max(lv.in_flight for lv in loaded)
            used = [lv for lv in loaded if lv.in_flight == top]
        else:
            used = [lv for lv in self.levels if lv.axis == "run_to_run"]
        if prefix:
            used += [lv for lv in self.levels if lv.axis == "prefix_cache" and lv.level in WARM_PREFIX]
        return used

    def describe(self, in_flight: int | None, prefix: bool) -> dict[str, Any]:
        """What a prediction records about the noise it used."""
        used = self.used_levels(in_flight, prefix)
        return {"source": "server", "endpoint": self.endpoint, "server_version": self.server_version,
                "in_flight": in_flight, "prefix": prefix,
                "levels": [f"{lv.axis}.{lv.level}" for lv in used],
                "changed": self.model(in_flight, prefix).changed}

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "dtype": self.dtype, "endpoint": self.endpoint,
                "server_version": self.server_version,
                "levels": [{"axis": lv.axis, "level": lv.level, "in_flight": lv.in_flight, "shifts": list(lv.shifts)}
                           for lv in self.levels]}

    @classmethod
    def load(cls, directory: Path) -> ServerNoise:
        """From a conformance directory (or its noise.json); a UserError naming the file and field otherwise."""
        path = Path(directory)
        path = path / NOISE_FILE if path.is_dir() else path
        if not path.is_file():
            raise UserError(f"--noise {directory}: no {NOISE_FILE} there (run `flakecheck conformance` first)")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: not readable JSON ({exc})") from None
        try:
            levels = tuple(LevelNoise(str(lv["axis"]), str(lv["level"]), int(lv["in_flight"]),
                                      tuple(sorted(float(s) for s in lv["shifts"]))) for lv in data["levels"])
            return cls(str(data["unit"]), str(data["dtype"]), levels, data.get("endpoint"),
                       data.get("server_version"))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{path}: not a noise profile (field {exc})") from None
