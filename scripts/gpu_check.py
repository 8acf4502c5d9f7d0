"""The validation a GPU machine runs, in at most 10 minutes: one JSON summary (also written to OUT/gpu_check.json)
and a table. See docs/gpu.md.

Steps, each in a subprocess with its own time limit, skipped once the whole budget is spent:

0. compile: `flakecheck kernels compile --target sm_XY --json` for this GPU's architecture (all of sm_80, sm_89,
   sm_90, sm_100 on a CPU or an architecture it does not know): every kernel compiles without spills, and the
   matmuls' instruction boundaries on this target, which the kernels check below then probes. When it fails
   nothing else runs: the GPU steps would start from kernels not known to compile here;
1. kernels: tests/test_kernels_triton.py and tests/test_engine_triton.py natively on the GPU;
2. kernels check: `flakecheck kernels check --device DEVICE --json` (the invariant column must hold);
3. demo: the first 24 demo cases under splitk, invariant and native (statuses; invariant bitwise across the
   compositions, read from tokens.parquet);
4. bench engine: the engine against transformers' `generate` on the GPU (native kernels, and invariant);
5. matmul: the fixed-order Triton matmul against cuBLAS (bf16, median ms, ratio, TFLOP/s) on Llama-8B shapes;
6. big: an 8B-shaped model (Llama-3-8B's layers with SmolLM2's tokenizer, random weights made here) — load
   time, peak memory, the first 24 demo cases under invariant kernels.

Usage: python scripts/gpu_check.py [--device cuda:0] [--out DIR] [--budget 570] [--skip big,...]
On a CPU (`--device cpu --quick`) it dry-runs what does not need a GPU, to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "suites" / "demo.jsonl"
POLICIES = ("splitk", "invariant", "native")


def flakecheck(*args: str) -> list[str]:
    return [sys.executable, "-m", "flakecheck", *args]


class Check:
    def __init__(self, budget_s: float, out: Path) -> None:
        self.deadline = time.monotonic() + budget_s
        self.out = out
        self.results: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, command: list[str], limit_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
        """The command's exit code, seconds and output tail; skipped when the budget cannot hold it."""
        if self.left() < 20:
            result: dict[str, Any] = {"status": "skipped", "why": "budget spent"}
        else:
            start = time.monotonic()
            try:
                done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                                      timeout=min(limit_s, self.left()), env={**os.environ, **(env or {})})
                result = {"status": "ok" if done.returncode == 0 else "failed", "exit": done.returncode,
                          "stdout": done.stdout, "tail": (done.stdout + done.stderr)[-1500:]}
            except subprocess.TimeoutExpired as exc:
                result = {"status": "timeout", "tail": str(exc.stdout or "")[-1500:]}
            result["seconds"] = round(time.monotonic() - start, 1)
        print(f"[{name}] {result['status']} {result.get('seconds', '')}", file=sys.stderr, flush=True)
        return result


def demo_run(check: Check, device: str, policy: str, limit: int, max_tokens: int) -> dict[str, Any]:
    out = check.out / f"demo-{policy}"
    result = check.run(f"demo {policy}", flakecheck("run", str(DEMO), "--device", device, "--kernels", policy,
                                                    "--limit", str(limit), "--max-tokens", str(max_tokens),
                                                    "--out", str(out), "--no-html", "--quiet"), 240)
    result.pop("stdout", None)
    if result["status"] != "ok":
        return result
    import pyarrow.parquet as pq

    cases = pq.read_table(out / "cases.parquet").to_pandas()
    tokens = pq.read_table(out / "tokens.parquet").to_pandas()
    meta = json.loads((out / "meta.json").read_text())
    columns = ["case_id", "step", "token_id", "top1_logprob", "top2_logprob"]
    per = {name: g.sort_values(["case_id", "step"])[columns].reset_index(drop=True)
           for name, g in tokens.groupby("composition")}
    reference = per[meta["reference"]]
    result.update(statuses=cases.status.value_counts().to_dict(), replay=meta.get("replay"),
                  replay_s=round(meta["timings"].get("replay_s", 0.0), 1), memory=meta.get("memory"),
                  bitwise_across_compositions=all(t.equals(reference) for t in per.values()),
                  engine=meta["engine"]["verification_summary"])
    return result


