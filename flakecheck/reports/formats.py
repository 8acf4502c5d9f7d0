"""Every output format, registered once with the commands that render it, and the one reading of `--format`.

A command supplies the text of each format it offers (`Renderers`). `--format NAME` prints one on stdout
(terminal unless given); `--format NAME=PATH` writes one to a file, and may be repeated (`gate --format
junit=out/junit.xml --format markdown=out/gate.md`). The flags commands grew before (`--json`, `--markdown
PATH`, `--junit PATH`, `--html PATH`) are aliases that `choose_outputs` folds into the same choice, so old
scripts keep working. This module loads with the command line (each command's `--format` help names what it
offers): it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flakecheck.errors import UserError


@dataclass(frozen=True)
class Format:
    name: str
    help: str
    commands: tuple[str, ...]  # the commands that render it
    to_file: bool = True  # terminal is rich text for a person: stdout only


FORMATS: dict[str, Format] = {}


def register(name: str, help: str, commands: Sequence[str], to_file: bool = True) -> Format:
    if name in FORMATS:
        raise ValueError(f"format {name!r} is registered twice")
    FORMATS[name] = Format(name, help, tuple(commands), to_file)
    return FORMATS[name]


TERMINAL = register("terminal", "rich text for a person (the default)",
                    ("report", "gate", "compare", "conformance", "explain", "diff"), to_file=False)
MARKDOWN = register("markdown", "GitHub markdown (a PR comment, a job summary)",
                    ("report", "gate", "conformance", "explain", "diff"))
JSON = register("json", "one JSON object", ("report", "compare", "conformance", "explain", "diff"))
HTML = register("html", "a self-contained HTML page", ("report", "diff"))
JUNIT = register("junit", "JUnit XML (CI test results)", ("gate", "diff"))


def offered(command: str) -> tuple[str, ...]:
    """The formats `command` renders, in the registry's order."""
    return tuple(name for name, f in FORMATS.items() if command in f.commands)

Renderers = Mapping[str, Callable[[], str]]  # format name -> its text (terminal is printed by the command)


@dataclass(frozen=True)
class Outputs:
    stdout: str = TERMINAL.name  # the format printed on stdout
    files: tuple[tuple[str, Path], ...] = ()  # (format, path) in the order given

    def wants(self, name: str) -> bool:
        return self.stdout == name or any(f == name for f, _ in self.files)


def format_help(command: str) -> str:
    """`command`'s `--format` help."""
    return (f"{' | '.join(offered(command))}: printed on stdout (default terminal); NAME=PATH writes that format "
            "to a file instead (repeatable)")


def choose_outputs(given: str | Sequence[str] | None, command: str, *, json: bool = False,
                   files: Mapping[str, Path | None] | None = None) -> Outputs:
    """The outputs `--format` asks for (`given`: NAME or NAME=PATH entries), with the old flags folded in:
    `json` (--json, stdout) and `files` (format -> the path an old flag such as --junit gave). UserError
    (exit 2) naming --format for an unknown format, one this command does not render, or two on stdout."""
    choices = offered(command)
    entries = [given] if isinstance(given, str) else list(given or ())
    stdout: list[str] = [JSON.name] if json else []
    written = [(name, Path(path)) for name, path in (files or {}).items() if path is not None]
    for entry in entries:
        name, sep, path = entry.partition("=")
        name = name.strip().lower()
        if name not in FORMATS:
            raise UserError(f"unknown --format {name!r}; choose {', '.join(choices)}")
        if name not in choices:
            raise UserError(f"--format {name}: `{command}` does not render {name}; choose {', '.join(choices)}")
        if not sep:
            stdout.append(name)
        elif not FORMATS[name].to_file:
            raise UserError(f"--format {entry}: {name} prints on stdout only")
        elif not path:
            raise UserError(f"--format {entry}: give the file after '=' (e.g. {name}=report.{name})")
        else:
            written.append((name, Path(path)))
    if len(set(stdout)) > 1:
        raise UserError(f"--format: one format on stdout, got {', '.join(dict.fromkeys(stdout))} (--json is "
                        "--format json); write the others to files with NAME=PATH")
    return Outputs(stdout[0] if stdout else TERMINAL.name, tuple(written))


def write_files(outputs: Outputs, renderers: Renderers) -> None:
    """Each file `outputs` asks for, written atomically; UserError (exit 2) naming a path that cannot be."""
    from flakecheck.data.rundir import atomic_write_text  # pandas and pyarrow: not for `--help`

    for name, path in outputs.files:
        text = renderers[name]()
        try:
            atomic_write_text(path, text)
        except OSError as exc:
            raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from exc
