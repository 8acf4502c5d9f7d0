"""The Llama family as transformers configures it: Llama, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm)."""

from __future__ import annotations

import torch

from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.layers.activation import silu_and_mul
from flakecheck.engine.layers.attention import Attention
from flakecheck.engine.layers.embedding import Embedding, LMHead
from flakecheck.engine.layers.linear import Linear
from flakecheck.engine.layers.parallel import COLUMN, ROW, Sharding
from flakecheck.engine.layers.rmsnorm import RMSNorm
from flakecheck.engine.layers.rotary import RotaryEmbedding
from flakecheck.engine.model_config import ModelConfig
from flakecheck.kernels import ModelDims, Ops
from flakecheck.kernels.tensor_parallel import ShardedDims, qkv_columns, shard_bounds


class DecoderLayer:
    def __init__(self, attn: Attention, gate_up: Linear, down: Linear, input_norm: RMSNorm,
                 post_norm: RMSNorm) -> None:
        self.attn, self.gate_up, self.down = attn, gate_up, down
        self.input_norm, self.post_norm = input_norm, post_norm

    def __call__(self, hidden: torch.Tensor, batch: ForwardBatch, cache: KVCache,
                 rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        layout = batch.layout
        norm = layout.norm(1) if layout is not None else None
        hidden = hidden + self.attn(self.input_norm(hidden, norm), batch, cache, rope)
        return hidden + self.down(silu_and_mul(self.gate_up(self.post_norm(hidden, norm), layout)), layout)


class LlamaForCausalLM:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], ops: Ops, max_len: int) -> None:
        self.config, self.ops = config, ops
        embed = weights["model.embed_tokens.weight"]
        self.sharded = ShardedDims(config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size,
                                   config.vocab_size, config.hidden_size, embed.dtype.itemsize)
        self.rotary = RotaryEmbedding(config.hf_config, max_len, embed.dtype, embed.device)
        self.embed = Embedding(weights["model.embed_tokens.weight"])
        self.layers = [self._layer(i, weights) for i in range(config.num_layers)]
        self.norm = RMSNorm(ops, weights["model.norm.weight"], config.rms_norm_eps)
        head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
        self.lm_head = LMHead(ops, head, Sharding(COLUMN, lambda n: _slices(head.shape[0], n)))
        first = self.layers[0]
        rows_per_token = (1, config.num_heads, config.num_kv_heads) if config.qk_norm else (1,)
        projections = (first.attn.qkv, first.attn.o_proj, first.gate_up, first.down)
        # a plan holds one order per shape: projections that share a shape must shard alike (else the model
        # runs unsharded only)
        shardable = len({p.shape for p in projections}) == len({(p.shape, p.sharding.kind, p is first.attn.qkv)
                                                                 for p in projections if p.sharding is not None})
        self.dims = ModelDims(
            projections=tuple(dict.fromkeys(p.shape for p in projections)),
            lm_head=self.lm_head.proj.shape,
            kv_heads=config.num_kv_heads,
            norm_rows_per_token=tuple(dict.fromkeys(rows_per_token)),
            sharded=self.sharded if shardable else None,
            qkv=first.attn.qkv.shape,
            row_parallel=tuple(dict.fromkeys(p.shape for p in (first.attn.o_proj, first.down))),
        )
        self.group = config.num_heads // config.num_kv_heads  # query heads per KV head

    def _layer(self, i: int, w: dict[str, torch.Tensor]) -> DecoderLayer:
        c, ops, p = self.config, self.ops, f"model.layers.{i}."
        names = ("q_proj", "k_proj", "v_proj")
        biases = [w[f"{p}self_attn.{n}.bias"] for n in names] if c.qkv_bias else None
        sharded = self.sharded
        qkv = Linear.fused(ops, [w[f"{p}self_attn.{n}.weight"] for n in names], biases,
                           Sharding(COLUMN, lambda n: qkv_columns(sharded, n)))
        o_bias = w.get(f"{p}self_attn.o_proj.bias")
        o_proj = Linear(ops, w[f"{p}self_attn.o_proj.weight"], o_bias,
                        Sharding(ROW, lambda n: _slices(c.num_heads * c.head_dim, n)))
        q_norm = k_norm = None
        if c.qk_norm:
            q_norm = RMSNorm(ops, w[f"{p}self_attn.q_norm.weight"], c.rms_norm_eps)
            k_norm = RMSNorm(ops, w[f"{p}self_attn.k_norm.weight"], c.rms_norm_eps)
        attn = Attention(ops, i, qkv, o_proj, c.num_heads, c.num_kv_heads, c.head_dim, q_norm, k_norm)
        mlp_biases = [w[f"{p}mlp.{n}.bias"] for n in ("gate_proj", "up_proj")] if c.mlp_bias else None
        inter = c.intermediate_size
        gate_up = Linear.fused(ops, [w[f"{p}mlp.gate_proj.weight"], w[f"{p}mlp.up_proj.weight"]], mlp_biases,
                               Sharding(COLUMN, lambda n: [torch.cat((s, inter + s)) for s in _slices(inter, n)]))
        down = Linear(ops, w[f"{p}mlp.down_proj.weight"], w.get(f"{p}mlp.down_proj.bias"),
                      Sharding(ROW, lambda n: _slices(inter, n)))
        return DecoderLayer(
            attn,
            gate_up,
            down,
            RMSNorm(ops, w[f"{p}input_layernorm.weight"], c.rms_norm_eps),
            RMSNorm(ops, w[f"{p}post_attention_layernorm.weight"], c.rms_norm_eps),
        )

    def forward(self, batch: ForwardBatch, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (model dtype) and log-probabilities (fp32) [rows, vocab] at every sampling row."""
        hidden = self.embed(batch.token_ids)
        rope = self.rotary.tables(batch.positions)  # looked up once for all layers
        for layer in self.layers:
            hidden = layer(hidden, batch, cache, rope)
        if batch.sample_rows is not None:  # the final norm and lm_head only where a token is sampled
            hidden = hidden[batch.sample_rows]
        if hidden.shape[0] == 0:  # a step of prompt chunks that sample nothing
            empty = hidden.new_empty((0, self.config.vocab_size))
            return empty, empty.float()
        layout = batch.layout
        return self.lm_head(self.norm(hidden, layout.final() if layout is not None else None), layout)


def _slices(width: int, size: int) -> list[torch.Tensor]:
    """Each rank's contiguous columns of a dimension of `width` (gate and up: its part of each)."""
    return [torch.arange(lo, hi) for lo, hi in shard_bounds(width, size)]