def matmul_table(device: str) -> list[dict[str, Any]]:
    """The fixed-order persistent Triton matmul against torch's (cuBLAS) on Llama-3-8B's projection shapes."""
    import torch
    from triton.testing import do_bench

    from flakecheck.kernels.triton_kernels import matmul_persistent

    shapes = {"qkv 4096x6144": (4096, 6144), "o_proj 4096x4096": (4096, 4096), "gate_up 4096x28672": (4096, 28672),
              "down 14336x4096": (14336, 4096)}
    rows = []
    for name, (k, n) in shapes.items():
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * k**-0.5
        for m in (1, 16, 64, 256, 2048):
            x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
            t_tri = do_bench(lambda x=x, w=w: matmul_persistent(x, w), rep=50, return_mode="median")
            t_ref = do_bench(lambda x=x, w=w: x @ w.T, rep=50, return_mode="median")
            diff = (matmul_persistent(x, w).float() - (x @ w.T).float()).abs().max().item()
            rows.append({"shape": name, "m": m, "triton_ms": round(t_tri, 4), "cublas_ms": round(t_ref, 4),
                         "throughput_vs_cublas": round(t_ref / t_tri, 3),
                         "triton_tflops": round(2 * m * n * k / (t_tri * 1e-3) / 1e12, 1), "max_abs_diff": diff})
    return rows


def make_big_model(target: Path) -> Path:
    """Llama-3-8B's shapes (32 layers, hidden 4096, 32 heads / 8 KV heads, MLP 14336) with SmolLM2's tokenizer
    and vocabulary (49,152: 7.6B parameters), random bf16 weights written as sharded safetensors."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (target / "config.json").is_file():
        return target
    from flakecheck.engine.loader import resolve_model_dir

    small, _ = resolve_model_dir("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(small)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         rope_theta=500000.0, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True, max_shard_size="4GB")
    tokenizer.save_pretrained(target)
    del model
    torch.cuda.empty_cache()
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / "reports" / "gpu-check"))
    parser.add_argument("--budget", type=float, default=570.0, help="seconds for all steps together")
    parser.add_argument("--skip", default="", help="comma-separated steps to skip")
    parser.add_argument("--quick", action="store_true", help="small workloads (a dry run of the script)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(filter(None, args.skip.split(",")))
    gpu = args.device.startswith("cuda")
    check = Check(args.budget, args.out)
    summary: dict[str, Any] = {"device": args.device}
    import torch

    if gpu:
        if not torch.cuda.is_available():
            print(json.dumps({"error": "no CUDA device: this check needs a GPU"}))
            return 2
        props = torch.cuda.get_device_properties(args.device)
        summary["gpu"] = {"name": props.name, "sms": props.multi_processor_count,
                          "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda,
                          "torch": torch.__version__}
    limit, max_tokens = (2, 4) if args.quick else (24, 32)
    steps = summary["steps"] = {}
    if "compile" not in skip:
        steps["compile"] = compile_step(check, args.device)
        if steps["compile"]["status"] != "ok":
            return finish(args.out, summary)
    if "kernels" not in skip and gpu:
        r = check.run("kernels", [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                  "tests/test_kernels_triton.py", "tests/test_engine_triton.py"], 180)
        r.pop("stdout", None)
        steps["kernel_tests"] = r
    if "check" not in skip:
        r = check.run("kernels check", flakecheck("kernels", "check", "--device", args.device, "--json"), 150)
        if r["status"] in ("ok", "failed") and r.get("stdout", "").strip():
            found = json.loads(r["stdout"].strip().splitlines()[-1])
            r["not_invariant"] = [f"{x['policy']} {x['op']} {x['check']}" for x in found["results"]
                                  if x["policy"] == "invariant" and not x["invariant"]]
        r.pop("stdout", None)
        steps["kernels_check"] = r
    if "demo" not in skip:
        steps["demo"] = {p: demo_run(check, args.device, p, limit, max_tokens) for p in POLICIES}
    if "bench" not in skip:
        for policy in ("native", "invariant"):
            extra = ["--quick"] if args.quick else []
            r = check.run(f"bench engine {policy}", flakecheck("bench", "engine", "--device", args.device,
                                                               "--kernels", policy, "--json", *extra), 200)
            if r["status"] == "ok":
                r["result"] = json.loads(r.pop("stdout").strip().splitlines()[-1])
            r.pop("stdout", None)
            steps[f"bench_engine_{policy}"] = r
    if "matmul" not in skip and gpu and check.left() > 60:
        start = time.monotonic()
        table = matmul_table(args.device)
        big_m = [row["throughput_vs_cublas"] for row in table if row["m"] >= 64]
        steps["matmul"] = {"status": "ok", "seconds": round(time.monotonic() - start, 1), "rows": table,
                           "min_throughput_vs_cublas_m64": min(big_m), "goal_m64": 0.8}
    if "big" not in skip and gpu and check.left() > 120:
        start = time.monotonic()
        target = make_big_model(args.out / "llama8b-shape")
        made = round(time.monotonic() - start, 1)
        out = args.out / "big-invariant"
        r = check.run("big", flakecheck("run", str(DEMO), "--model", str(target), "--device", args.device,
                                        "--kernels", "invariant", "--limit", str(limit), "--max-tokens",
                                        str(max_tokens), "--out", str(out), "--no-html", "--quiet"), check.left())
        r.pop("stdout", None)
        r["made_s"] = made
        if r["status"] == "ok":
            meta = json.loads((out / "meta.json").read_text())
            r.update(load_s=round(meta["timings"]["load_s"], 1), replay_s=round(meta["timings"]["replay_s"], 1),
                     memory=meta.get("memory"), replay=meta.get("replay"))
        steps["big"] = r
    return finish(args.out, summary)


def compile_step(check: Check, device: str) -> dict[str, Any]:
    """The compile check for this GPU's architecture (every default target without one)."""
    import torch

    from flakecheck.kernels.aot import DEFAULT_TARGETS, TARGETS

    targets = ",".join(DEFAULT_TARGETS)
    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(device)
        targets = f"sm_{major}{minor}" if f"sm_{major}{minor}" in TARGETS else targets
    r = check.run("compile", flakecheck("kernels", "compile", "--target", targets, "--json"), 200)
    if r.get("stdout", "").strip():
        found = json.loads(r["stdout"].strip().splitlines()[-1])
        r["targets"] = found["targets"]
        r["boundaries"] = [f"{b['kernel']} {b['target']} M {b['rows']}/{b['rows'] + 1}: {b['below']} -> "
                           f"{b['above']}" for b in found["boundaries"]]
        r["not_fitting"] = [f"{k['kernel']} {k['config']} {k['target']}" for k in found["kernels"]
                            if not (k["fits"] and k["order_ok"])]
    r.pop("stdout", None)
    return r


