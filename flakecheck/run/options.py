"""The options of `flakecheck run`, each declared once: its name, type, default, help and the commands that take
it.

From this one table come `flakecheck run`'s typer signature (cli/options.py builds it), the keywords of
`RunConfig.parse` and of the Python API's `run_suite` (their signatures are built here, and a keyword not
declared is refused), the command line a run records and its `--resume` command (`RunConfig.argv`), and
meta.json's `config` block with its reading back (`RunConfig.to_dict`, `RunConfig.from_dict`). Adding a run
option is one `RunOption` here plus its use (for a `field` option: the RunConfig field of the same name).

Loaded by the command line for `--help`: nothing heavy is imported, so the defaults are literals
(tests/test_options.py holds them equal to the engine's own).
"""

from __future__ import annotations

import inspect
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from flakecheck.grading.external import DEFAULT_TIMEOUT_S as GRADER_TIMEOUT_S

DEFAULT_MODEL = "smollm2"  # engine/packaged_models.py
DEFAULT_LOAD = "poisson:16"  # analysis/flip/server_load.py
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # engine/settings.py

# where a value goes: `engine` (EngineSettings.parse's keyword), `field` (the RunConfig field of that name),
# `own` (RunConfig.parse uses it itself: compositions, sampling), `cli` (the command line's alone: folded into
# the others before parsing), `call` (how this invocation runs, not a setting: --resume, progress)
Part = Literal["engine", "field", "own", "cli", "call"]
_SAME = object()
RUN_AND_DIFF = ("run", "diff")  # diff runs two suites under the same options when given suites
ENGINE_COMMANDS = ("run", "diff", "serve")  # serve builds the same engine


@dataclass(frozen=True)
class RunOption:
    name: str  # the keyword of RunConfig.parse and run_suite, meta.json's key, the CLI's parameter
    default: Any  # as the Python API takes it
    help: str
    part: Part = "field"
    cli: Any = str  # the type typer reads; None: not on the command line
    flag: str | None = None  # the command line's flag when it is not --<name>
    cli_default: Any = _SAME  # the command line's default when it differs from `default`
    from_cli: Callable[[Any], Any] | None = None  # the command line's value -> the Python API's
    commands: tuple[str, ...] = ("run",)
    recorded: Callable[[Any], Any] | None = None  # RunConfig -> the value meta.json records (default: its field)
    text: Callable[[Any], str] = str  # a recorded value as the command line's text
    switch: bool = False  # a flag without a value, given when the recorded value is not the default
    old_default: Any = _SAME  # what a meta.json written before the option existed meant

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def cli_value_default(self) -> Any:
        return self.default if self.cli_default is _SAME else self.cli_default

    def api_value(self, cli_value: Any) -> Any:
        return self.from_cli(cli_value) if self.from_cli else cli_value

    @property
    def in_config(self) -> bool:
        """A setting of the run: RunConfig.parse's keyword, in meta.json and on the recorded command line."""
        return self.part in ("engine", "field", "own")

    def record(self, config: Any) -> Any:
        return self.recorded(config) if self.recorded else getattr(config, self.name)

    def argv(self, config: Any, defaults: Any) -> list[str]:
        """This option on the command line that makes `config` again: nothing when it has its default."""
        value = self.record(config)
        if value == self.record(defaults):
            return []
        return [self.option] if self.switch else [self.option, self.text(value)]

    def read(self, data: Mapping[str, Any]) -> Any:
        """Its value in a meta.json `config` block (one written before it existed: what that meant)."""
        if data.get(self.name) is not None:
            return data[self.name]
        return self.default if self.old_default is _SAME else self.old_default


def parse_ids(text: str | None) -> tuple[str, ...]:
    """`--ids a,b`: the case ids, blanks dropped."""
    return tuple(i.strip() for i in text.split(",") if i.strip()) if text else ()


def _engine(key: str) -> Callable[[Any], Any]:
    return lambda config: config.engine.to_dict()[key]


