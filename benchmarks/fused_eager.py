"""Fused-eager acceptance benchmark: training steps in stock CPU eager, vtpu
strict and vtpu fused mode, measured side by side in one process.

    .venv/bin/python benchmarks/fused_eager.py [--repeats N] [--steps K] [--quick] [--json PATH]

What is measured
----------------
Five workloads, each a full training step (``zero_grad(set_to_none=True)``,
forward, loss, backward, ``torch.optim.AdamW`` step; AdamW defaults to its
foreach implementation on vtpu):

    mlp_gelu_ln  Linear -> GELU -> LayerNorm blocks, cross-entropy
    qwen3        torch_vtpu.models.Qwen3Mini, next-token cross-entropy
    dlrm         EmbeddingBag(sum) tables + bottom MLP, pairwise dot-product
                 interaction (bmm), top MLP, BCE-with-logits
    cnn          conv-BatchNorm-ReLU x3 with a max-pool, linear head
    adamw_100    ``opt.step()`` alone over 100 parameters (gradients set once)

Each model is built on the CPU with a fixed seed and deep-copied to each mode's
device, so all modes start from the same weights; the input batch is drawn once
on the CPU from a seeded generator and moved once. Every mode is warmed up
(``--warmup`` steps, then, in fused mode, ``_wait_for_fusion_compiles()`` and
one more step, so the timed steps run the compiled fused kernels). Then for
each repeat, the modes take turns (cpu, strict, fused) running ``--steps``
steps each; every timed vtpu step ends with ``torch.vtpu.synchronize()``.
Reported times are the median over all timed steps of a mode.

Sizes were chosen by one rule only: a strict-mode step should take roughly
20-200 ms on the 2-core development machine (execution-bound, not
dispatch-bound). They were not tuned towards any particular fused result.
Starting from the sizes suggested in the issue, a strict-mode probe gave
mlp_gelu_ln 75 ms, dlrm 29 ms, cnn 67 ms (kept); qwen3 at batch 4 took 220 ms,
so the batch became 2; adamw_100 over 256x256 / 256x64 tensors took 14 ms, so
the tensors became 384x384 / 384x96. The decode model is the qwen3 one.

How to read the table
---------------------
    cpu/strict/fused ms   median ms per step
    f/s, f/cpu            fused/strict and fused/cpu time ratios (< 1: fused faster)
    floor                 fused/strict if every kernel of the fused step but the
                          extern ones (GEMM/conv/attention on ATen, the same
                          kernels strict runs) took no time: the fused step's
                          extern device time over strict's step time
    kern/step s|f         kernels launched per step (strict | fused)
    fused/step            fused kernels per step in fused mode
    dev time share        share of device-stream time per kernel class, strict |
                          fused, in % (gen = generated per-op kernels, fus = fused
                          kernels, ext = extern GEMM/conv/attention on ATen,
                          host = host-kernel path, oth = other)
    peak MB s|f           peak allocated device memory during a mode's timed
                          steps, above what was allocated when they began (the
                          strict and fused copies of the model are both resident,
                          so absolute peaks would count both); "!" marks fused > strict
    cmp                   engine + fusion compiles during the timed fused steps
                          (should be 0: anything else means warm-up was short)
    bitwise               strict and fused give bitwise-equal losses (adamw_100:
                          parameters) for 3 steps from the same initial state

The decode section runs greedy decoding with the KV cache on a Qwen3Mini and
reports tokens/s per mode, and the number of compiles in fused mode after the
4th generated token, measured in a subprocess with an empty VTPU_CACHE_DIR.

The summary compares the measurements with the fused-eager goals
(fused/strict geomean <= 0.6 over the four models, none slower, AdamW
fused/strict <= 0.4, fused/cpu geomean <= 0.75, peak memory fused <= strict).
The machines are shared and noisy: compare ratios, not absolute times.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import torch_vtpu
from torch_vtpu.models import qwen3_mini
from torch_vtpu.models.qwen3_mini import Qwen3Mini, Qwen3MiniConfig

MODES = ("cpu", "strict", "fused")
MODEL_WORKLOADS = ("mlp_gelu_ln", "qwen3", "dlrm", "cnn")
DEVICE_TIME_KEYS = ("generated", "fused", "extern", "host_path", "other")
GOALS = {"fused/strict geomean": 0.6, "adamw fused/strict": 0.4, "fused/cpu geomean": 0.75}


# ---- workloads ------------------------------------------------------------------


@dataclass
class Sizes:
    """Workload sizes; ``quick`` shrinks everything for a smoke test."""

    mlp_batch: int = 256
    mlp_width: int = 1024
    mlp_blocks: int = 4
    mlp_classes: int = 100
    qwen_hidden: int = 256
    qwen_layers: int = 4
    qwen_seq: int = 128
    qwen_batch: int = 2
    dlrm_tables: int = 8
    dlrm_rows: int = 10_000
    dlrm_dim: int = 64
    dlrm_batch: int = 512
    dlrm_bag: int = 4
    cnn_batch: int = 32
    cnn_channels: int = 32
    adamw_params: int = 100
    adamw_dim: int = 384
    decode_tokens: int = 64

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(mlp_batch=16, mlp_width=64, mlp_blocks=2, mlp_classes=10, qwen_hidden=64,
                   qwen_layers=1, qwen_seq=16, qwen_batch=2, dlrm_tables=2, dlrm_rows=100,
                   dlrm_dim=16, dlrm_batch=16, cnn_batch=4, cnn_channels=8, adamw_params=10,
                   adamw_dim=32, decode_tokens=8)


def _qwen_config(s: Sizes) -> Qwen3MiniConfig:
    return Qwen3MiniConfig(vocab_size=1024 if s.qwen_hidden >= 256 else 128,
                           hidden_size=s.qwen_hidden, intermediate_size=3 * s.qwen_hidden,
                           num_hidden_layers=s.qwen_layers, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=s.qwen_hidden // 4,
                           max_position_embeddings=max(256, 2 * s.qwen_seq))


class MlpGeluLn(nn.Module):
    def __init__(self, width: int, blocks: int, classes: int):
        super().__init__()
        layers: List[nn.Module] = []
        for _ in range(blocks):
            layers += [nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def _mlp(in_dim: int, widths: List[int], last_relu: bool) -> nn.Sequential:
    layers: List[nn.Module] = []
    for i, out_dim in enumerate(widths):
        layers.append(nn.Linear(in_dim, out_dim))
        if i + 1 < len(widths) or last_relu:
            layers.append(nn.ReLU())
        in_dim = out_dim
    return nn.Sequential(*layers)


class Dlrm(nn.Module):
    """DLRM-style: sparse features through summed embedding bags, dense features
    through a bottom MLP, pairwise dot products of all feature vectors, top MLP."""

    def __init__(self, tables: int, rows: int, dim: int, dense_in: int = 16):
        super().__init__()
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        self.bottom = _mlp(dense_in, [256, 128, dim], last_relu=True)
        features = tables + 1
        pairs = features * (features - 1) // 2
        self.top = _mlp(dim + pairs, [512, 256, 1], last_relu=False)
        rows_i, cols_i = torch.tril_indices(features, features, offset=-1)
        self.register_buffer("pair_rows", rows_i, persistent=False)
        self.register_buffer("pair_cols", cols_i, persistent=False)

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # indices: (tables, batch * bag), offsets: (batch,) shared by every table.
        x = self.bottom(dense)
        sparse = [bag(indices[t], offsets) for t, bag in enumerate(self.embeddings)]
        feats = torch.stack([x] + sparse, dim=1)  # (batch, features, dim)
        dots = torch.bmm(feats, feats.transpose(1, 2))  # (batch, features, features)
        pairs = dots[:, self.pair_rows, self.pair_cols]
        return self.top(torch.cat([x, pairs], dim=1)).squeeze(1)


class SmallCnn(nn.Module):
    def __init__(self, channels: int, classes: int = 10):
        super().__init__()
        c = channels
        self.features = nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * c, 2 * c, 3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
        )
        self.head = nn.Linear(2 * c * 16 * 16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


@dataclass
class ModelCase:
    """A model built on the CPU, its fixed batch (inputs..., target) and loss."""

    model: nn.Module
    batch: Tuple[torch.Tensor, ...]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _build_case(name: str, s: Sizes) -> ModelCase:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if name == "mlp_gelu_ln":
        model = MlpGeluLn(s.mlp_width, s.mlp_blocks, s.mlp_classes)
        batch = (torch.randn(s.mlp_batch, s.mlp_width, generator=g),
                 torch.randint(0, s.mlp_classes, (s.mlp_batch,), generator=g))
        return ModelCase(model, batch, F.cross_entropy)
    if name == "qwen3":
        cfg = _qwen_config(s)
        ids = torch.randint(0, cfg.vocab_size, (s.qwen_batch, s.qwen_seq + 1), generator=g)
        return ModelCase(Qwen3Mini(cfg), (ids[:, :-1].contiguous(), ids[:, 1:].contiguous()), _lm_loss)
    if name == "dlrm":
        model = Dlrm(s.dlrm_tables, s.dlrm_rows, s.dlrm_dim)
        dense = torch.randn(s.dlrm_batch, 16, generator=g)
        indices = torch.randint(0, s.dlrm_rows, (s.dlrm_tables, s.dlrm_batch * s.dlrm_bag), generator=g)
        offsets = torch.arange(0, s.dlrm_batch * s.dlrm_bag, s.dlrm_bag)
        target = torch.randint(0, 2, (s.dlrm_batch,), generator=g).float()
        return ModelCase(model, (dense, indices, offsets, target), F.binary_cross_entropy_with_logits)
    if name == "cnn":
        model = SmallCnn(s.cnn_channels)
        batch = (torch.randn(s.cnn_batch, 3, 32, 32, generator=g),
                 torch.randint(0, 10, (s.cnn_batch,), generator=g))
        return ModelCase(model, batch, F.cross_entropy)
    raise ValueError(name)


def _train_step(case: ModelCase, device: str) -> Callable[[], torch.Tensor]:
    """A closure running one training step on a fresh copy of the case's model."""
    model = copy.deepcopy(case.model).to(device)
    model.train()
    *inputs, target = (t.to(device) for t in case.batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = case.loss_fn(model(*inputs), target)
        loss.backward()
        opt.step()
        return loss.detach()

    step.params = list(model.parameters())  # type: ignore[attr-defined]
    return step


def _adamw_params(s: Sizes) -> List[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    shapes = [(s.adamw_dim, s.adamw_dim) if i % 2 == 0 else (s.adamw_dim, s.adamw_dim // 4)
              for i in range(s.adamw_params)]
    return [torch.randn(shape, generator=g) for shape in shapes]


def _adamw_step(params: List[torch.Tensor], device: str) -> Callable[[], Optional[torch.Tensor]]:
    """A closure running ``opt.step()`` on device copies of ``params`` with fixed gradients."""
    g = torch.Generator().manual_seed(3)
    device_params = []
    for p in params:
        q = p.clone().to(device).requires_grad_(True)
        q.grad = torch.randn(p.shape, generator=g).to(device)
        device_params.append(q)
    opt = torch.optim.AdamW(device_params, lr=1e-3)

    def step() -> None:
        opt.step()
        return None

    step.params = device_params  # type: ignore[attr-defined]
    return step


def make_step(name: str, s: Sizes, device: str, cache: Dict[str, object]) -> Callable:
    """The step closure of workload ``name`` on ``device`` (CPU-side state cached per workload)."""
    if name not in cache:
        cache[name] = _adamw_params(s) if name == "adamw_100" else _build_case(name, s)
    if name == "adamw_100":
        return _adamw_step(cache[name], device)  # type: ignore[arg-type]
    return _train_step(cache[name], device)  # type: ignore[arg-type]


# ---- measurement ----------------------------------------------------------------


def _sync(mode: str) -> None:
    if mode != "cpu":
        torch.vtpu.synchronize()


def _enter(mode: str) -> None:
    if mode != "cpu":
        torch_vtpu.set_mode(mode)


def _warm_up(step: Callable, mode: str, steps: int) -> None:
    _enter(mode)
    for _ in range(steps):
        step()
        _sync(mode)
    if mode == "fused":
        # Fused kernels compile in the background on first sight; wait for them, then
        # run once more so that the step which launches them is not timed either.
        torch_vtpu._C._wait_for_fusion_compiles()
        step()
        _sync(mode)
        torch_vtpu._C._wait_for_fusion_compiles()


@dataclass
class ModeResult:
    step_ms: List[float] = field(default_factory=list)
    kernels: int = 0
    fused_kernels: int = 0
    compiles: int = 0
    device_time: Dict[str, float] = field(default_factory=lambda: dict.fromkeys(DEVICE_TIME_KEYS, 0.0))
    peak_bytes: int = 0

    def median_ms(self) -> float:
        return statistics.median(self.step_ms)


def _timed_block(step: Callable, mode: str, steps: int, out: ModeResult) -> None:
    """Run ``steps`` timed steps, adding times, metrics and the memory peak to ``out``."""
    _enter(mode)
    if mode != "cpu":
        _sync(mode)
        baseline = torch.vtpu.memory_allocated()
        torch.vtpu.reset_peak_memory_stats()
        torch_vtpu.reset_metrics()
    for _ in range(steps):
        start = time.perf_counter()
        step()
        _sync(mode)
        out.step_ms.append((time.perf_counter() - start) * 1e3)
    if mode == "cpu":
        return
    m = torch_vtpu.metrics()
    out.kernels += m["kernels_launched"]
    out.fused_kernels += m["fused_kernels"]
    out.compiles += m["compiles"] + m["fusion_compiles"]
    for key in DEVICE_TIME_KEYS:
        out.device_time[key] += m["device_time_s"].get(key, 0.0)
    out.peak_bytes = max(out.peak_bytes, torch.vtpu.max_memory_allocated() - baseline)


def _bitwise_equal(name: str, s: Sizes, cache: Dict[str, object], steps: int = 3) -> Tuple[bool, str]:
    """Do strict and fused give bitwise-equal losses (adamw_100: parameters) for
    ``steps`` steps from the same initial state? Also a note on the first mismatch."""
    outputs = {}
    for mode in ("strict", "fused"):
        _enter(mode)
        step = make_step(name, s, "vtpu", cache)
        losses = [step() for _ in range(steps)]
        _sync(mode)
        if name == "adamw_100":
            outputs[mode] = [p.detach().cpu() for p in step.params]
        else:
            outputs[mode] = [loss.cpu() for loss in losses]
    what = "parameter" if name == "adamw_100" else "loss of step"
    for i, (a, b) in enumerate(zip(outputs["strict"], outputs["fused"])):
        if not torch.equal(a, b):
            diff = (a.double() - b.double()).abs().max().item()
            return False, f"{what} {i + 1} differs: max |strict - fused| = {diff:.3g}"
    return True, ""


def run_workload(name: str, s: Sizes, repeats: int, steps: int, warmup: int) -> Dict[str, object]:
    cache: Dict[str, object] = {}
    devices = {"cpu": "cpu", "strict": "vtpu", "fused": "vtpu"}
    runners = {}
    for mode in MODES:
        _enter(mode)
        runners[mode] = make_step(name, s, devices[mode], cache)
        _warm_up(runners[mode], mode, warmup)
    results = {mode: ModeResult() for mode in MODES}
    for _ in range(repeats):  # interleaved, so drift on the shared machine hits every mode alike
        for mode in MODES:
            _timed_block(runners[mode], mode, steps, results[mode])
    del runners
    bitwise, mismatch = _bitwise_equal(name, s, cache)
    row = _summarise(name, results, repeats * steps, bitwise)
    row["bitwise_mismatch"] = mismatch
    return row


def _summarise(name: str, results: Dict[str, ModeResult], timed_steps: int, bitwise: bool) -> Dict[str, object]:
    row: Dict[str, object] = {"workload": name, "bitwise": bitwise, "timed_steps": timed_steps}
    for mode, r in results.items():
        row[f"{mode}_ms"] = r.median_ms()
        row[f"{mode}_step_ms_all"] = r.step_ms
    row["fused/strict"] = row["fused_ms"] / row["strict_ms"]
    row["fused/cpu"] = row["fused_ms"] / row["cpu_ms"]
    for mode in ("strict", "fused"):
        r = results[mode]
        total = sum(r.device_time.values())
        row[f"{mode}_kernels_per_step"] = r.kernels / timed_steps
        row[f"{mode}_fused_per_step"] = r.fused_kernels / timed_steps
        row[f"{mode}_compiles_timed"] = r.compiles
        row[f"{mode}_device_time_s"] = r.device_time
        row[f"{mode}_device_share"] = {k: (v / total if total else 0.0) for k, v in r.device_time.items()}
        row[f"{mode}_peak_mb"] = r.peak_bytes / 2**20
    # The floor fusion cannot go below: fused mode's extern (GEMM, convolution,
    # attention) kernels alone, the same kernels strict mode runs, over the
    # strict step, as if every other kernel of the fused step took no time.
    extern_ms = results["fused"].device_time.get("extern", 0.0) / timed_steps * 1e3
    row["fused/strict floor"] = extern_ms / row["strict_ms"]
    return row


# ---- decode -------------------------------------------------------------------


def _decode_model(s: Sizes) -> Tuple[Qwen3Mini, torch.Tensor]:
    torch.manual_seed(0)
    model = Qwen3Mini(_qwen_config(s)).eval()
    prompt = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(4))
    return model, prompt


def decode_throughput(s: Sizes, repeats: int) -> Dict[str, float]:
    """Tokens/s of generate_greedy per mode (median of interleaved repeats, after one warm-up run)."""
    model, prompt = _decode_model(s)
    copies = {"cpu": (model, prompt),
              "strict": (copy.deepcopy(model).to("vtpu"), prompt.to("vtpu")),
              "fused": (copy.deepcopy(model).to("vtpu"), prompt.to("vtpu"))}
    times: Dict[str, List[float]] = {mode: [] for mode in MODES}
    for r in range(repeats + 1):
        for mode in MODES:
            _enter(mode)
            m, ids = copies[mode]
            start = time.perf_counter()
            qwen3_mini.generate_greedy(m, ids, s.decode_tokens)
            _sync(mode)
            elapsed = time.perf_counter() - start
            if r == 0:  # warm-up
                if mode == "fused":
                    torch_vtpu._C._wait_for_fusion_compiles()
                continue
            times[mode].append(elapsed)
    return {mode: s.decode_tokens / statistics.median(t) for mode, t in times.items()}


@torch.no_grad()
def decode_compiles(s: Sizes, after_token: int = 4) -> Dict[str, object]:
    """Fused-mode greedy decoding token by token (generate_greedy's loop): the
    engine + fusion compiles counted from the ``after_token``-th token to the end."""
    torch_vtpu.set_mode("fused")
    model, prompt = _decode_model(s)
    model = model.to("vtpu")
    ids = prompt.to("vtpu")

    def count() -> int:
        m = torch_vtpu.metrics()
        return m["compiles"] + m["fusion_compiles"]

    logits, kv = model(ids, use_cache=True)
    per_token = []
    for token in range(1, s.decode_tokens + 1):
        next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        if token == after_token:
            torch.vtpu.synchronize()
            torch_vtpu._C._wait_for_fusion_compiles()
            before = count()
            torch_vtpu.reset_metrics()
        if token < s.decode_tokens:
            logits, kv = model(next_id, past_key_values=kv, use_cache=True)
        per_token.append(count() if token >= after_token else None)
    torch.vtpu.synchronize()
    torch_vtpu._C._wait_for_fusion_compiles()
    return {"after_token": after_token, "compiles_before": before, "compiles": count(),
            "cumulative_per_token": per_token}


def decode_compiles_fresh_cache(s: Sizes, quick: bool) -> Tuple[Optional[Dict[str, object]], str]:
    """decode_compiles in a subprocess with an empty VTPU_CACHE_DIR (and no shared cache)."""
    with tempfile.TemporaryDirectory(prefix="vtpu_bench_cache_") as cache_dir:
        env = dict(os.environ, VTPU_CACHE_DIR=cache_dir)
        env.pop("VTPU_SHARED_CACHE", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--_decode-compiles"] + (["--quick"] if quick else [])
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return None, f"subprocess failed (rc {proc.returncode}): {proc.stderr.strip()[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), "fresh VTPU_CACHE_DIR in a subprocess"


# ---- report ---------------------------------------------------------------------


def _geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _share(row: Dict[str, object], mode: str) -> str:
    share = row[f"{mode}_device_share"]
    short = {"generated": "gen", "fused": "fus", "extern": "ext", "host_path": "host", "other": "oth"}
    return " ".join(f"{short[k]}{share[k] * 100:.0f}" for k in DEVICE_TIME_KEYS if share[k] >= 0.005)


def print_table(rows: List[Dict[str, object]]) -> None:
    print(f"{'workload':<12}{'cpu ms':>9}{'strict ms':>10}{'fused ms':>9}{'f/s':>6}{'floor':>6}{'f/cpu':>6}"
          f"{'kern/step s|f':>15}{'fused/step':>11}{'peak MB s|f':>16}{'cmp':>4}{'bitwise':>8}"
          f"  dev time share % (strict | fused)")
    for r in rows:
        kern = f"{r['strict_kernels_per_step']:.0f}|{r['fused_kernels_per_step']:.0f}"
        flag = "!" if r["fused_peak_mb"] > r["strict_peak_mb"] else " "
        peak = f"{r['strict_peak_mb']:.2f}|{r['fused_peak_mb']:.2f}{flag}"
        print(f"{r['workload']:<12}{r['cpu_ms']:>9.2f}{r['strict_ms']:>10.2f}{r['fused_ms']:>9.2f}"
              f"{r['fused/strict']:>6.2f}{r['fused/strict floor']:>6.2f}{r['fused/cpu']:>6.2f}{kern:>15}{r['fused_fused_per_step']:>11.1f}"
              f"{peak:>16}{r['fused_compiles_timed']:>4}{'yes' if r['bitwise'] else 'NO':>8}"
              f"  {_share(r, 'strict')} | {_share(r, 'fused')}")
    for r in rows:
        if not r["bitwise"]:
            print(f"  bitwise: no for {r['workload']}: {r['bitwise_mismatch']}")


def summarise(rows: List[Dict[str, object]]) -> Dict[str, object]:
    by_name = {r["workload"]: r for r in rows}
    models = [by_name[n] for n in MODEL_WORKLOADS if n in by_name]
    summary: Dict[str, object] = {}
    if models:
        summary["fused/strict geomean"] = _geomean([r["fused/strict"] for r in models])
        floors = [r["fused/strict floor"] for r in models]
        if all(f > 0 for f in floors):
            summary["fused/strict floor geomean"] = _geomean(floors)
        summary["fused/cpu geomean"] = _geomean([r["fused/cpu"] for r in models])
    summary["slower in fused"] = [r["workload"] for r in rows if r["fused/strict"] > 1.0]
    if "adamw_100" in by_name:
        summary["adamw fused/strict"] = by_name["adamw_100"]["fused/strict"]
    summary["fused peak > strict"] = [r["workload"] for r in rows if r["fused_peak_mb"] > r["strict_peak_mb"]]
    summary["bitwise all"] = all(r["bitwise"] for r in rows)
    return summary


def print_summary(summary: Dict[str, object]) -> None:
    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    print("\nsummary (measured vs goal)")
    for key in ("fused/strict geomean", "adamw fused/strict", "fused/cpu geomean"):
        if key in summary:
            value, goal = summary[key], GOALS[key]
            print(f"  {key:<28}{value:>4.2f}   goal <= {goal:<5} {verdict(value <= goal)}")
            if key == "fused/strict geomean" and "fused/strict floor geomean" in summary:
                print(f"    floor: {summary['fused/strict floor geomean']:.2f} with every non-extern kernel of the"
                      f" fused step free (its GEMM/conv/attention time over strict's step; per workload: f/s floor)")
    slower = summary["slower in fused"]
    print(f"  {'slower in fused (f/s > 1)':<28}{', '.join(slower) or 'none'}   goal none  {verdict(not slower)}")
    over = summary["fused peak > strict"]
    print(f"  {'peak memory fused > strict':<28}{', '.join(over) or 'none'}   goal none  {verdict(not over)}")
    print(f"  {'bitwise strict == fused':<28}{'yes' if summary['bitwise all'] else 'NO'}")


def print_decode(tokens_per_s: Dict[str, float], compiles: Optional[Dict[str, object]], how: str,
                 n: int) -> None:
    print(f"\ndecode: greedy, {n} tokens, KV cache, batch 1, 16-token prompt")
    for mode in MODES:
        print(f"  {mode:<7}{tokens_per_s[mode]:>9.1f} tokens/s")
    print(f"  fused/strict time {tokens_per_s['strict'] / tokens_per_s['fused']:.2f}, "
          f"fused/cpu time {tokens_per_s['cpu'] / tokens_per_s['fused']:.2f}")
    if compiles is None:
        print(f"  compiles after token 4: not measured ({how})")
    else:
        print(f"  compiles after token {compiles['after_token']}: {compiles['compiles']} "
              f"(up to it: {compiles['compiles_before']}; {how})")


# ---- main -----------------------------------------------------------------------


def add_common_arguments(parser: argparse.ArgumentParser, repeats: int, extra_section: str) -> None:
    """The options this benchmark shares with benchmarks/compiled.py."""
    parser.add_argument("--repeats", type=int, default=repeats, help=f"interleaved repeats (default {repeats})")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode and repeat (default 3)")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per mode (default 3)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes and 1 repeat: a smoke test")
    parser.add_argument("--only", nargs="*", help=f"run only these workloads (and '{extra_section}')")
    parser.add_argument("--json", metavar="PATH", help="also write all results to PATH")


def select_workloads(parser: argparse.ArgumentParser, only: Optional[List[str]], names: List[str],
                     extra_section: str) -> List[str]:
    """The workloads --only names (all without it); an unknown name is a usage error."""
    if not only:
        return names
    unknown = sorted(set(only) - set(names) - {extra_section})
    if unknown:
        parser.error(f"--only: unknown workload(s) {', '.join(unknown)}; choose from "
                     f"{', '.join(names + [extra_section])}")
    return [n for n in names if n in only]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_arguments(parser, repeats=7, extra_section="decode")
    parser.add_argument("--_decode-compiles", dest="decode_compiles", action="store_true",
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.decode_compiles:  # the subprocess of decode_compiles_fresh_cache
        print(json.dumps(decode_compiles(sizes)))
        return 0
    repeats = 1 if args.quick else args.repeats
    steps = 1 if args.quick else args.steps
    warmup = min(args.warmup, 3) if args.quick else max(args.warmup, 3)
    names = select_workloads(parser, args.only, list(MODEL_WORKLOADS) + ["adamw_100"], "decode")

    kind = "quick sizes (smoke test: times mean nothing)" if args.quick else "default sizes"
    print(f"fused-eager benchmark: {kind}, median of "
          f"{repeats} interleaved repeats x {steps} steps per mode, torch {torch.__version__}, "
          f"{torch.get_num_threads()} CPU threads\n")
    rows = [run_workload(name, sizes, repeats, steps, warmup) for name in names]
    print_table(rows)
    summary = summarise(rows)
    print_summary(summary)

    result: Dict[str, object] = {"rows": rows, "summary": summary, "sizes": sizes.__dict__}
    if not args.only or "decode" in args.only:
        tokens_per_s = decode_throughput(sizes, repeats)
        compiles, how = decode_compiles_fresh_cache(sizes, args.quick)
        print_decode(tokens_per_s, compiles, how, sizes.decode_tokens)
        result["decode"] = {"tokens_per_s": tokens_per_s, "compiles": compiles, "how": how}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