def finish(out: Path, summary: dict[str, Any]) -> int:
    steps = summary["steps"]
    (out / "gpu_check.json").write_text(json.dumps(summary, indent=2))
    print_table(summary)
    print(json.dumps(summary))
    bad = [name for name, r in steps.items() if isinstance(r, dict) and r.get("status") in ("failed", "timeout")]
    bad += [f"demo {p}" for p, r in steps.get("demo", {}).items() if r.get("status") in ("failed", "timeout")]
    return 1 if bad else 0


def print_table(summary: dict[str, Any]) -> None:
    steps = summary["steps"]
    lines = [f"GPU check on {summary.get('gpu', {}).get('name', summary['device'])}"]
    for name, r in steps.items():
        if name == "demo":
            for policy, d in r.items():
                extra = (f"statuses {d.get('statuses')} bitwise {d.get('bitwise_across_compositions')} "
                         f"replay {d.get('replay')} {d.get('replay_s')} s") if d.get("status") == "ok" else ""
                lines.append(f"  demo {policy:9s} {d['status']:8s} {d.get('seconds', ''):>7} s  {extra}")
        elif name == "matmul":
            lines.append(f"  matmul          ok       {r['seconds']:>7} s  min Triton/cuBLAS throughput at M>=64: "
                         f"{r['min_throughput_vs_cublas_m64']:.2f} (goal {r['goal_m64']})")
            for row in r["rows"]:
                lines.append(f"      {row['shape']:20s} M={row['m']:5d} triton {row['triton_ms']:8.4f} ms  cuBLAS "
                             f"{row['cublas_ms']:8.4f} ms  {row['throughput_vs_cublas']:5.2f}x  "
                             f"{row['triton_tflops']:6.1f} TFLOP/s")
        else:
            extra = ""
            if "result" in r:
                res = r["result"]
                extra = " ".join(f"bs{b} x{res.get(f'speedup_bs{b}')}" for b in res.get("batch_sizes", ()))
            if r.get("not_invariant"):
                extra = f"NOT invariant: {r['not_invariant']}"
            if name == "compile":
                extra = f"targets {r.get('targets')}; boundaries {r.get('boundaries')}"
                if r.get("not_fitting"):
                    extra = f"NOT fitting: {r['not_fitting']}"
            lines.append(f"  {name:15s} {r['status']:8s} {r.get('seconds', ''):>7} s  {extra}")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
