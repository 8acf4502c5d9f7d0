"""`flakecheck conformance`: which invariance does this server keep, axis by axis.

check the server (nothing written yet) -> the serial reference -> every unit of every axis in turn, each
saved as soon as it finishes (partial/, as a run's compositions are; Ctrl-C or a request that still fails
after its retries keeps them, and `--resume` continues) -> the readings -> conformance.json,
conformance.md, noise.json (the server's noise profile) and traces.parquet. The API key is read from the
environment only, sent only in the Authorization header, and never written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from flakecheck.analysis.flip.predict import NoiseModel
from flakecheck.data.record import now
from flakecheck.data.rundir import (
    TRACE_SCHEMA,
    RunDirectory,
    atomic_write_text,
    default_run_dir,
    write_json,
    write_table,
)
from flakecheck.data.suite import load_suite
from flakecheck.data.traces import Trace
from flakecheck.errors import UserError
from flakecheck.probe.bodies import CasePrompt, case_prompts
from flakecheck.probe.client import ServerClient, with_client
from flakecheck.probe.conformance.markdown import conformance_markdown
from flakecheck.probe.conformance.noise import NOISE_FILE, ServerNoise
from flakecheck.probe.conformance.plan import AXES, REFERENCE, Unit, axis_units, reference_unit
from flakecheck.probe.conformance.send import UnitFailed, UnitResult, run_unit
from flakecheck.probe.conformance.settings import ConformanceConfig
from flakecheck.probe.conformance.verdict import HOLDS, UNSUPPORTED, LevelReading, read_axes, read_level
from flakecheck.probe.conformance.workload import Prompt, Workload
from flakecheck.probe.discover import ServerInfo, discover
from flakecheck.probe.endpoint import Endpoint, api_key_from_env
from flakecheck.probe.retries import RetryPolicy
from flakecheck.probe.vocab import Vocab

T = TypeVar("T")
RESULT_FILE, MARKDOWN_FILE, TRACES_FILE = "conformance.json", "conformance.md", "traces.parquet"
VOCAB_FILE = "vocab.json"
EXPECTED_AXES = {"invariant": AXES, "serial": ("run_to_run",)}


class ConformanceFailed(UserError):
    """A request failed for good: the finished units are kept; the message says how to resume."""


class ConformanceInterrupted(Exception):
    """Ctrl-C: the finished units are kept; the message says how to resume. Not a UserError: the command line
    exits 130 for it, as it does for an interrupted probe."""


@dataclass(frozen=True)
class ConformanceResult:
    path: Path
    data: dict[str, Any]  # what conformance.json holds
    failed: tuple[str, ...]  # the expected axes that do not hold

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


@dataclass
class _Check:
    config: ConformanceConfig
    endpoint: Endpoint
    api_key: str | None
    info: ServerInfo
    model_card: dict[str, Any] | None
    workload: Workload
    targets: list[Prompt]
    directory: RunDirectory
    sizes: tuple[int, ...]  # the co-resident sweep's sizes, capped at what the server runs at once


def conformance_check(config: ConformanceConfig, *, resume: bool = False,
                      client_factory: Callable[..., ServerClient] = ServerClient,
                      on_unit: Callable[[str], None] = lambda name: None) -> ConformanceResult:
    started = time.perf_counter()
    check = _prepare(config, resume, client_factory)
    vocab = _load_vocab(check.directory)
    results: dict[str, tuple[Unit, UnitResult]] = {}
    try:
        ref = reference_unit(check.targets, check.workload.long_prompt())
        results[REFERENCE] = (ref, _unit(check, ref, vocab, client_factory, on_unit))
        texts = results[REFERENCE][1].texts
        for unit in axis_units(check.workload, check.targets, check.sizes, config.burst, texts):
            results[unit.name] = (unit, _unit(check, unit, vocab, client_factory, on_unit))
    except KeyboardInterrupt:
        raise ConformanceInterrupted(_saved(check, "interrupted")) from None
    except UnitFailed as exc:
        raise ConformanceFailed(f"{exc}. {_saved(check, 'stopped')}") from None
    return _finish(check, results, vocab, time.perf_counter() - started)


def _prepare(config: ConformanceConfig, resume: bool, client_factory: Callable[..., ServerClient]) -> _Check:
    """Everything checked, the server included, before the first byte is written."""
    if resume and config.out is None:
        raise UserError("--resume needs --out DIR (the interrupted conformance directory)")
    api_key = api_key_from_env(config.api_key_env)
    endpoint = Endpoint.parse(config.endpoint)
    workload = Workload(config.seed, config.api, config.targets, config.max_tokens, config.chunk_budget)
    targets = workload.targets()
    suite_sha = None
    if config.suite is not None:
        suite = load_suite(config.suite).select(None, config.limit)
        suite_sha = suite.sha256
        cases, _ = case_prompts(suite, None, config.max_tokens)
        targets += [Prompt(c.case_id, c.api, c.prompt, c.max_tokens, c.stop) for c in cases]
    checks = {t.api: CasePrompt(t.name, t.api, t.text, t.max_tokens) for t in reversed(targets)}

    async def ask(client: ServerClient) -> tuple[ServerInfo, dict[str, Any] | None]:
        info = await discover(client, config.model, "salt", list(checks.values()))
        return info, await _model_card(client, info.model)

    info, card = _with_client(config, endpoint, api_key, 4, client_factory, ask)
    sizes = config.sizes_for(server_max_num_seqs(card))
    out = config.out or default_run_dir(Path("conformance"))  # reports/conformance-<UTC time>
    directory = RunDirectory(out)
    directory.begin({"source": "conformance", "endpoint": endpoint.public, "model": info.model,
                     "server_version": info.version, "workload": [config.seed, config.api, config.targets,
                     config.max_tokens, config.chunk_budget, list(sizes), config.burst],
                     "suite_sha256": suite_sha}, resume)
    return _Check(config.with_changes(out=out), endpoint, api_key, info, card, workload, targets, directory, sizes)


def _cap(check: _Check) -> int | None:
    """The server's max_num_seqs where it cut the sweep short of --max-batch (1 for a serial server, whose
    sweep keeps its smallest size, 2)."""
    cap = server_max_num_seqs(check.model_card)
    return cap if cap is not None and cap < check.config.max_batch else None


def server_max_num_seqs(card: dict[str, Any] | None) -> int | None:
    """The most sequences the server runs in one step, where its model card says (flakecheck serve does; vLLM's
    card does not, so its sweep goes to --max-batch)."""
    for where in (card or {}, (card or {}).get("flakecheck") or {}):
        value = where.get("max_num_seqs") if isinstance(where, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return None


async def _model_card(client: ServerClient, model: str) -> dict[str, Any] | None:
    """The server's own description of the model (`/v1/models`): the flags a server reports live there."""
    try:
        status, body = await client.get_json(client.endpoint.api("/models"),
                                             policy=RetryPolicy(attempts=2, base_s=0.2, cap_s=1.0, max_wait_s=2.0))
    except Exception:  # nice to have, never worth failing the check for
        return None
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    card = next((m for m in body["data"] if isinstance(m, dict) and m.get("id") == model), None)
    return json.loads(client.scrub(json.dumps(card))) if card is not None else None


