from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tiny_models import build_tiny_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory):
    """tiny_model_factory(arch) -> a saved tiny random HF directory (built once per session and arch)."""
    built: dict[str, Path] = {}

    def make(architecture: str = "llama") -> Path:
        if architecture not in built:
            built[architecture] = build_tiny_model(tmp_path_factory.mktemp(f"tiny-{architecture}"), architecture)
        return built[architecture]

    return make


@pytest.fixture(scope="session")
def tiny_wide_factory(tmp_path_factory: pytest.TempPathFactory):
    """tiny_wide_factory(arch) -> the family still tiny, but with reductions long enough (K = 256, 768) for split-K
    to split."""
    built: dict[str, Path] = {}

    def make(architecture: str) -> Path:
        if architecture not in built:
            built[architecture] = build_tiny_model(tmp_path_factory.mktemp(f"wide-{architecture}"), architecture,
                                                   init_std=0.05, hidden_size=256, intermediate_size=768)
        return built[architecture]

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def tiny_wide_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Still tiny, but with reductions long enough (K = 256, 768) for split-K to split."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-wide"), "llama", init_std=0.05, hidden_size=256,
                            intermediate_size=768, num_heads=4)


# The modules that take minutes go first: `make test` runs pytest-xdist with whole files per worker, handed out in
# collection order (--dist loadfile --no-loadscope-reorder; by default xdist would send the files with the most
# tests first), so a long file started last would leave the other worker idle while it finishes. The real vLLM
# server (mostly one busy core) runs beside everything else.
LONG_FIRST = ("test_vllm.py", "test_demo_digest.py", "test_harness_real.py", "test_gemma3.py", "test_ray.py",
              "test_moe.py", "test_model_families.py", "test_promptfoo_real.py", "test_engine_parity.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONG_FIRST)))  # stable: the rest keep their order
