"""The settings of one `flakecheck probe`, typed, frozen and checked once.

It yields the command line the reports and the resume hint print, regenerated from the fields
(the endpoint without any user:password part; the API key only by its variable's name).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from flakecheck.analysis.flip.adaptive import AutoDraws
from flakecheck.analysis.flip_kind import dtype_name
from flakecheck.errors import UserError
from flakecheck.probe.bodies import APIS, ISOLATIONS
from flakecheck.probe.endpoint import Endpoint
from flakecheck.run.settings import check_common, normalise_common


@dataclass(frozen=True)
class ProbeConfig:
    suite: Path
    endpoint: str
    model: str | None = None  # None: the first id of GET /v1/models
    api: str | None = None  # None: chat for message inputs, completions for raw prompts
    api_key_env: str | None = None
    dtype: str | None = None  # the server's logits dtype, for flip_kind; None: unknown
    concurrency: tuple[int, ...] = (1, 8, 32)
    fillers: int = 0
    prefix: bool = False
    repeat: int = 1
    max_tokens: int = 64
    limit: int | None = None
    ids: tuple[str, ...] = ()
    out: Path | None = None
    isolation: str = "salt"
    timeout: float = 600.0
    retries: int = 5
    gap_threshold: float = 0.05
    gap_window: int = 50
    html: bool = True
    noise: Path | None = None  # a conformance directory: predict from the server's measured noise profile
    noise_in_flight: int | None = None  # the load to predict for (None: the probe's own highest level)
    auto: AutoDraws | None = None  # --repeat auto: rounds while a case is undecided (repeat: the most rounds)

    def __post_init__(self) -> None:
        normalise_common(self)
        if self.auto is not None:
            object.__setattr__(self, "repeat", self.auto.max_rounds)
        object.__setattr__(self, "concurrency", tuple(sorted(set(self.concurrency))))
        Endpoint.parse(self.endpoint)
        check_common(self, (("max_tokens", 1), ("gap_window", 1), ("repeat", 1), ("fillers", 0), ("retries", 0)))
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise UserError(f"--timeout must be > 0 seconds, got {self.timeout!r}")
        if self.api is not None and self.api not in APIS:
            raise UserError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.dtype is not None:
            try:
                object.__setattr__(self, "dtype", dtype_name(self.dtype))
            except ValueError as exc:
                raise UserError(f"--dtype: {exc}") from None
        if self.noise is not None:
            object.__setattr__(self, "noise", Path(self.noise))
        if self.noise_in_flight is not None and (isinstance(self.noise_in_flight, bool)
                                                 or not isinstance(self.noise_in_flight, int)
                                                 or self.noise_in_flight < 1):
            raise UserError(f"--noise-in-flight must be an integer >= 1, got {self.noise_in_flight!r}")
        if self.noise_in_flight is not None and self.noise is None:
            raise UserError("--noise-in-flight needs --noise DIR (a conformance directory)")
        if self.isolation not in ISOLATIONS:
            raise UserError(f"--isolation must be one of {', '.join(ISOLATIONS)}, got {self.isolation!r}")
        if not self.concurrency or 1 not in self.concurrency or any(c < 1 for c in self.concurrency):
            raise UserError("--concurrency must list integers >= 1 and include 1, the serial reference "
                            f"(e.g. 1,8,32), got {','.join(map(str, self.concurrency))}")
        if self.auto is not None and max(self.concurrency) == 1 and not self.prefix:
            raise UserError("--repeat auto draws at the load levels above the serial reference: give one "
                            "(e.g. --concurrency 1,8)")

    def with_changes(self, **changes: Any) -> ProbeConfig:
        return replace(self, **changes)

    def argv(self) -> list[str]:
        """`flakecheck probe ...` that probes the same way again: every setting that differs from its default."""
        args = ["flakecheck", "probe", str(self.suite), "--endpoint", Endpoint.parse(self.endpoint).public]
        defaults = ProbeConfig(self.suite, self.endpoint)
        for name in ("model", "api", "api_key_env", "dtype", "fillers", "repeat", "max_tokens", "limit", "isolation",
                     "timeout", "retries", "gap_threshold", "gap_window", "noise", "noise_in_flight"):
            value = getattr(self, name)
            if name == "repeat" and self.auto is not None:
                value = "auto"
            if value != getattr(defaults, name):
                args += [f"--{name.replace('_', '-')}", str(value)]
        if self.concurrency != defaults.concurrency:
            args += ["--concurrency", ",".join(map(str, self.concurrency))]
        if self.prefix:
            args.append("--prefix")
        if self.ids:
            args += ["--ids", ",".join(self.ids)]
        if self.out is not None:
            args += ["--out", str(self.out)]
        if not self.html:
            args.append("--no-html")
        return args

    def prediction_load(self) -> int | None:
        """Requests in flight the predictions are for: --noise-in-flight, else the probe's highest level (its
        concurrency and its fillers), else (a serial probe) the largest load the profile measured (None)."""
        if self.noise_in_flight is not None:
            return self.noise_in_flight
        highest = max(self.concurrency)
        return highest + self.fillers if highest > 1 else None

    def command(self) -> str:
        return shlex.join(self.argv())

    def resume_command(self, out: Path) -> str:
        return shlex.join([*self.with_changes(out=out).argv(), "--resume"])

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "endpoint":
                value = Endpoint.parse(value).public
            elif isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, AutoDraws):
                value = value.to_dict()
            data[f.name] = value
        return data


def parse_repeat(text: str) -> tuple[int, AutoDraws | None]:
    """`--repeat N` (every level N times) or `--repeat auto` (rounds while a case is undecided): (N, None) or
    (the most rounds, the target). A UserError naming the flag otherwise."""
    if text.strip().lower() == "auto":
        target = AutoDraws()
        return target.max_rounds, target
    try:
        return int(text), None
    except ValueError:
        raise UserError(f"--repeat must be an integer >= 1 or 'auto', got {text!r}") from None