def _with_client(config: ConformanceConfig, endpoint: Endpoint, api_key: str | None, connections: int,
                 client_factory: Callable[..., ServerClient], work: Callable[[ServerClient], Awaitable[T]]) -> T:
    return with_client(endpoint, api_key, timeout_s=config.timeout, retries=config.retries, connections=connections,
                       client_factory=client_factory, work=work)


def _load_vocab(directory: RunDirectory) -> Vocab:
    path = directory.partial_dir / VOCAB_FILE
    return Vocab.from_json(json.loads(path.read_text())) if path.is_file() else Vocab()


def _unit(check: _Check, unit: Unit, vocab: Vocab, client_factory: Callable[..., ServerClient],
          on_unit: Callable[[str], None]) -> UnitResult:
    """A unit's result: read back when a previous attempt saved it, else run and saved whole."""
    directory = check.directory
    extras_file = directory.partial_dir / f"unit.{unit.name}.json"
    saved = directory.saved_traces(unit.name, 0)
    if saved is not None and extras_file.is_file():
        extras = json.loads(extras_file.read_text())
        return UnitResult(saved, extras["seconds"], extras["fingerprints"], extras["unsupported"],
                          extras["fillers_sent"], extras["fillers_failed"], extras.get("texts", {}))
    on_unit(unit.name)
    connections = max(len(burst) for burst in unit.bursts) + 2

    async def work(client: ServerClient) -> UnitResult:
        return await run_unit(client, check.info.options, unit, vocab)

    result = _with_client(check.config, check.endpoint, check.api_key, connections, client_factory, work)
    write_json(directory.partial_dir / VOCAB_FILE, vocab.to_json())
    write_json(extras_file, result.extras())
    directory.save_traces(unit.name, 0, result.traces)  # last: the unit counts as saved only when this is there
    return result


