"""`flakecheck kernels check`: probe every op along every axis under each policy.

A probe computes the same rows twice in two batch situations that must not matter to a
batch-invariant kernel, and reports the largest absolute difference between the two. The
invariant policy must show 0 everywhere (exit 1 otherwise: a silent gap must be loud); the
split-K policy is expected to vary, and native is whatever the hardware does. Shapes are
SmolLM2-135M's (hidden 576, intermediate 1536, 9 heads / 3 KV heads of 64, vocab 49152).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
from flakecheck.kernels.layout import AttentionLayout
from flakecheck.kernels.ops import Ops
from flakecheck.kernels.registry import BACKENDS, POLICIES, get_ops

from flakecheck.errors import UserError

OPS = ("matmul", "attention", "rmsnorm", "log_softmax")
AXES = ("batch_size", "position", "chunking", "decode_vs_prefill")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 9, 3, 64, 49152
BATCH_SIZES = (3, 8, 64)
PREFILL = 300
CHUNK = 7
Probe = Callable[[Ops], float]


def check_command(device: str = "cpu", dtype: str = "bfloat16", backend: str = "auto", json_out: bool = False) -> int:
    torch_dtype = _parse(device, dtype, backend)
    results = run_probes(torch.device(device), torch_dtype, backend)
    if json_out:
        print(json.dumps({"device": device, "results": results}))
    else:
        _print_matrix(results, device, dtype, backend)
    failed = [r for r in results if r["policy"] == "invariant" and not r["invariant"]]
    return 1 if failed else 0


def _parse(device: str, dtype: str, backend: str) -> torch.dtype:
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}; choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: no CUDA device is available here")
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "triton" and device == "cpu":
        raise UserError("--backend triton needs --device cuda (on CPU the torch twins run the same orders)")
    return DTYPES[dtype]


def run_probes(device: torch.device, dtype: torch.dtype, backend: str = "auto") -> list[dict]:
    gen = torch.Generator(device="cpu").manual_seed(0)
    probes = _probes(device, dtype, gen)
    results = []
    for policy in POLICIES:
        ops = get_ops(policy, backend, "h100", device)
        for (op, axis), probe in probes.items():
            diff = probe(ops)
            results.append({"policy": policy, "op": op, "axis": axis, "invariant": diff == 0.0,
                            "max_abs_diff": diff})
    return results


def _rand(gen: torch.Generator, *shape: int, scale: float = 1.0, dtype: torch.dtype, device: torch.device):
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        raise AssertionError(f"probe shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    if torch.equal(a, b):
        return 0.0
    d = (a.double() - b.double()).abs()
    return float(torch.nan_to_num(d, nan=float("inf")).max())


def _row_probes(fn: Callable[[Ops, torch.Tensor], torch.Tensor], x: torch.Tensor) -> dict[str, Probe]:
    """The four axes for an op that maps rows to rows: x holds PREFILL rows of one 'sequence'."""

    def batch_size(ops: Ops) -> float:
        alone = fn(ops, x[:1])
        return max(_diff(fn(ops, x[:m])[:1], alone) for m in BATCH_SIZES)

    def position(ops: Ops) -> float:
        rows = x[:16]
        flipped = fn(ops, rows.flip(0)).flip(0)
        return _diff(fn(ops, rows), flipped)

    def chunking(ops: Ops) -> float:
        whole = fn(ops, x)
        parts = torch.cat([fn(ops, x[i : i + CHUNK]) for i in range(0, x.shape[0], CHUNK)])
        return _diff(whole, parts)

    def decode_vs_prefill(ops: Ops) -> float:
        prefill = fn(ops, x)
        decode = torch.cat([fn(ops, x[i : i + 1]) for i in range(0, x.shape[0], 37)])
        return _diff(prefill[::37], decode)

    return {"batch_size": batch_size, "position": position, "chunking": chunking,
            "decode_vs_prefill": decode_vs_prefill}


def _probes(device: torch.device, dtype: torch.dtype, gen: torch.Generator) -> dict[tuple[str, str], Probe]:
    r = lambda *shape, scale=1.0: _rand(gen, *shape, scale=scale, dtype=dtype, device=device)
    qkv_width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    weights = [r(qkv_width, HIDDEN, scale=HIDDEN**-0.5), r(2 * INTER, HIDDEN, scale=HIDDEN**-0.5),
               r(VOCAB, HIDDEN, scale=HIDDEN**-0.5)]
    down = r(HIDDEN, INTER, scale=INTER**-0.5)
    x_hidden = r(PREFILL, HIDDEN)
    x_model = torch.cat((x_hidden, r(PREFILL, INTER)), dim=1)  # a row: a hidden state and an MLP activation

    def matmul(ops: Ops, x: torch.Tensor) -> torch.Tensor:
        # the model's projections on the same rows: qkv, gate_up, lm_head on the hidden part, down on the rest
        outs = [ops.linear(x[:, :HIDDEN], w) for w in weights]
        outs.append(ops.linear(x[:, HIDDEN:], down))
        return torch.cat(outs, dim=1)

    norm_w = r(HIDDEN, scale=0.1) + 1
    logits = r(PREFILL, VOCAB, scale=4.0)
    probes: dict[tuple[str, str], Probe] = {}
    for axis, probe in _row_probes(matmul, x_model).items():
        probes[("matmul", axis)] = probe
    for axis, probe in _attention_probes(device, dtype, gen).items():
        probes[("attention", axis)] = probe
    for axis, probe in _row_probes(lambda ops, x: ops.rmsnorm(x, norm_w, 1e-5), x_hidden).items():
        probes[("rmsnorm", axis)] = probe
    for axis, probe in _row_probes(lambda ops, x: ops.log_softmax(x), logits).items():
        probes[("log_softmax", axis)] = probe
    return probes


def attention_batch(seqs: list[tuple[int, int, int]], device: torch.device | None = None) -> AttentionLayout:
    """The layout of (slot, n_new_rows, context_len) per sequence, packed in that order, as one step."""
    return AttentionLayout.of(seqs)


def _attention_probes(device: torch.device, dtype: torch.dtype, gen: torch.Generator) -> dict[str, Probe]:
    slots, length = 17, 640
    k_cache = _rand(gen, slots, length, KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    v_cache = _rand(gen, slots, length, KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    q_all = _rand(gen, slots, length, HEADS, HEAD_DIM, dtype=dtype, device=device)  # q of slot s, position p
    contexts = [int(c) for c in torch.randint(20, length, (slots,), generator=gen)]
    contexts[0] = 520  # the probed sequence spans three 256-key splits
    scale = HEAD_DIM**-0.5

    def run(ops: Ops, seqs: list[tuple[int, int, int]]) -> list[torch.Tensor]:
        q = torch.cat([q_all[s, c - n : c] for s, n, c in seqs])
        out = ops.attention(q, k_cache, v_cache, attention_batch(seqs, device), scale)
        batch = attention_batch(seqs, device)
        return [out[batch.query_starts[i] : batch.query_starts[i + 1]] for i in range(len(seqs))]

    probe_seq = (0, 1, contexts[0])
    others = [(s, 1, contexts[s]) for s in range(1, slots)]

    def batch_size(ops: Ops) -> float:
        # every sequence of a 16-sequence decode batch, against itself decoded alone
        seqs = [probe_seq] + others[:15]
        together = run(ops, seqs)
        return max(_diff(together[i], run(ops, [seq])[0]) for i, seq in enumerate(seqs))

    def position(ops: Ops) -> float:
        first = run(ops, [probe_seq] + others[:7])[0]
        return _diff(run(ops, others[:7] + [probe_seq])[-1], first)

    def chunking(ops: Ops) -> float:
        ctx = contexts[0]
        whole = run(ops, [(0, ctx, ctx)])[0]
        parts = [run(ops, [(0, min(ctx, lo + 61) - lo, min(ctx, lo + 61))])[0] for lo in range(0, ctx, 61)]
        return _diff(whole, torch.cat(parts))

    def decode_vs_prefill(ops: Ops) -> float:
        ctx = contexts[0]
        prefill = run(ops, [(0, ctx, ctx)])[0]
        positions = (0, 1, 255, 256, 300, ctx - 1)
        decode = torch.cat([run(ops, [(0, 1, p + 1)] + others[:3])[0] for p in positions])
        return _diff(prefill[list(positions)], decode)

    return {"batch_size": batch_size, "position": position, "chunking": chunking,
            "decode_vs_prefill": decode_vs_prefill}


def _print_matrix(results: list[dict], device: str, dtype: str, backend: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kernel invariance probes — device {device}, dtype {dtype}, backend {backend}")
    table.add_column("op")
    table.add_column("axis")
    for policy in POLICIES:
        table.add_column(policy, justify="right")
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for r in results:
        ok = r["invariant"]
        if r["policy"] == "invariant":
            text = "[green]invariant[/]" if ok else f"[bold red]FAIL {r['max_abs_diff']:.2e}[/]"
        else:
            text = "invariant" if ok else f"[yellow]varies {r['max_abs_diff']:.2e}[/]"
        cells.setdefault((r["op"], r["axis"]), {})[r["policy"]] = text
    for (op, axis), row in cells.items():
        table.add_row(op, axis, *(row[p] for p in POLICIES))
    console = Console()
    console.print(table)
    failed = sum(1 for r in results if r["policy"] == "invariant" and not r["invariant"])
    varied = sum(1 for r in results if r["policy"] == "splitk" and not r["invariant"])
    console.print(f"invariant policy: {len(OPS) * len(AXES) - failed}/{len(OPS) * len(AXES)} probes bitwise "
                  f"invariant; splitk varies on {varied} probes")
