"""Replay on a Ray cluster: shards of a run on replay actors, each holding the model once.

The driver plans the shards (flakecheck.replay.shards), hands them out as actors free up (the largest
first), streams each finished shard's traces back as Arrow IPC, and reports every finished case to the
one progress bar as it happens. Every actor reports its machine fingerprint and the kernel paths its
self-check verified; a cluster whose actors differ is refused unless mixing is allowed (then recorded).
An actor lost mid-shard (its process killed, its node gone) loses only that shard, which goes to another
actor; a shard that fails for another reason fails the run. Ray is an optional dependency
(`pip install flakecheck[ray]`): nothing imports it unless `--ray` is given.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import torch

from flakecheck.data.rundir import TRACE_SCHEMA
from flakecheck.data.traces import Trace
from flakecheck.engine import build_model
from flakecheck.engine.models import probe_dims
from flakecheck.engine.settings import EngineSettings
from flakecheck.engine.spec import resolve_engine
from flakecheck.errors import UserError
from flakecheck.kernels.policy import KernelPolicy
from flakecheck.machine.pinning import PINS
from flakecheck.replay.requests import CaseRequest
from flakecheck.replay.shards import Shard
from flakecheck.replay.simulated import Simulation

LOCAL = "local"
TRACE_FIELDS = ("case_id", "composition", "repeat", "token_ids", "top1_ids", "top1_logprobs", "top2_ids",
                "top2_logprobs", "finish_reason", "top1_logits", "routing_margins", "routing_layers", "routing_digests")


@dataclass(frozen=True)
class ClusterSettings:
    address: str  # "local": start a local cluster; "auto": join the running one (RAY_ADDRESS); or an address
    workers: int = 2
    cpus_per_worker: int | None = None  # None: the cluster's CPUs shared out evenly
    allow_mixed_devices: bool = False


@dataclass
class ClusterStats:
    workers: list[dict[str, Any]] = field(default_factory=list)  # each actor: host, pid, fingerprint, paths
    shards: int = 0
    retries: int = 0  # shards run again after their actor was lost
    lost_workers: int = 0
    shard_rows: list[int] = field(default_factory=list)  # predicted rows of each shard
    computed_rows: int = 0  # rows the actors' locksteps computed
    mixed_devices: bool = False
    seconds: float = 0.0


def traces_to_ipc(traces: Sequence[Trace]) -> bytes:
    table = pa.Table.from_pylist([vars(t) for t in traces], schema=TRACE_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def traces_from_ipc(data: bytes) -> list[Trace]:
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    return [Trace.from_record(row) for row in table.to_pylist()]


class ReplayWorker:
    """A Ray actor (made remote in `Cluster.start`): the model once, then shard after shard."""

    def __init__(self, engine: EngineSettings, also: tuple[KernelPolicy, ...], threads: int) -> None:
        torch.set_num_threads(threads)
        self.loaded = engine.load()
        self.spec = resolve_engine(engine, probe_dims(self.loaded.config), also=also)
        self.network = build_model(self.loaded, self.spec.ops(also_plans=also))

    def describe(self) -> dict[str, Any]:
        return {"host": socket.gethostname(), "pid": os.getpid(), "machine": self.spec.machine.to_dict(),
                "machine_summary": self.spec.machine.describe(), "paths": self.spec.paths.to_dict(),
                "simulated": self.spec.simulated}

    def run(self, cases: list[CaseRequest], shard: Shard, progress: Any,
            windows: dict[str, int] | None = None) -> tuple[bytes, int]:
        """The shard's traces (Arrow IPC) and the rows its lockstep computed; each finished case is put on
        `progress` (a Ray queue) as (case id, tokens). `windows`: only those cases' first tokens (explain)."""
        traces: list[Trace] = []

        def done(trace: Trace) -> None:
            if progress is not None:
                progress.put_nowait((trace.case_id, len(trace.token_ids)))

        simulation = Simulation(self.loaded, self.network, cases, list(shard.jobs), done,
                                lambda run: traces.extend(run.ordered()), windows=windows)
        simulation.lockstep.run()
        return traces_to_ipc(traces), simulation.lockstep.stats.rows


