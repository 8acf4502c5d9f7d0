"""A finished run, reopened for targeted replays: its settings, its suite's cases as the engine saw them, the
token ids it recorded per (composition, repeat) and each diverged case's first divergence.

meta.json's `config` block rebuilds the RunConfig (model, dtype, kernels, compositions, max_tokens, input
format). The prompts come from the suite file the run read (the config names it; `suite=` points at a moved
copy): meta.json keeps each case's input and targets but not its own max_tokens, the key its input came
from (which decides chat or raw) or its check definitions, and all three change what a replay computes or
grades. The file must be the one the run read (its sha256 is in meta.json).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flakecheck.data.compositions import Composition
from flakecheck.data.rundir import RunData, load_run
from flakecheck.data.suite import Suite, load_suite
from flakecheck.data.traces import run_label
from flakecheck.engine import LoadedModel
from flakecheck.errors import UserError
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.machine.device import DeviceError
from flakecheck.replay import CaseRequest
from flakecheck.run.engine_source import case_requests
from flakecheck.run.settings import RunConfig

DIVERGED = ("flaky", "verdict_flaky")


@dataclass(frozen=True)
class Divergence:
    """Where a case first diverged in the run: the step, under which (composition, repeat), and the token ids
    there (None where that side had already ended)."""

    case_id: str
    step: int
    composition: Composition
    repeat: int
    ref_token: int | None
    alt_token: int | None
    verdict_flip: bool


@dataclass
class RunSource:
    run: RunData
    config: RunConfig
    policy: KernelPolicy
    suite: Suite
    requests: list[CaseRequest]  # every case of the run, in the run's order (batch-mates matter)
    recorded: dict[tuple[str, int], dict[str, list[int]]]  # (composition, repeat) -> case id -> token ids
    finish: dict[tuple[str, int], dict[str, str]]  # ... -> finish_reason
    moe: bool = False  # the model is a mixture of experts (known once it is loaded: with_requests)

    @property
    def reference(self) -> Composition:
        return self.config.named[0]

    @property
    def work(self) -> list[tuple[Composition, int]]:
        """Every (composition, repeat) of the run, in replay order."""
        return [(c, r) for r in range(self.config.repeat) for c in self.config.compositions]

    def divergences(self, ids: Sequence[str] = ()) -> list[Divergence]:
        """The diverged cases (those of `ids`, when given), in the run's case order."""
        cases = self.run.cases
        known = set(cases["case_id"].astype(str))
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise UserError(f"--ids: {', '.join(unknown[:5])} not in the run {self.run.path} "
                            f"({len(unknown)} unknown id(s))")
        wanted = set(ids)
        labels = {run_label(c.name, r): (c, r) for c, r in self.work}
        ref = self.recorded[(self.reference.name, 0)]
        found = []
        for row in cases.itertuples(index=False):
            case_id = str(row.case_id)
            if row.status not in DIVERGED or (wanted and case_id not in wanted):
                continue
            composition, repeat = labels[str(row.divergence_composition)]
            step = int(row.first_divergence)
            alt = self.recorded[(composition.name, repeat)][case_id]
            found.append(Divergence(case_id, step, composition, repeat, _at(ref[case_id], step), _at(alt, step),
                                    bool(row.verdict_flip)))
        return found


def _at(tokens: list[int], step: int) -> int | None:
    return tokens[step] if step < len(tokens) else None


def open_run(run_dir: str | Path, suite: str | Path | None = None, device: str | None = None) -> RunSource:
    """Reopen a run directory written by `flakecheck run`; UserError (exit 2) when it cannot be explained.
    `device`: replay on it instead of the recorded device."""
    run = load_run(run_dir, explanation=False)
    meta = run.meta
    where = Path(run_dir) / "meta.json"
    if meta.get("source", "engine") != "engine" or not isinstance(meta.get("config"), dict):
        raise UserError(f"{where}: this run was not replayed by flakecheck's engine (source "
                        f"{meta.get('source')!r}, no 'config' block): explain and repro replay through the engine")
    try:
        config = RunConfig.from_dict(meta["config"], device=device)
    except DeviceError as exc:
        if device is None:  # made on a GPU this machine lacks
            raise UserError(f"{where}: the run's device: {exc} (--device cpu explains it on this machine)") from None
        raise UserError(f"{where}: field 'config' does not describe a run: {exc}") from None
    except UserError as exc:
        raise UserError(f"{where}: field 'config' does not describe a run: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: field 'config' does not describe a run: {exc}") from None
    policy = config.policy
    if policy.physical:
        raise UserError(f"{where}: kernels {policy.name!r} include the framework's own (native) kernels, whose "
                        "results depend on the physical batch: explain replays mechanisms one at a time in a "
                        "simulated lockstep, which needs the splitk or invariant orders")
    suite_obj = _suite(Path(suite) if suite is not None else config.suite, meta, where)
    selected = suite_obj.select(list(config.ids) or None, config.limit)
    run_ids = [str(i) for i in run.cases["case_id"]]
    if [c.id for c in selected.cases] != run_ids:
        raise UserError(f"{suite_obj.path}: its cases (after --ids/--limit of the run) are not the run's "
                        f"{len(run_ids)} cases in {run.path}")
    recorded: dict[tuple[str, int], dict[str, list[int]]] = {}
    finish: dict[tuple[str, int], dict[str, str]] = {}
    for row in run.runs.itertuples(index=False):
        key = (str(row.composition), int(row.repeat))
        recorded.setdefault(key, {})[str(row.case_id)] = [int(t) for t in row.token_ids]
        finish.setdefault(key, {})[str(row.case_id)] = str(row.finish_reason)
    missing = [run_label(c.name, r) for c, r in ((c, r) for r in range(config.repeat) for c in config.compositions)
               if len(recorded.get((c.name, r), {})) != len(run_ids)]
    if missing:
        raise UserError(f"{run.path}: runs.parquet lacks traces of {', '.join(missing)}")
    return RunSource(run, config, policy, selected, [], recorded, finish)


def with_requests(source: RunSource, model: LoadedModel) -> RunSource:
    """The source with every case's prompt token ids, as the run encoded them for `model` (and whether it is a
    mixture of experts)."""
    source.requests = case_requests(source.config, source.suite, model)
    source.moe = model.config.traits.experts is not None
    return source


def _suite(path: Path, meta: dict[str, Any], where: Path) -> Suite:
    recorded = meta.get("suite_sha256")
    if not path.is_file():
        raise UserError(f"{path}: the run's suite cannot be read (no such file); explain needs the file "
                        f"the run read (give its copy with --suite FILE)")
    suite = load_suite(path)
    if recorded and suite.sha256 != recorded:
        raise UserError(f"{path}: not the suite the run read (sha256 differs from {where}'s suite_sha256); "
                        "give the run's copy with --suite FILE")
    return suite
