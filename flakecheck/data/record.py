"""A run's record: meta.json, typed. Every source of traces — the built-in engine, a probe of a server, an
imported harness log — fills one RunRecord, written once when the run directory is complete; reports, the
gate and compare read the record (and the tables), never the settings, the engine or the kernels, so a copied
run directory renders whatever the files its original options named.

The record names its source's own blocks (`config`, `engine`, `server`, `import`, ...) by `details`, kept as
the source wrote them; what the readers need is typed here. `RunRecord.of(meta)` also reads the run
directories older versions wrote (the flat `policy` / `backend` / `profile` fields, a missing `reference`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Computer:
    """What computed the traces, as every report names it: the engine's policy on a backend and device, or a
    server (its endpoint as the backend)."""

    policy: str  # the kernel policy's name, or "server"
    backend: str
    profile: str
    device: str = "cpu"
    op_orders: tuple[str, ...] = ()  # the orders of the policy's op classes (matmul, attention, norm)
    machine: str | None = None  # the machine fingerprint's one-line description
    verified: str | None = None  # the self-check's one-line summary

    @property
    def varies(self) -> bool:
        """Whether some op class follows split-K orders (production-like variance)."""
        return "splitk" in self.op_orders

    @classmethod
    def of_engine(cls, engine: Mapping[str, Any]) -> Computer:
        """From meta.json's `engine` block (an EngineSpec as recorded)."""
        classes = engine.get("op_classes") or {}
        orders = tuple(str(classes[c]) for c in ("matmul", "attention", "norm") if c in classes)
        return cls(str(engine.get("policy", "?")), str(engine.get("backend", "?")), str(engine.get("profile", "?")),
                   str(engine.get("device", "cpu")), orders, engine.get("machine_summary"),
                   engine.get("verification_summary"))

    @classmethod
    def server(cls, backend: str) -> Computer:
        return cls("server", backend, "n/a", "server")


@dataclass(frozen=True)
class RunRecord:
    source: str  # engine | probe | import
    model: str
    dtype: str | None  # the logits' dtype (None: a server that did not say)
    computer: Computer
    reference: str
    compositions: tuple[dict[str, Any], ...]  # each as its source records it: at least a `name`
    gap_threshold: float
    gap_window: int
    suite: str
    suite_name: str
    suite_sha256: str | None
    n_cases: int
    cases: tuple[dict[str, Any], ...]  # each case's input, targets, checks and metadata: reports need no suite file
    command: str | None = None
    fixed_order_command: str | None = None  # the same run under fixed-order kernels (the engine's runs)
    flip: dict[str, Any] | None = None
    gap_noise: float | None = None
    suite_warnings: tuple[str, ...] = ()
    timings: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    status: str = "complete"
    details: dict[str, Any] = field(default_factory=dict)  # the source's own blocks, as written

    @property
    def composition_names(self) -> list[str]:
        return [str(c["name"]) for c in self.compositions]

    @property
    def draws(self) -> list[str]:
        """The compositions that are draws from a load (sampled compositions, a probe's load levels)."""
        return list((self.flip or {}).get("draws") or [])

    @property
    def server(self) -> dict[str, Any] | None:
        server = self.details.get("server")
        return server if isinstance(server, dict) else None

    def to_dict(self) -> dict[str, Any]:
        """meta.json."""
        computer = self.computer  # an engine run's is in its `engine` block; a server's in three fields
        flat = {} if "engine" in self.details else {"policy": computer.policy, "backend": computer.backend,
                                                   "profile": computer.profile}
        return {
            **self.details, **flat,
            "source": self.source, "model": self.model, **({"dtype": self.dtype} if self.dtype else {}),
            "reference": self.reference, "compositions": list(self.compositions),
            "thresholds": {"gap_threshold": self.gap_threshold, "gap_window": self.gap_window},
            "suite": self.suite, "suite_name": self.suite_name, "suite_sha256": self.suite_sha256,
            "suite_warnings": list(self.suite_warnings), "n_cases": self.n_cases, "cases": list(self.cases),
            "command": self.command, "fixed_order_command": self.fixed_order_command, "flip": self.flip,
            "gap_noise": self.gap_noise, "timings": self.timings, "created_at": self.created_at,
            "status": self.status,
        }

    @classmethod
    def of(cls, meta: Mapping[str, Any], composition_names: Sequence[str] = ()) -> RunRecord:
        """The record of a meta.json, this version's or an older one's (`composition_names`: the tables'
        names, for a meta.json that lists none)."""
        typed = {"source", "model", "dtype", "reference", "compositions", "thresholds", "suite", "suite_name",
                 "suite_sha256", "suite_warnings", "n_cases", "cases", "command", "fixed_order_command", "flip",
                 "gap_noise", "timings", "created_at", "status", "policy", "backend", "profile"}
        compositions = tuple(c for c in meta.get("compositions") or [] if isinstance(c, dict) and "name" in c) \
            or tuple({"name": name} for name in composition_names)
        thresholds = meta.get("thresholds") or {}
        suite = str(meta.get("suite", "suite"))
        cases = tuple(c for c in meta.get("cases") or [] if isinstance(c, dict))
        return cls(
            source=str(meta.get("source", "engine")), model=str(meta.get("model", "?")),
            dtype=str(meta["dtype"]) if meta.get("dtype") else None, computer=_computer(meta),
            reference=str(meta.get("reference") or (compositions[0]["name"] if compositions else "?")),
            compositions=compositions, gap_threshold=float(thresholds.get("gap_threshold", 0.05)),
            gap_window=int(thresholds.get("gap_window", 50)), suite=suite,
            suite_name=str(meta.get("suite_name") or Path(suite).stem), suite_sha256=meta.get("suite_sha256"),
            n_cases=int(meta.get("n_cases") or len(cases)), cases=cases, command=meta.get("command"),
            fixed_order_command=meta.get("fixed_order_command"),
            flip=meta["flip"] if isinstance(meta.get("flip"), dict) else None,
            gap_noise=finite_or_none(meta.get("gap_noise")),
            suite_warnings=tuple(str(w) for w in meta.get("suite_warnings") or ()),
            timings=dict(meta.get("timings") or {}), created_at=str(meta.get("created_at", "")),
            status=str(meta.get("status", "complete")),
            details={k: v for k, v in meta.items() if k not in typed},
        )


def _computer(meta: Mapping[str, Any]) -> Computer:
    engine = meta.get("engine")
    if isinstance(engine, dict) and "policy" in engine:
        return Computer.of_engine(engine)
    policy = str(meta.get("policy", "?"))  # a server's, or an older engine run's flat fields
    if policy == "server":
        return Computer.server(str(meta.get("backend", "?")))
    # a policy's name is one bare order exactly when every op class follows it (KernelPolicy.name), so the
    # name is that order three times; a per-class name (class=order,...) left no orders in the flat fields
    orders = (policy,) * 3 if policy != "?" and "=" not in policy else ()
    return Computer(policy, str(meta.get("backend", "?")), str(meta.get("profile", "?")), op_orders=orders)


def finite_or_none(value: Any) -> float | None:
    """A measured number as JSON can carry it: NaN (nothing was measured) and missing read as None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