def _sampling(read: Callable[[Any], Any], otherwise: Any) -> Callable[[Any], Any]:
    return lambda config: read(config.sampling) if config.sampling is not None else otherwise


RUN_OPTIONS: tuple[RunOption, ...] = (
    RunOption("model", DEFAULT_MODEL, "smollm2 | a Hugging Face directory | FILE.gguf | a hub id", "engine",
              recorded=_engine("model"), commands=ENGINE_COMMANDS),
    RunOption("dtype", "bfloat16", "bfloat16 | float16 | float32", "engine", recorded=_engine("dtype"),
              commands=ENGINE_COMMANDS),
    RunOption("kernels", "splitk", "splitk (production-like variance) | invariant | native, or one per op class: "
              "matmul=splitk,attention=invariant,norm=invariant", "engine", recorded=_engine("kernels"),
              commands=ENGINE_COMMANDS),
    RunOption("backend", "auto", "auto | torch | triton", "engine", recorded=_engine("backend")),
    RunOption("profile", "auto", "device profile for split counts: auto (on a GPU its own SM count; on the CPU "
              "h100) | h100 | a100 | h200 | l4 | sm<N>", "engine", recorded=_engine("profile"), old_default="h100",
              commands=("run", "serve")),
    RunOption("device", "auto", "auto (CUDA when torch sees a GPU, else cpu) | cpu | cuda | cuda:N", "engine",
              recorded=lambda config: str(config.engine.device), old_default="cpu", commands=ENGINE_COMMANDS),
    RunOption("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION, "on a GPU: the share of its memory the "
              "weights and the KV cache may take", "engine", cli=float, recorded=_engine("gpu_memory_utilization"),
              commands=("run", "serve")),
    RunOption("compositions_file", None, "compositions file (.jsonl or .json)", "cli", cli=Path | None,
              flag="--compositions", commands=RUN_AND_DIFF),
    RunOption("composition", None, "key=value,... (repeatable), e.g. name=b4,max_batch=4", "cli",
              cli=list[str] | None, commands=RUN_AND_DIFF),
    # the Python API's compositions (the command line's two options above, resolved); meta.json records the
    # draws too, the command line the named ones
    RunOption("compositions", None, "the compositions to replay, the reference first (default: the six built-in)",
              "own", cli=None, recorded=lambda config: [c.to_dict() for c in config.compositions]),
    RunOption("max_tokens", 64, "default max new tokens per case", cli=int, commands=RUN_AND_DIFF),
    RunOption("gap_threshold", 0.05, "a top1-top2 logprob gap below this is a near-tie", cli=float),
    RunOption("gap_window", 50, "near-ties count within the first N tokens of the reference", cli=int),
    RunOption("repeat", 1, "replay the compositions N times with other order seeds", cli=int, commands=RUN_AND_DIFF),
    RunOption("limit", None, "only the first N cases", cli=int | None, commands=RUN_AND_DIFF),
    RunOption("ids", (), "only these case ids, comma-separated", cli=str | None, cli_default=None, from_cli=parse_ids,
              recorded=lambda config: list(config.ids), text=",".join, commands=RUN_AND_DIFF),
    RunOption("out", None, "run directory (default reports/<suite>-<UTC time>)", cli=Path | None,
              recorded=lambda config: str(config.out) if config.out is not None else None),
    RunOption("resume", False, "continue an interrupted run in --out", "call", cli=bool),
    RunOption("replay", "auto", "auto | simulated | physical: how compositions are replayed (simulated: all at "
              "once, bitwise equal to physical; native is always physical)"),
    RunOption("input_format", "auto", "auto | chat | raw: how a string `input` is sent", commands=RUN_AND_DIFF),
    RunOption("html", True, "skip report.html", cli=bool, flag="--no-html", cli_default=False,
              from_cli=lambda no_html: not no_html, switch=True, commands=RUN_AND_DIFF),
    RunOption("quiet", False, "print only the summary line", "cli", cli=bool),
    RunOption("progress", False, "show the progress bar", "call", cli=None),
    RunOption("grader", None, "grade outputs with this command instead of the suite's checks: JSONL on its stdin "
              "and stdout (see the README), e.g. 'python grade.py'", cli=str | None,
              recorded=lambda config: list(config.grader), text=shlex.join, commands=RUN_AND_DIFF),
    RunOption("grader_timeout", GRADER_TIMEOUT_S, "seconds the --grader process may take", cli=float,
              text=lambda seconds: f"{seconds:g}"),
    RunOption("ray", None, "replay in shards on a Ray cluster: --ray alone starts a local one, --ray auto joins the "
              "running one (RAY_ADDRESS), or give its address", cli=str | None, flag="--ray"),
    RunOption("workers", 2, "--ray: replay actors (each loads the model once)", cli=int),
    RunOption("cpus_per_worker", None, "--ray: CPUs (threads) per actor (default: shared out)", cli=int | None),
    RunOption("allow_mixed_devices", False, "--ray: run even when actors' machines differ (recorded)", cli=bool,
              switch=True),
    RunOption("sample", 0, "also replay N compositions drawn from --load: each case's observed flip probability "
              "with a 95% interval, and the score's spread under that load; auto: draws in rounds of 4, a case only "
              "while it is undecided (no flip yet, or its interval holds 10%) or ranking it needs more (32 at "
              "most, 8 a case on average, up to 16 while the rates are not expected to rank at Spearman 0.91 "
              "against a flat 32); auto:N: N a case on average (more agree better with a flat 32 and take longer)",
              "own", cli=str, cli_default="0",
              recorded=lambda config: config.auto.spec if config.auto is not None
              else _sampling(lambda s: s.n, 0)(config),
              commands=RUN_AND_DIFF),
    RunOption("load", DEFAULT_LOAD, "--sample: the batch sizes a request meets: poisson:MEAN (MEAN others beside "
              "it), uniform:LO-HI, or a histogram file (serve's /stats JSON, {size: weight}, a list of samples, or "
              "one number a line)", "own", recorded=lambda config: config.load.spec, commands=RUN_AND_DIFF),
    RunOption("sample_seed", 0, "--sample: the seed the compositions are drawn with (same seed, same draws)",
              "own", cli=int, flag="--seed", recorded=_sampling(lambda s: s.seed, 0), commands=RUN_AND_DIFF),
    RunOption("sample_only", False, "--sample: replay the reference and the draws only, not the named "
              "compositions", "cli", cli=bool, flag="--sample-only"),
    RunOption("sample_tp", "1", "--sample: the tensor-parallel sizes a draw may get, e.g. 1,2,4,8", "own",
              flag="--tp", recorded=_sampling(lambda s: list(s.tp_sizes), [1]),
              text=lambda sizes: ",".join(map(str, sizes))),
)
OPTIONS = {o.name: o for o in RUN_OPTIONS}
CONFIG_OPTIONS = tuple(o for o in RUN_OPTIONS if o.in_config)
ENGINE_OPTIONS = tuple(o.name for o in RUN_OPTIONS if o.part == "engine")
FIELD_OPTIONS = tuple(o.name for o in RUN_OPTIONS if o.part == "field")


def cli_options(command: str) -> tuple[RunOption, ...]:
    """The options `command` takes on the command line, in the order its help lists them."""
    return tuple(o for o in RUN_OPTIONS if o.cli is not None and command in o.commands)


def keywords(given: Mapping[str, Any], options: Sequence[RunOption], function: str) -> dict[str, Any]:
    """Every option's value: the given ones over the declared defaults. TypeError (as Python's own) for a
    keyword no option declares."""
    names = {o.name for o in options}
    for name in given:
        if name not in names:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
    return {o.name: given.get(o.name, o.default) for o in options}


def signature(first: Sequence[inspect.Parameter], options: Sequence[RunOption],
              returns: Any = inspect.Signature.empty) -> inspect.Signature:
    """A Python signature: the `first` parameters, then each option as a keyword with its default (what
    `help()` and an editor show for a function that takes **options)."""
    keyword = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default) for o in options]
    return inspect.Signature([*first, *keyword], return_annotation=returns)
