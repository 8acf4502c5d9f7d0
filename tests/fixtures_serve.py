"""`flakecheck serve` in-process on a free loopback port, over the tiny wide random model (its K = 256
and 768 reductions are long enough for split-K to split), one server per kernel policy per session.

Import the fixtures into a test module with `from tests.fixtures_serve import *  # noqa: F403`.

- `splitk_server`, `invariant_server`: a `Served` (url, state) each; the real uvicorn + FastAPI app
  and engine loop that `flakecheck serve` runs, started in a thread.
- `start_server(model, **settings)`: a context manager for a server with other settings.

`state.loop.hold()` pauses the engine between steps: requests sent meanwhile all start in the same
step, so a test builds an exact batch instead of relying on timing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flakecheck.engine import LoadedModel, load_model
from flakecheck.serve.app import build_app
from flakecheck.serve.server import BackgroundServer
from flakecheck.serve.state import ServerState, ServeSettings, build_state

SERVED_NAME = "tiny-wide"


@dataclass
class Served:
    url: str
    state: ServerState


@contextlib.contextmanager
def start_server(model: LoadedModel, **settings: Any) -> Iterator[Served]:
    settings = {"model": SERVED_NAME, "max_num_seqs": 16, **settings}
    state = build_state(ServeSettings.parse(**settings), model)
    with BackgroundServer(build_app(state)) as url:
        yield Served(url, state)


@pytest.fixture(scope="session")
def serve_model(tiny_wide_model_dir: Path) -> LoadedModel:
    return load_model(str(tiny_wide_model_dir), "bfloat16")


@pytest.fixture(scope="session")
def splitk_server(serve_model: LoadedModel) -> Iterator[Served]:
    with start_server(serve_model, kernels="splitk") as served:
        yield served


@pytest.fixture(scope="session")
def invariant_server(serve_model: LoadedModel) -> Iterator[Served]:
    with start_server(serve_model, kernels="invariant") as served:
        yield served
