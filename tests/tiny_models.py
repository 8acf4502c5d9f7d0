"""Tiny random Llama-family models saved as Hugging Face directories, built in the test session.

A small byte-level BPE tokenizer is trained on a few lines so the tiny models have a real
tokenizer and chat template; weights use a wide init so logits are peaked enough for greedy
decoding to be meaningful, while some steps stay near-tied.
"""

from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "What is 2 + 2? The answer is 4. What is 7 * 6? It is 42.",
    "def add(a, b):\n    return a + b\n",
    '{"name": "Ada", "age": 36, "city": "London"}',
    "Answer with a single letter: A, B, C or D.",
    "Write a haiku about the sea, the wind and the morning light.",
]


def build_tokenizer(path: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


WINDOW = 8  # the tiny windowed models' sliding window: every test prompt is longer
ALTERNATING = ["sliding_attention", "full_attention"]


def family_config(architecture: str, common: dict):  # type: ignore[no-untyped-def]
    """transformers' own config class of each family, with the features that set it apart switched on (sliding
    windows shorter than the prompts, soft caps that bite, partial rotary, multipliers)."""
    import transformers as tf

    inter = common["intermediate_size"]
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=inter // 2)
    gemma = dict(head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW, layer_types=ALTERNATING,
                 hidden_activation="gelu_pytorch_tanh")
    return {
        "llama": lambda: tf.LlamaConfig(**common, tie_word_embeddings=True, rope_theta=10000.0),
        "mistral": lambda: tf.MistralConfig(**common, tie_word_embeddings=False, sliding_window=None),
        "mistral-window": lambda: tf.MistralConfig(**common, tie_word_embeddings=False, sliding_window=WINDOW),
        "qwen2": lambda: tf.Qwen2Config(**common, tie_word_embeddings=False, use_sliding_window=False),
        "qwen2-window": lambda: tf.Qwen2Config(**common, tie_word_embeddings=False, use_sliding_window=True,
                                               sliding_window=WINDOW, max_window_layers=1),
        "qwen3": lambda: tf.Qwen3Config(**common, head_dim=16, tie_word_embeddings=True, use_sliding_window=False),
        "gemma2": lambda: tf.Gemma2Config(**common, **gemma, attn_logit_softcapping=2.0, final_logit_softcapping=5.0),
        "gemma3": lambda: tf.Gemma3TextConfig(
            **common, **gemma, rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}),
        "phi3": lambda: tf.Phi3Config(**common, sliding_window=WINDOW + 4, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
        "olmo2": lambda: tf.Olmo2Config(**common),
        "granite": lambda: tf.GraniteConfig(**common, embedding_multiplier=6.0, residual_multiplier=0.5,
                                            attention_multiplier=0.2, logits_scaling=2.0),
        # mixtures of experts, top-2 of 8: a window (Mixtral), a shared expert (Qwen2-MoE), a dense layer (Qwen3-MoE)
        "mixtral": lambda: tf.MixtralConfig(**common, num_local_experts=8, num_experts_per_tok=2,
                                            sliding_window=WINDOW),
        "qwen2-moe": lambda: tf.Qwen2MoeConfig(**common, **moe, shared_expert_intermediate_size=inter,
                                               norm_topk_prob=False),
        "qwen3-moe": lambda: tf.Qwen3MoeConfig(**common, **moe, head_dim=16, norm_topk_prob=True, mlp_only_layers=[0]),
        "olmoe": lambda: tf.OlmoeConfig(**common, num_experts=8, num_experts_per_tok=2),
    }[architecture]()


def build_tiny_model(path: Path, architecture: str = "llama", seed: int = 0, init_std: float = 0.3,
                     hidden_size: int = 64, intermediate_size: int = 128, num_heads: int = 4) -> Path:
    """Save a tiny random model of `architecture` (a key of FAMILY_CONFIGS) with tokenizer under `path`."""
    from transformers import AutoModelForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(path)
    common = dict(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=2, num_attention_heads=num_heads, num_key_value_heads=num_heads // 2,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        initializer_range=init_std, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = family_config(architecture, common)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # non-trivial norm weights and biases, so the parity test exercises them
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    return path
