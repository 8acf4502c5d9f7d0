"""`flakecheck probe`: a suite against a real server at several load levels -> a run directory.

check the server (nothing written yet) -> each level in turn (saved as soon as it finishes) ->
the same analysis and run directory as `flakecheck run` -> report.html. Ctrl-C keeps the finished
levels; a level whose request still fails after its retries stops the probe with exit 2, the
finished levels kept, and the message names the failed cases (see flakecheck.probe.level_runner).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flakecheck.analysis.divergence import Thresholds
from flakecheck.data.input_format import AppliedFormat
from flakecheck.data.record import Computer
from flakecheck.data.rundir import RunData
from flakecheck.data.suite import Suite, load_suite
from flakecheck.data.traces import Trace, run_label
from flakecheck.errors import UserError
from flakecheck.probe.bodies import CasePrompt, case_prompts
from flakecheck.probe.client import ClientStats, ServerClient, with_client
from flakecheck.probe.conformance.noise import ServerNoise
from flakecheck.probe.detokenize import fill_token_texts
from flakecheck.probe.discover import ServerInfo, check_prompts, discover
from flakecheck.probe.endpoint import Endpoint, api_key_from_env
from flakecheck.probe.level_runner import LevelFailed, LevelResult, run_level
from flakecheck.probe.levels import REFERENCE, LoadLevel, make_levels
from flakecheck.probe.rounds import AutoRounds, flat_units
from flakecheck.probe.settings import ProbeConfig
from flakecheck.probe.store import ProbeStore
from flakecheck.probe.vocab import Vocab
from flakecheck.run.pipeline import (
    SourceRecord,
    TokenTexts,
    finish_run,
    interruptible,
    open_run_directory,
    render_report,
    saved_message,
)
from flakecheck.run.progress import ReplayProgress

T = TypeVar("T")


# what meta.json keeps of each load level (filler failures: that level ran under less load than asked)
LEVEL_FIELDS = ("seconds", "fillers_sent", "fillers_failed", "filler_errors")


class ProbeFailed(UserError):
    """A request failed for good: finished levels are saved; the message names the failed cases."""


@dataclass
class _Probe:
    config: ProbeConfig
    suite: Suite
    cases: list[CasePrompt]
    input_format: AppliedFormat
    levels: list[LoadLevel]
    endpoint: Endpoint
    api_key: str | None
    info: ServerInfo
    store: ProbeStore
    noise: ServerNoise | None = None  # --noise: the server's measured profile predicts
    rounds: AutoRounds | None = None  # --repeat auto: the rounds, decided as the answers come in


def probe_suite(config: ProbeConfig, *, resume: bool = False, progress: bool = False,
                client_factory: Callable[..., ServerClient] = ServerClient) -> RunData:
    """Probe the server and write the run directory; returns it loaded."""
    started = time.perf_counter()
    probe = _prepare(config, resume, client_factory)
    timings: dict[str, Any] = {"load_s": time.perf_counter() - started}
    with _interruptible(probe):
        traces, texts, tally = _probe_levels(probe, resume, progress, client_factory)
        timings["replay_s"] = tally.seconds
        vocab = tally.vocab
        run = finish_run(probe.store.directory, probe.suite, traces, REFERENCE,
                         Thresholds(config.gap_threshold, config.gap_window),
                         TokenTexts(lambda ids: texts.get(tuple(ids)) or vocab.decode(ids), vocab.text),
                         _record(probe, tally), timings,
                         # every level above the reference, each repeat, is one draw of the server's load
                         draws=[level.name for level in probe.levels if level.name != REFERENCE], started=started,
                         **_noise(probe))
    render_report(run, config.html)
    return run


def _prepare(config: ProbeConfig, resume: bool, client_factory: Callable[..., ServerClient]) -> _Probe:
    """Everything checked, the server included, before the first byte is written."""
    if resume and config.out is None:
        raise UserError("--resume needs --out DIR (the interrupted run directory)")  # before asking the server
    suite = load_suite(config.suite).select(list(config.ids) or None, config.limit)
    noise = ServerNoise.load(config.noise) if config.noise is not None else None
    api_key = api_key_from_env(config.api_key_env)
    endpoint = Endpoint.parse(config.endpoint)
    cases, applied = case_prompts(suite, config.api, config.max_tokens)
    levels = make_levels(list(config.concurrency), config.fillers, config.prefix)

    async def check(client: ServerClient) -> ServerInfo:
        return await discover(client, config.model, config.isolation, check_prompts(cases))

    info = _with_client(config, endpoint, api_key, 4, client_factory, check)
    directory = open_run_directory(suite, config.out, resume, _fingerprint(config, suite, cases, levels, endpoint,
                                                                            info))
    config = config.with_changes(out=directory.path)
    probe = _Probe(config, suite, cases, applied, levels, endpoint, api_key, info, ProbeStore(directory.path), noise)
    if config.auto is not None:
        probe.rounds = AutoRounds(config.auto, levels, cases, config.dtype, _noise(probe).get("noise"))
    return probe


def _noise(probe: _Probe) -> dict[str, Any]:
    """finish_run's noise arguments: the server's profile for the load predicted for, when --noise gave one."""
    if probe.noise is None:
        return {}
    load, prefix = probe.config.prediction_load(), probe.config.prefix
    return {"noise": probe.noise.model(load, prefix), "noise_source": probe.noise.describe(load, prefix)}


def _fingerprint(config: ProbeConfig, suite: Suite, cases: list[CasePrompt], levels: list[LoadLevel],
                 endpoint: Endpoint, info: ServerInfo) -> dict[str, Any]:
    """What decides the traces: a resumed probe must match it (the server's version included)."""
    return {
        "source": "probe", "endpoint": endpoint.public, "model": info.model, "server_version": info.version,
        "token_ids": info.token_ids, "return_tokens_as_token_ids": info.options.token_ids,
        "isolation": config.isolation, "levels": [level.to_dict() for level in levels], "repeat": config.repeat,
        "auto": config.auto.to_dict() if config.auto is not None else None,
        "max_tokens": config.max_tokens, "suite_sha256": suite.sha256,
        "cases": [[c.case_id, c.api, c.max_tokens] for c in cases],
    }


def _with_client(config: ProbeConfig, endpoint: Endpoint, api_key: str | None, connections: int,
                 client_factory: Callable[..., ServerClient], work: Callable[[ServerClient], Awaitable[T]]) -> T:
    return with_client(endpoint, api_key, timeout_s=config.timeout, retries=config.retries, connections=connections,
                       client_factory=client_factory, work=work)


@dataclass
class _Tally:
    """What the probe saw of the server, for meta.json."""

    vocab: Vocab
    seconds: float = 0.0
    requests: int = 0
    attempts: int = 0
    retried: int = 0
    failed_attempts: dict[str, int] = field(default_factory=dict)
    fingerprints: set[str] = field(default_factory=set)
    levels: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add_client(self, stats: ClientStats) -> None:
        self.requests += stats.requests
        self.attempts += stats.attempts
        self.retried += stats.retried
        for kind, n in stats.failures.items():
            self.failed_attempts[kind] = self.failed_attempts.get(kind, 0) + n


def _probe_levels(probe: _Probe, resume: bool, show_progress: bool, client_factory: Callable[..., ServerClient]
                  ) -> tuple[list[Trace], dict[tuple[int, ...], str], _Tally]:
    """Every (level, repeat) in turn, each saved as soon as it is done (or read back on --resume).
    Returns the traces, the server's text per token sequence, and the tally."""
    config, store = probe.config, probe.store
    tally = _Tally(store.load_vocab() if resume else Vocab())
    auto = probe.rounds
    units = auto.units() if auto is not None else flat_units(probe.levels, config.repeat, probe.cases)
    traces: list[Trace] = []
    texts: dict[tuple[int, ...], str] = {}
    with ReplayProgress(_planned_requests(probe), enabled=show_progress) as bar:
        for level, repeat, cases in units:
            label = run_label(level.name, repeat)
            saved = store.saved_level(level.name, repeat)
            if saved is None:
                bar.start(label)
                result, stats = _run_one_level(probe, level, repeat, cases, tally.vocab, bar.case_done,
                                               client_factory)
                store.save_level(level.name, repeat, result, tally.vocab)
                tally.add_client(stats)
                saved = store.saved_level(level.name, repeat)
                assert saved is not None
            else:
                bar.skip(label, len(saved[0]))
            level_traces, extras = saved
            traces.extend(level_traces)
            if auto is not None:
                auto.saw(level_traces)
            tally.seconds += extras["seconds"]
            tally.levels[label] = {k: extras.get(k) for k in LEVEL_FIELDS}
            for trace in level_traces:
                answer = extras["answers"][trace.case_id]
                texts[tuple(trace.token_ids)] = answer["text"]
                if answer.get("system_fingerprint"):
                    tally.fingerprints.add(answer["system_fingerprint"])
    if tally.vocab.needs_text():
        async def fill(client: ServerClient) -> None:
            await fill_token_texts(client, probe.info.model, tally.vocab)

        _with_client(probe.config, probe.endpoint, probe.api_key, 8, client_factory, fill)
        store.save_vocab(tally.vocab)
    return traces, texts, tally


def _planned_requests(probe: _Probe) -> int:
    """The progress bar's total: every level and repeat for every case; under --repeat auto, its budget."""
    n = len(probe.cases)
    auto = probe.config.auto
    if auto is None:
        return probe.config.repeat * len(probe.levels) * n
    return n + int(auto.budget_rounds * n) * (len(probe.levels) - 1)


def _run_one_level(probe: _Probe, level: LoadLevel, repeat: int, cases: list[CasePrompt], vocab: Vocab,
                   on_case_done: Callable[[Trace], None], client_factory: Callable[..., ServerClient]
                   ) -> tuple[LevelResult, ClientStats]:
    async def work(client: ServerClient) -> tuple[LevelResult, ClientStats]:
        result = await run_level(client, probe.info.options, level, repeat, cases, vocab, on_case_done)
        return result, client.stats

    try:
        return _with_client(probe.config, probe.endpoint, probe.api_key, level.concurrency + level.fillers + 2,
                            client_factory, work)
    except LevelFailed as exc:
        raise ProbeFailed(f"{exc}. {_saved_message(probe, 'stopped')}") from None


def _work(probe: _Probe) -> list[tuple[str, int]]:
    return [(level.name, r) for r in range(probe.config.repeat) for level in probe.levels]


def _interruptible(probe: _Probe) -> Any:
    work = _work(probe)
    return interruptible(probe.store.directory, work, _unit(work), probe.config.resume_command(probe.store.path))


def _unit(work: list[tuple[str, int]]) -> str:
    return f"load levels ({', '.join(run_label(n, r) for n, r in work)})"


def _saved_message(probe: _Probe, what: str) -> str:
    work = _work(probe)
    return saved_message(probe.store.directory, work, _unit(work), probe.config.resume_command(probe.store.path),
                         what)


def _record(probe: _Probe, tally: _Tally) -> SourceRecord:
    config, info = probe.config, probe.info
    n_chat = sum(c.api == "chat" for c in probe.cases)
    return SourceRecord(
        source="probe", model=info.model,
        dtype=config.dtype,  # a server does not report it: only when --dtype says
        computer=Computer.server(probe.endpoint.public),  # the reports' header reads "kernels server (<endpoint>)"
        compositions=[level.to_dict() for level in probe.levels], command=config.command(),
        details={
            "config": config.to_dict(), "max_tokens": config.max_tokens, "repeat": config.repeat,
            "adaptive": probe.rounds.summary() if probe.rounds is not None else None,
            "input_format": probe.input_format.to_dict(),
            "server": {
                "endpoint": probe.endpoint.public, "model": info.model, "models_listed": info.models,
                "version": info.version, "system_fingerprints": sorted(tally.fingerprints),
                "token_ids": info.token_ids, "return_tokens_as_token_ids": info.options.token_ids,
                "isolation": config.isolation, "api": {"chat": n_chat, "completions": len(probe.cases) - n_chat},
                "requests": tally.requests, "attempts": tally.attempts, "retried": tally.retried,
                "failed_attempts": tally.failed_attempts, "levels": tally.levels,
            },
            "device": {"type": "server", "endpoint": probe.endpoint.public},
        })
