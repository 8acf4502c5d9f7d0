"""A decoder's reduction shapes from its config alone (no weights): what step plans, self-check probes and the
tensor-parallel check read, worked out once."""

from __future__ import annotations

from flakecheck.engine.model_config import HEAD, PROJECTION, ModelConfig
from flakecheck.kernels import ModelDims
from flakecheck.kernels.tensor_parallel import ShardedDims
from flakecheck.machine.invariance_probes import ProbeDims

COLUMN, ROW = "column", "row"


def sharded_dims(c: ModelConfig, act_bytes: int = 2) -> ShardedDims:
    return ShardedDims(c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size, c.hidden_size,
                       act_bytes)


def model_dims(c: ModelConfig, act_bytes: int = 2) -> ModelDims:
    """qkv, o, gate+up and down projections (N, K), the LM head, the norms' rows a token, the windows."""
    hidden, heads, kv, hd, inter = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size
    qkv, o_proj, gate_up, down = ((heads + 2 * kv) * hd, hidden), (hidden, heads * hd), (2 * inter, hidden), \
        (hidden, inter)
    kinds = ((qkv, COLUMN, True), (o_proj, ROW, False), (gate_up, COLUMN, False), (down, ROW, False))
    # a plan holds one order per shape: projections that share a shape must shard alike (else the model
    # runs unsharded only); a mixture of experts is never sharded here
    shardable = len({shape for shape, _, _ in kinds}) == len(set(kinds)) and c.traits.experts is None
    moe = c.traits.experts
    if moe is not None:  # the router, the shared expert and its gate; the dense MLP only where a layer has one
        dense = (gate_up, down) if not all(moe.sparse_layers) else ()
        shared = moe.shared_intermediate_size
        extra = ((moe.num_experts, hidden), *(((2 * shared, hidden), (hidden, shared), (1, hidden)) if shared else ()))
        projections = (qkv, o_proj, *dense, *extra)
    else:
        projections = (qkv, o_proj, gate_up, down)
    rows_per_token = (1, heads, kv) if c.traits.qk_norm == HEAD else (1,)
    return ModelDims(
        projections=tuple(dict.fromkeys(projections)),
        lm_head=(c.vocab_size, hidden),
        kv_heads=kv,
        norm_rows_per_token=tuple(dict.fromkeys(rows_per_token)),
        sharded=sharded_dims(c, act_bytes) if shardable else None,
        qkv=qkv,
        row_parallel=tuple(dict.fromkeys((o_proj, down))),
        windows=c.traits.windows,
        experts=moe.shapes(hidden) if moe is not None else (),
        router=(moe.num_experts, hidden) if moe is not None else None,
    )


def probe_dims(c: ModelConfig) -> ProbeDims:
    """The shapes the machine's self-check probes for this model."""
    dims = model_dims(c)
    widths = [c.hidden_size]
    if c.traits.qk_norm == HEAD:
        widths.append(c.head_dim)
    elif c.traits.qk_norm == PROJECTION:
        widths += [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim]
    projections = tuple(dict.fromkeys(dims.projections + dims.experts))  # the experts' at every routed row count
    return ProbeDims(projections, dims.lm_head, c.num_heads, c.num_kv_heads, c.head_dim,
                     tuple(dict.fromkeys(widths)), dims.windows)
