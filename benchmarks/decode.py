"""Greedy decoding with a KV cache: tokens/s of stock CPU eager and vtpu's
strict and fused modes, with vTPU's skinny GEMM (the default) and with
MKL for the one-token matrix products (``VTPU_SKINNY_GEMM=0``), and of
``torch.compile(model, backend="vtpu")`` (default options: Dynamo makes the
cache length symbolic after it first changes) with its graphs run as native
programs (the default) and as Python programs (``options={"native": False}``).

    .venv/bin/python benchmarks/decode.py [--repeats N] [--only small|large] [--dtype bfloat16] [--quick]

Two Qwen3-style decoders (torch_vtpu.models.Qwen3Mini, float32 or, with
``--dtype bfloat16``, bfloat16; random weights from a fixed seed):

    small  the fused-eager benchmark's decode model: hidden 256, 4 layers,
           vocab 1024, 3.9M parameters (16 MB: its weights stay in the L3
           cache of the development host), 64 tokens after a 16-token prompt
    large  hidden 1024, intermediate 3072, 8 layers, vocab 8192, 112M
           parameters (450 MB: each token streams every weight from
           memory), 16 tokens after a 16-token prompt

Decoding one token multiplies a 1 x hidden activation by every weight
matrix: memory-bound work that MKL runs on one thread. The skinny GEMM
(engine/include/vtpu/runtime/skinny_gemm.h) splits such products by columns
over the work-sharing pool.

Each configuration runs in its own process (the switch is read once per
process): a warm-up decode, then ``--steps`` timed decodes; configurations
take turns for ``--repeats`` rounds and the reported figure is the median of
all timed decodes. Every configuration must choose the same tokens as stock
CPU eager (printed). The machines are shared and noisy: compare ratios from
one run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

CONFIGS = [  # name, device mode, VTPU_SKINNY_GEMM
    ("cpu", "cpu", "1"),
    ("strict", "strict", "1"),
    ("fused", "fused", "1"),
    ("strict mkl", "strict", "0"),
    ("fused mkl", "fused", "0"),
    ("compiled", "compiled", "1"),
    ("compiled py", "compiled-python", "1"),
]

SIZES = {
    "small": dict(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, tokens=64),
    "large": dict(vocab_size=8192, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=64, tokens=16),
    # Weights of 64 KB and more, the skinny GEMM's threshold, so it is used.
    "quick": dict(vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, tokens=4),
}


def worker(size: str, mode: str, steps: int, dtype: str) -> Dict[str, object]:
    """One configuration in this process: tokens/s of each timed decode, and the tokens."""
    import torch

    from torch_vtpu.models.qwen3_mini import Qwen3Mini, Qwen3MiniConfig

    spec = dict(SIZES[size])
    tokens = spec.pop("tokens")
    torch.manual_seed(0)
    model = Qwen3Mini(Qwen3MiniConfig(max_position_embeddings=256, **spec)).eval().to(getattr(torch, dtype))
    prompt = torch.randint(0, spec["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(4))
    device = "cpu" if mode == "cpu" else "vtpu"
    if device == "vtpu":
        import torch_vtpu

        # Compiled graphs run fused inside; the ops between them (argmax) strict.
        torch_vtpu.set_mode("strict" if mode.startswith("compiled") else mode)
    model, prompt = model.to(device), prompt.to(device)
    if mode.startswith("compiled"):
        model = torch.compile(model, backend="vtpu", options={"native": mode == "compiled"})

    @torch.no_grad()
    def decode() -> List[int]:
        logits, kv = model(prompt, use_cache=True)
        chosen = []
        for _ in range(tokens):
            next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            chosen.append(next_id)
            logits, kv = model(next_id, past_key_values=kv, use_cache=True)
        if device == "vtpu":
            torch.vtpu.synchronize()
        return torch.cat(chosen, dim=1).flatten().tolist()

    chosen = decode()  # warm-up (and, in fused mode, its kernels' compiles)
    if device == "vtpu":
        torch_vtpu._C._wait_for_fusion_compiles()
    rates = []
    for _ in range(steps):
        start = time.perf_counter()
        again = decode()
        rates.append(tokens / (time.perf_counter() - start))
        if again != chosen:
            raise RuntimeError(f"{mode}: tokens changed between decodes")
    skinny = torch_vtpu._C._skinny_gemm_runs() if device == "vtpu" else 0
    return {"rates": rates, "tokens": chosen, "skinny_runs": skinny}


def run_config(size: str, mode: str, skinny: str, steps: int, dtype: str) -> Dict[str, object]:
    env = dict(os.environ, VTPU_SKINNY_GEMM=skinny, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--_worker", size, mode, str(steps), dtype]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"{size} {mode} skinny={skinny} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of all configurations (default 3)")
    parser.add_argument("--steps", type=int, default=2, help="timed decodes per process (default 2)")
    parser.add_argument("--only", choices=["small", "large"], help="one model size")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the model's dtype (default float32)")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 1 round: a smoke test")
    parser.add_argument("--_worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._worker:
        size, mode, steps, dtype = args._worker
        print(json.dumps(worker(size, mode, int(steps), dtype)))
        return 0
    if args.repeats < 1 or args.steps < 1:
        parser.error("--repeats and --steps must be at least 1")
    sizes = ["quick"] if args.quick else [args.only] if args.only else ["small", "large"]
    repeats = 1 if args.quick else args.repeats
    ok = True
    for size in sizes:
        rates: Dict[str, List[float]] = {name: [] for name, _, _ in CONFIGS}
        tokens: Dict[str, List[int]] = {}
        skinny_runs: Dict[str, int] = {}
        for _ in range(repeats):
            for name, mode, skinny in CONFIGS:
                result = run_config(size, mode, skinny, args.steps, args.dtype)
                rates[name] += result["rates"]
                tokens[name] = result["tokens"]
                skinny_runs[name] = result["skinny_runs"]
        median = {name: statistics.median(r) for name, r in rates.items()}
        print(f"\n{size}, {args.dtype}: {SIZES[size]['tokens']} tokens, tokens/s "
              f"(median of {repeats * args.steps} decodes)")
        for name, _, skinny in CONFIGS:
            print(f"  {name:<11} {median[name]:8.1f}   skinny GEMM calls {skinny_runs[name]}")
        for mode in ("strict", "fused"):
            print(f"  {mode}: skinny / mkl {median[mode] / median[mode + ' mkl']:.2f}x, "
                  f"over cpu {median[mode] / median['cpu']:.2f}x")
        print(f"  compiled: over strict {median['compiled'] / median['strict']:.2f}x, "
              f"over its Python programs {median['compiled'] / median['compiled py']:.2f}x")
        same = all(t == tokens["cpu"] for t in tokens.values())
        routed = all(skinny_runs[name] > 0 for name, mode, skinny in CONFIGS if mode != "cpu" and skinny == "1")
        print(f"  same tokens as cpu everywhere: {same}; skinny GEMM used where on: {routed}")
        if not same:
            # Greedy decoding follows the first token whose logits round
            # differently; in bfloat16 a GEMM's summation order is enough.
            for name, chosen in tokens.items():
                first = next((i for i, (x, y) in enumerate(zip(chosen, tokens["cpu"])) if x != y), None)
                print(f"    {name:<11} first token unlike cpu's: {first}")
        # float32 runs must agree with stock CPU eager; bfloat16 ones are reported.
        ok = ok and routed and (same or args.dtype == "bfloat16")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