def _saved(check: _Check, what: str) -> str:
    n = len(list(check.directory.partial_dir.glob("unit.*.json")))
    return (f"{what}: {n} finished units saved in {check.directory.partial_dir}; continue with: "
            f"{check.config.resume_command(check.directory.path)}")


def _finish(check: _Check, results: dict[str, tuple[Unit, UnitResult]], vocab: Vocab,
            seconds: float) -> ConformanceResult:
    config, info = check.config, check.info
    by_name = {name: result.traces for name, (_, result) in results.items()}
    pairs: dict[tuple[str, str, int], list[tuple[Trace, Trace]]] = {}
    for unit, result in results.values():
        if unit.baseline is None or result.unsupported:
            continue
        base = {t.case_id: t for t in by_name[unit.baseline]}
        pairs[(unit.axis, unit.level, unit.in_flight)] = [(base[t.case_id], t) for t in result.traces
                                                          if t.case_id in base]
    noise = ServerNoise.measure(pairs, config.dtype, check.endpoint.public, info.version)
    gap_noise = max((s for lv in noise.levels for s in lv.shifts), default=0.0)
    dtype = config.dtype or "float32"
    levels: dict[str, list[LevelReading]] = {}
    for unit, result in results.values():
        if unit.baseline is None:
            continue
        levels.setdefault(unit.axis, []).append(
            read_level(unit, result.traces, by_name[unit.baseline], dtype, gap_noise, result.unsupported))
    axes = read_axes(levels)
    expected = EXPECTED_AXES[config.expect] if config.expect else ()
    failed = tuple(a for a in expected if axes[a].reading not in (HOLDS, UNSUPPORTED))
    fingerprints = sorted({f for _, result in results.values() for f in result.fingerprints})
    data = {
        "source": "conformance", "created_at": now(), "command": config.command(), "config": config.to_dict(),
        "server": {"endpoint": check.endpoint.public, "model": info.model, "version": info.version,
                   "system_fingerprints": fingerprints, "model_card": check.model_card,
                   "token_ids": info.token_ids},
        "dtype": config.dtype, "sizes": list(check.sizes),
        "sizes_capped_at": _cap(check),
        "targets": [t.name for t in check.targets],
        "requests": sum(len(b) for unit, _ in results.values() for b in unit.bursts),
        "fillers_failed": sum(r.fillers_failed for _, r in results.values()),
        "seconds": seconds, "unit_seconds": {name: round(result.seconds, 3) for name, (_, result) in results.items()},
        "expect": config.expect, "failed": list(failed),
        "axes": [axes[a].to_dict() for a in AXES],
        "noise": {"file": NOISE_FILE, "unit": noise.unit, "dtype": noise.dtype,
                  "changed": {f"{lv.axis}.{lv.level}": NoiseModel(noise.unit, noise.dtype, lv.shifts).changed
                              if lv.shifts else None for lv in noise.levels}},
    }
    directory = check.directory
    write_json(directory.path / NOISE_FILE, noise.to_json())
    all_traces = [t for traces in by_name.values() for t in traces]
    write_table(directory.path / TRACES_FILE, pa.Table.from_pylist([vars(t) for t in all_traces], schema=TRACE_SCHEMA))
    write_json(directory.path / VOCAB_FILE, vocab.to_json())
    atomic_write_text(directory.path / MARKDOWN_FILE, conformance_markdown(data))
    write_json(directory.path / RESULT_FILE, data)  # last: a directory with it is a finished check
    directory.finish()
    return ConformanceResult(directory.path, data, failed)

