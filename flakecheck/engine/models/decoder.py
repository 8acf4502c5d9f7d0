"""The dense decoder every family here is: embeddings, N layers of attention and a gated MLP with their norms,
a final norm and the LM head — each family's departures from Llama read from its config's `Traits`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from flakecheck.engine.forward_batch import ForwardBatch
from flakecheck.engine.kv_cache import KVCache
from flakecheck.engine.layers.activation import GATED_ACTIVATIONS
from flakecheck.engine.layers.attention import Attention
from flakecheck.engine.layers.embedding import Embedding, LMHead
from flakecheck.engine.layers.linear import Linear
from flakecheck.engine.layers.parallel import COLUMN, ROW, Sharding
from flakecheck.engine.layers.rmsnorm import RMSNorm
from flakecheck.engine.layers.rotary import RotaryEmbedding
from flakecheck.engine.model_config import POST, PRE, SANDWICH, ModelConfig
from flakecheck.engine.models.shapes import model_dims, sharded_dims
from flakecheck.kernels import Ops
from flakecheck.kernels.tensor_parallel import qkv_columns, shard_bounds

Weights = dict[str, torch.Tensor]
# how a family's rotary module is made from its config: (hf_config) -> a transformers *RotaryEmbedding
RotaryFactory = Callable[[Any], Any]


class MLP:
    def __init__(self, gate_up: Linear, down: Linear, activation: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.gate_up, self.down, self.activation = gate_up, down, activation

    def __call__(self, x: torch.Tensor, layout: Any) -> torch.Tensor:
        return self.down(self.activation(self.gate_up(x, layout)), layout)


class DecoderLayer:
    """attention then MLP, each `x + m * out(block(in(x)))` with the norms the family places (`in`: PRE and
    SANDWICH; `out`: SANDWICH and POST) and its residual multiplier `m` (1 but for Granite)."""

    def __init__(self, attn: Attention, mlp: MLP, norms: dict[str, RMSNorm], rope: str,
                 residual_multiplier: float = 1.0) -> None:
        self.attn, self.mlp, self.rope = attn, mlp, rope
        self.attn_in, self.attn_out = norms.get("attn_in"), norms.get("attn_out")
        self.mlp_in, self.mlp_out = norms.get("mlp_in"), norms.get("mlp_out")
        self.multiplier = residual_multiplier

    def __call__(self, hidden: torch.Tensor, batch: ForwardBatch, cache: KVCache,
                 rope: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        layout = batch.layout
        norm = layout.norm(1) if layout is not None else None
        x = self.attn_in(hidden, norm) if self.attn_in is not None else hidden
        out = self.attn(x, batch, cache, rope[self.rope])
        hidden = hidden + self._out(out, self.attn_out, norm)
        x = self.mlp_in(hidden, norm) if self.mlp_in is not None else hidden
        return hidden + self._out(self.mlp(x, layout), self.mlp_out, norm)

    def _out(self, out: torch.Tensor, norm: RMSNorm | None, groups: Any) -> torch.Tensor:
        if norm is not None:
            out = norm(out, groups)
        return out if self.multiplier == 1.0 else out * self.multiplier


# where each norm's weight is named, by placement: (attn_in, attn_out, mlp_in, mlp_out)
NORM_NAMES = {
    PRE: ("input_layernorm", None, "post_attention_layernorm", None),
    SANDWICH: ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"),
    POST: (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
}


class DecoderLM:
    """A dense decoder-only causal LM over transformers' weight names (fused `qkv_proj` / `gate_up_proj` where the
    family stores them fused, as Phi-3 does)."""

    def __init__(self, config: ModelConfig, weights: Weights, ops: Ops, max_len: int,
                 rotary: RotaryFactory) -> None:
        self.config, self.ops = config, ops
        t = config.traits
        embed = weights["model.embed_tokens.weight"]
        self.dims = model_dims(config, embed.dtype.itemsize)
        self.sharded = sharded_dims(config, embed.dtype.itemsize)  # the columns each rank owns, shardable or not
        kinds = sorted(set(t.layer_rope)) if t.layer_rope else [""]
        module = rotary(config.hf_config)
        self.rotary = {kind: RotaryEmbedding(module, max_len, embed.dtype, embed.device, kind or None)
                       for kind in kinds}
        self.embed = Embedding(embed, t.embed_scale, t.embed_scale_in_dtype)
        self.layers = [self._layer(i, weights) for i in range(config.num_layers)]
        self.norm = RMSNorm(ops, weights["model.norm.weight"], config.rms_norm_eps, t.norm_weight)
        head = weights.get("lm_head.weight", embed)
        self.lm_head = LMHead(ops, head, Sharding(COLUMN, lambda n: _slices(head.shape[0], n)), t.final_softcap,
                              t.logits_divisor)
        self.group = config.num_heads // config.num_kv_heads  # query heads per KV head

    def _norm(self, w: Weights, name: str | None, width_prefix: str) -> RMSNorm | None:
        if name is None:
            return None
        c = self.config
        return RMSNorm(self.ops, w[f"{width_prefix}{name}.weight"], c.rms_norm_eps, c.traits.norm_weight)

    def _layer(self, i: int, w: Weights) -> DecoderLayer:
        c, ops, p, t = self.config, self.ops, f"model.layers.{i}.", self.config.traits
        shards = self.sharded
        qkv_sharding = Sharding(COLUMN, lambda n: qkv_columns(shards, n))
        if f"{p}self_attn.qkv_proj.weight" in w:
            qkv = Linear(ops, w[f"{p}self_attn.qkv_proj.weight"], w.get(f"{p}self_attn.qkv_proj.bias"), qkv_sharding)
        else:
            names = ("q_proj", "k_proj", "v_proj")
            biases = [w[f"{p}self_attn.{n}.bias"] for n in names] if f"{p}self_attn.q_proj.bias" in w else None
            qkv = Linear.fused(ops, [w[f"{p}self_attn.{n}.weight"] for n in names], biases, qkv_sharding)
        o_proj = Linear(ops, w[f"{p}self_attn.o_proj.weight"], w.get(f"{p}self_attn.o_proj.bias"),
                        Sharding(ROW, lambda n: _slices(c.num_heads * c.head_dim, n)))
        q_norm = k_norm = None
        if t.qk_norm is not None:
            q_norm = RMSNorm(ops, w[f"{p}self_attn.q_norm.weight"], c.rms_norm_eps, t.norm_weight)
            k_norm = RMSNorm(ops, w[f"{p}self_attn.k_norm.weight"], c.rms_norm_eps, t.norm_weight)
        window = t.layer_windows[i] if t.layer_windows else None
        attn = Attention(ops, i, qkv, o_proj, c.num_heads, c.num_kv_heads, c.head_dim, q_norm, k_norm,
                         t.qk_norm or "head", window, t.attention_scale, t.attn_softcap)
        mlp = self._mlp(i, w)
        roles = ("attn_in", "attn_out", "mlp_in", "mlp_out")
        norms = {role: norm for role, name in zip(roles, NORM_NAMES[t.norms])
                 if (norm := self._norm(w, name, p)) is not None}
        rope = t.layer_rope[i] if t.layer_rope else ""
        return DecoderLayer(attn, mlp, norms, rope, t.residual_multiplier)

    def _mlp(self, i: int, w: Weights) -> Any:
        """Layer i's MLP (a mixture of experts overrides it)."""
        return self._dense_mlp(w, f"model.layers.{i}.mlp.", self.config.intermediate_size)

    def _dense_mlp(self, w: Weights, prefix: str, inter: int) -> MLP:
        """The gated MLP whose weights are under `prefix`, `inter` wide."""
        ops = self.ops
        gate_up_sharding = Sharding(COLUMN, lambda n: [torch.cat((s, inter + s)) for s in _slices(inter, n)])
        if f"{prefix}gate_up_proj.weight" in w:
            gate_up = Linear(ops, w[f"{prefix}gate_up_proj.weight"], w.get(f"{prefix}gate_up_proj.bias"),
                             gate_up_sharding)
        else:
            biases = [w[f"{prefix}{n}.bias"] for n in ("gate_proj", "up_proj")] if f"{prefix}gate_proj.bias" in w \
                else None
            gate_up = Linear.fused(ops, [w[f"{prefix}gate_proj.weight"], w[f"{prefix}up_proj.weight"]], biases,
                                   gate_up_sharding)
        down = Linear(ops, w[f"{prefix}down_proj.weight"], w.get(f"{prefix}down_proj.bias"),
                      Sharding(ROW, lambda n: _slices(inter, n)))
        return MLP(gate_up, down, GATED_ACTIVATIONS[self.config.traits.activation])

    def forward(self, batch: ForwardBatch, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (model dtype) and log-probabilities (fp32) [rows, vocab] at every sampling row."""
        hidden = self.embed(batch.token_ids)
        rope = {kind: table.tables(batch.positions) for kind, table in self.rotary.items()}  # once for all layers
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