class Cluster:
    """The driver's handle on the actors: start, run shards, stop (always, also on Ctrl-C)."""

    def __init__(self, settings: ClusterSettings, engine: EngineSettings, also: tuple[KernelPolicy, ...] = ()) -> None:
        """`engine`: what every actor builds (each verifies it on its own machine); `also`: other policies a
        job may plan with (explain's one-class policies)."""
        self.settings, self.engine, self.also = settings, engine, also
        self.actors: list[Any] = []
        self.stats = ClusterStats()
        self._started_local = False
        self._ray: Any = None

    def start(self) -> None:
        """Join or start the cluster and its actors; UserError (exit 2) when it cannot be reached, Ray is not
        installed, or the actors' machines differ (unless allowed)."""
        try:
            import ray
        except ImportError:
            raise UserError("--ray needs Ray: pip install 'flakecheck[ray]' (or pip install ray)") from None
        self._ray = ray
        s = self.settings
        env = {k: os.environ[k] for k in (*PINS, "FLAKECHECK_PIN", "FLAKECHECK_FAULT", "FLAKECHECK_CACHE",
                                          "HF_HUB_OFFLINE") if k in os.environ}
        _reachable(s.address)
        try:
            if s.address == LOCAL:
                cpus = s.workers * (s.cpus_per_worker or 1)
                ray.init(num_cpus=cpus, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
                         runtime_env={"env_vars": env}, configure_logging=False)
                self._started_local = True
            else:
                ray.init(address=s.address, log_to_driver=False, runtime_env={"env_vars": env},
                         configure_logging=False)
        except Exception as exc:  # noqa: BLE001 - whatever Ray raises for an unreachable cluster
            raise UserError(f"--ray {s.address}: cannot reach the Ray cluster ({type(exc).__name__}: {exc})") from None
        cpus = s.cpus_per_worker or max(1, int(ray.cluster_resources().get("CPU", s.workers)) // s.workers)
        remote = ray.remote(num_cpus=cpus, max_restarts=0, max_task_retries=0)(ReplayWorker)
        self.actors = [remote.remote(self.engine, self.also, cpus) for _ in range(s.workers)]
        try:
            described = ray.get([a.describe.remote() for a in self.actors])
        except Exception as exc:  # noqa: BLE001 - an actor that cannot build the engine (a refused policy...)
            self.stop()
            raise UserError(f"--ray: a replay actor could not start: {_cause(exc)}") from None
        self.stats.workers = described
        try:
            self.stats.mixed_devices = check_same_machines(described, s.allow_mixed_devices)
        except UserError:
            self.stop()
            raise

    def run(self, cases: Sequence[CaseRequest], shards: Sequence[Shard], on_shard: Callable[[Shard, list[Trace]], None],
            on_case: Callable[[str, int], None], on_dispatch: Callable[[int, Shard, int], None] | None = None,
            windows: dict[str, int] | None = None) -> None:
        """Every shard on a free actor, largest first; `on_shard` gets each finished shard's traces, `on_case`
        each finished case as it happens. `on_dispatch(actor index, shard, actor pid)` is for tests; `windows`
        asks for only some cases' first tokens (see flakecheck.replay.simulated.Simulation)."""
        ray = self._ray
        from ray.util.queue import Queue  # Ray is optional (flakecheck[ray]): loaded with --ray only

        started = time.perf_counter()
        queue = Queue()
        case_list = ray.put(list(cases))
        todo = sorted(shards, key=lambda s: -s.rows)
        self.stats.shards = len(todo)
        self.stats.shard_rows = [s.rows for s in shards]
        live = list(range(len(self.actors)))
        idle = list(live)
        running: dict[Any, tuple[int, Shard]] = {}
        try:
            while todo or running:
                while todo and idle:
                    index, shard = idle.pop(0), todo.pop(0)
                    ref = self.actors[index].run.remote(case_list, shard, queue, windows)
                    running[ref] = (index, shard)
                    if on_dispatch is not None:
                        on_dispatch(index, shard, self.stats.workers[index]["pid"])
                ready, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
                self._drain(queue, on_case)
                for ref in ready:
                    index, shard = running.pop(ref)
                    try:
                        data, rows = ray.get(ref)
                    except ray.exceptions.RayActorError:
                        # the actor's process is gone: only this shard is lost; it goes to another actor
                        live.remove(index)
                        self.stats.lost_workers += 1
                        self.stats.retries += 1
                        if not live:
                            raise UserError("--ray: every replay actor was lost; finished shards are saved") from None
                        todo.insert(0, shard)
                        continue
                    except ray.exceptions.RayTaskError as exc:
                        raise RuntimeError(f"shard {shard.index} failed on its actor: {_cause(exc)}") from None
                    self.stats.computed_rows += rows
                    on_shard(shard, traces_from_ipc(data))
                    idle.append(index)
            self._drain(queue, on_case)
        finally:
            # shards still in flight (Ctrl-C, a failed shard) end with their actors, which `stop` kills
            self.stats.seconds = time.perf_counter() - started

    @staticmethod
    def _drain(queue: Any, on_case: Callable[[str, int], None]) -> None:
        while not queue.empty():
            case_id, tokens = queue.get_nowait()
            on_case(case_id, tokens)

    def stop(self) -> None:
        """Kill the actors, and the cluster when this driver started it: nothing is left running."""
        ray = self._ray
        if ray is None:
            return
        for actor in self.actors:
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors = []
        if ray.is_initialized():
            ray.shutdown()
        self._ray = None


def check_same_machines(described: Sequence[dict[str, Any]], allow: bool) -> bool:
    """Whether the actors' machines or kernel paths differ (then allowed, and recorded); UserError naming them
    when they differ and mixing is not allowed: their bits could differ."""
    kinds = {(json.dumps(d["machine"], sort_keys=True), json.dumps(d["paths"], sort_keys=True)) for d in described}
    if len(kinds) <= 1:
        return False
    if not allow:
        listing = "; ".join(f"{d['host']} pid {d['pid']}: {d['machine_summary']}" for d in described)
        raise UserError(f"--ray: the actors run on different machines or kernel paths, so their bits could differ "
                        f"({listing}); use machines of one kind or --allow-mixed-devices")
    return True


def _reachable(address: str) -> None:
    """A host:port that accepts no connection is refused at once (Ray itself retries for minutes)."""
    if address in (LOCAL, "auto") or "://" in address or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except (OSError, ValueError) as exc:
        raise UserError(f"--ray {address}: cannot reach the Ray cluster ({type(exc).__name__}: {exc})") from None


def _cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__
