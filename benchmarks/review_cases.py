"""Workloads a performance review (2026-12-06) found slower on vtpu than on the CPU, or
slower in fused mode than in strict: stock CPU eager, vtpu strict and vtpu fused
measured side by side in one process.

    .venv/bin/python benchmarks/review_cases.py [--rounds 9]

    lstm_inference  2-layer nn.LSTM(128, 256), batch 8 x 64 steps, eval, no_grad:
                    each step's cell is a cluster of 3 sigmoids and 2 tanhs
    gru_train       nn.GRU(64, 128) + Linear head, batch 32 x 50 steps, one SGD
                    (momentum) training step
    sigmoid_chain   5 recurrent updates h = (h - n) * sigmoid(b + a) + n,
                    n = tanh(a + sigmoid(a + b) * b) over 2^20 floats: a 48-op cluster
    softmax_dim0    softmax over dim 0 of a 4096 x 1024 matrix (the rows' elements are
                    1024 floats apart)
    softmax_t       softmax over the last dim of a transposed 2048 x 2048 matrix
    relu_mean_bwd   relu(x).mean((2, 3)).backward(g), x 32 x 64 x 32 x 32 (a CNN's
                    ReLU + global average pool): a fused relu+mean reduction
                    storing the ReLU, and the mean's broadcast gradient / 1024
                    fused with threshold_backward (float32; _bf16: bfloat16)
    half_ops        float16 relu, add with alpha, softmax and a row sum of
                    1024 x 1024 (float16 conversions in generated kernels)
    bf16_rows       bfloat16 row sum, mean, 2-norm and softmax of 4096 x 1024
                    (double lanes over 16-bit loads; a 16-bit softmax's exps)

Each round runs every mode once (CPU, strict, fused, in turn), each vtpu run ending
with torch.vtpu.synchronize(); after warm-up (three runs per mode, then the fused
kernels' background compiles are awaited). Reported: medians over the rounds (ms)
and the ratios fused/strict and vtpu/CPU. The machines are shared and noisy:
compare ratios from one run.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict

import torch
import torch.nn.functional as F

import torch_vtpu


def lstm_inference(device: str) -> Callable[[], object]:
    model = torch.nn.LSTM(128, 256, num_layers=2, batch_first=True).to(device).eval()
    x = torch.randn(8, 64, 128).to(device)

    def run():
        with torch.no_grad():
            return model(x)[0]
    return run


def gru_train(device: str) -> Callable[[], object]:
    gru, head = torch.nn.GRU(64, 128, batch_first=True).to(device), torch.nn.Linear(128, 10).to(device)
    opt = torch.optim.SGD(list(gru.parameters()) + list(head.parameters()), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 50, 64).to(device), torch.randint(0, 10, (32,)).to(device)

    def run():
        opt.zero_grad()
        loss = F.cross_entropy(head(gru(x)[0][:, -1]), y)
        loss.backward()
        opt.step()
        return loss
    return run


def sigmoid_chain(device: str) -> Callable[[], object]:
    a, b, h0 = [torch.randn(1 << 20).to(device) for _ in range(3)]

    def run():
        h = h0
        for _ in range(5):
            n = torch.tanh(a + torch.sigmoid(a + b) * b)
            h = (h - n) * torch.sigmoid(b + a) + n
        return h
    return run


def softmax_dim0(device: str) -> Callable[[], object]:
    x = torch.randn(4096, 1024).to(device)
    return lambda: torch.softmax(x, dim=0)


def softmax_t(device: str) -> Callable[[], object]:
    x = torch.randn(2048, 2048).to(device)
    return lambda: torch.softmax(x.t(), dim=-1)


def relu_mean_backward(dtype: torch.dtype) -> Callable[[str], Callable[[], object]]:
    def make(device: str) -> Callable[[], object]:
        x = torch.randn(32, 64, 32, 32).to(dtype).to(device).requires_grad_()
        g = torch.randn(32, 64).to(dtype).to(device)

        def run():
            x.grad = None
            torch.relu(x).mean((2, 3)).backward(g)
            return x.grad
        return run
    return make


def half_ops(device: str) -> Callable[[], object]:
    x = torch.randn(1024, 1024).half().to(device)
    y = torch.randn(1024, 1024).half().to(device)
    return lambda: (torch.relu(x), torch.add(x, y, alpha=0.5), torch.softmax(x, -1), x.sum(-1))


def bf16_rows(device: str) -> Callable[[], object]:
    x = torch.randn(4096, 1024).bfloat16().to(device)
    return lambda: (x.sum(-1), x.mean(-1), x.norm(dim=-1), torch.softmax(x, -1))


CASES = {"lstm_inference": lstm_inference, "gru_train": gru_train, "sigmoid_chain": sigmoid_chain,
         "softmax_dim0": softmax_dim0, "softmax_t": softmax_t,
         "relu_mean_bwd": relu_mean_backward(torch.float32), "relu_mean_bwd_bf16": relu_mean_backward(torch.bfloat16),
         "half_ops": half_ops, "bf16_rows": bf16_rows}


def timed(run: Callable[[], object], mode: str) -> float:
    if mode != "cpu":
        torch_vtpu.set_mode(mode)
        torch.vtpu.synchronize()
    start = time.perf_counter()
    keep = run()
    if mode != "cpu":
        torch.vtpu.synchronize()
    del keep
    return (time.perf_counter() - start) * 1e3


def measure(name: str, rounds: int) -> Dict[str, float]:
    torch.manual_seed(0)
    cpu = CASES[name]("cpu")
    torch.manual_seed(0)
    device = CASES[name]("vtpu")
    runs = {"cpu": cpu, "strict": device, "fused": device}
    for _ in range(3):
        for mode, run in runs.items():
            timed(run, mode)
    torch_vtpu._C._wait_for_fusion_compiles()
    timed(device, "fused")
    times: Dict[str, list] = {mode: [] for mode in runs}
    for _ in range(rounds):
        for mode, run in runs.items():
            times[mode].append(timed(run, mode))
    return {mode: statistics.median(values) for mode, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", nargs="*", choices=sorted(CASES))
    args = parser.parse_args()
    print(f"{'case':<16}{'cpu ms':>9}{'strict':>9}{'fused':>9}{'fus/str':>9}{'str/cpu':>9}{'fus/cpu':>9}")
    for name in args.only or CASES:
        m = measure(name, args.rounds)
        print(f"{name:<16}{m['cpu']:>9.2f}{m['strict']:>9.2f}{m['fused']:>9.2f}"
              f"{m['fused'] / m['strict']:>9.2f}{m['strict'] / m['cpu']:>9.2f}{m['fused'] / m['cpu']:>9.2f}")
    torch_vtpu.set_mode("strict")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
