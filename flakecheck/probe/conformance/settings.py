"""The settings of one conformance check, typed, frozen and checked once (at the CLI edge)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from flakecheck.analysis.flip_kind import dtype_name
from flakecheck.errors import UserError
from flakecheck.probe.bodies import APIS
from flakecheck.probe.endpoint import Endpoint

EXPECTATIONS = ("invariant", "serial")


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """2, 4, 8, ... up to and including `max_batch` (requests in flight: the target and the others)."""
    sizes, n = [], 2
    while n < max_batch:
        sizes.append(n)
        n *= 2
    return (*sizes, max_batch)


@dataclass(frozen=True)
class ConformanceConfig:
    endpoint: str
    model: str | None = None  # None: the first id of GET /v1/models
    api: str = "completions"  # how the generated prompts are sent
    api_key_env: str | None = None
    dtype: str | None = None  # the server's logits dtype, for the flip kinds; None: unknown
    suite: Path | None = None  # its cases are targets too
    limit: int | None = None  # of the suite's cases
    targets: int = 4  # generated target prompts
    max_tokens: int = 16  # decoding is most of a check's time; 16 steps still cross the near-ties of a word prompt
    max_batch: int = 64
    burst: int = 8  # requests in flight in the arrival-position bursts
    chunk_budget: int = 512  # the server's prefill chunk budget, in tokens (vLLM's max_num_batched_tokens)
    seed: int = 0
    expect: str | None = None  # invariant | serial: exit 1 when an expected axis does not hold
    out: Path | None = None
    timeout: float = 600.0
    retries: int = 5

    def __post_init__(self) -> None:
        Endpoint.parse(self.endpoint)
        if self.suite is not None:
            object.__setattr__(self, "suite", Path(self.suite))
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        for name, low in (("targets", 0), ("max_tokens", 2), ("max_batch", 2), ("burst", 3), ("chunk_budget", 16),
                          ("retries", 0), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UserError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {value!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise UserError(f"--limit must be an integer >= 1, got {self.limit!r}")
        if self.targets == 0 and self.suite is None:
            raise UserError("--targets 0 needs --suite: there would be nothing to compare")
        if self.api not in APIS:
            raise UserError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.expect is not None and self.expect not in EXPECTATIONS:
            raise UserError(f"--expect must be one of {', '.join(EXPECTATIONS)}, got {self.expect!r}")
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise UserError(f"--timeout must be > 0 seconds, got {self.timeout!r}")
        if self.dtype is not None:
            try:
                object.__setattr__(self, "dtype", dtype_name(self.dtype))
            except ValueError as exc:
                raise UserError(f"--dtype: {exc}") from None

    @property
    def sizes(self) -> tuple[int, ...]:
        return batch_sizes(self.max_batch)

    def sizes_for(self, max_num_seqs: int | None) -> tuple[int, ...]:
        """The sweep's sizes against a server that runs at most `max_num_seqs` sequences a step: no size above
        it (the requests past it wait in the queue; they are not co-resident), and it itself the last."""
        if max_num_seqs is None or max_num_seqs >= self.max_batch:
            return self.sizes
        return batch_sizes(max(2, max_num_seqs))

    def with_changes(self, **changes: Any) -> ConformanceConfig:
        return replace(self, **changes)

    def argv(self) -> list[str]:
        """`flakecheck conformance ...` that checks the same way again (the key only by its variable's name)."""
        args = ["flakecheck", "conformance", "--endpoint", Endpoint.parse(self.endpoint).public]
        defaults = ConformanceConfig(self.endpoint)
        for f in fields(self):
            if f.name == "endpoint":
                continue
            value = getattr(self, f.name)
            if value != getattr(defaults, f.name):
                args += [f"--{f.name.replace('_', '-')}", str(value)]
        return args

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
            data[f.name] = value
        return data
