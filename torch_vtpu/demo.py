"""End-to-end demo: train a small Qwen3-style language model on a tiny English corpus
on the vtpu device, compare throughput across modes and with stock CPU, and sample.

    python -m torch_vtpu demo [--seconds 90] [--no-debug] [--no-cpu]

Tokens are raw UTF-8 bytes (vocabulary of 256), so the demo needs no tokenizer files.
The run is bounded by wall-clock time, not by a step count, so it finishes in about
the same time on any machine.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F

import torch_vtpu
from torch_vtpu.models import Qwen3Mini, Qwen3MiniConfig, generate_greedy
from torch_vtpu._arguments import positive_seconds

CORPUS = "tiny_corpus.txt"
# Training window. Rotary positions beyond it are never seen in training, so a sample
# longer than this degrades into noise: samples are capped at this length too.
SEQ_LEN = 128
BATCH_SIZE = 8


# ---- data ------------------------------------------------------------------

def load_corpus() -> str:
    """The demo corpus shipped inside the package (torch_vtpu/data)."""
    return importlib.resources.files("torch_vtpu").joinpath("data", CORPUS).read_text(encoding="utf-8")


class ByteTokenizer:
    """UTF-8 bytes as tokens: lossless for any text, and no vocabulary file to ship."""

    vocab_size = 256

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        # A greedy sample may stop in the middle of a multi-byte character.
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


def demo_config() -> Qwen3MiniConfig:
    """Small enough for a step of ~1k tokens a few times a second on two CPU cores,
    big enough to learn words."""
    return Qwen3MiniConfig(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )


def random_batch(data: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, seq_len + 1) windows at random offsets; drawn on the CPU so that every
    device and mode sees exactly the same batches for the same seed."""
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])


# ---- training --------------------------------------------------------------

@dataclass
class TrainResult:
    device: str
    mode: str
    steps: int
    tokens: int
    seconds: float
    losses: List[float] = field(default_factory=list)
    model: Optional[Qwen3Mini] = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def final_loss(self) -> float:
        # Mean of the last few steps: a single step's loss is noisy.
        tail = self.losses[-10:]
        return sum(tail) / len(tail) if tail else math.nan


def train(
    device: str = "vtpu",
    mode: str = "strict",
    max_seconds: float = 60.0,
    max_steps: Optional[int] = None,
    batch_size: int = BATCH_SIZE,
    seq_len: int = SEQ_LEN,
    lr: float = 3e-3,
    seed: int = 0,
    config: Optional[Qwen3MiniConfig] = None,
    progress: bool = True,
    log_every: int = 10,
) -> TrainResult:
    """Train from a fixed seed until ``max_seconds`` (or ``max_steps``) is used up.

    ``mode`` is the vtpu execution mode and is ignored for other devices. The clock
    starts after the model is on the device; the first step (warm-up) is included.
    """
    from tqdm.auto import tqdm

    tokenizer = ByteTokenizer()
    data = torch.tensor(tokenizer.encode(load_corpus()), dtype=torch.long)
    config = config or demo_config()

    # Weights are initialised on the CPU from the seed, then moved: every device and
    # mode starts from the same model.
    torch.manual_seed(seed)
    model = Qwen3Mini(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed)

    is_vtpu = torch.device(device).type == "vtpu"
    scope = torch_vtpu.mode(mode) if is_vtpu else contextlib.nullcontext()
    pending: List[torch.Tensor] = []  # losses not yet read back: reading forces a sync
    losses: List[float] = []
    steps = 0
    label = f"{device} ({mode})" if is_vtpu else device
    bar = tqdm(total=max_steps, desc=f"train {label}", unit="step", disable=not progress, leave=False)
    with scope:
        start = time.perf_counter()
        while True:
            if max_steps is not None and steps >= max_steps:
                break
            if time.perf_counter() - start >= max_seconds:
                break
            batch = random_batch(data, batch_size, seq_len, generator).to(device)
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), batch[:, 1:].reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            pending.append(loss.detach())
            steps += 1
            # Read losses back only every few steps: each read waits for the device
            # stream, and doing it every step would hide the asynchronous execution.
            if steps % log_every == 0:
                losses.extend(torch.stack(pending).tolist())
                pending.clear()
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
            bar.update(1)
        if pending:
            losses.extend(torch.stack(pending).tolist())
        if is_vtpu:
            torch.vtpu.synchronize()
        seconds = time.perf_counter() - start
    bar.close()
    return TrainResult(device, mode if is_vtpu else "eager", steps, steps * batch_size * seq_len,
                       seconds, losses, model)


def sample(model: Qwen3Mini, prompt: str, n: Optional[int] = None) -> str:
    """Greedy continuation of ``prompt`` (KV-cached), decoded back to text; by default
    it fills the training window (SEQ_LEN tokens including the prompt)."""
    tokenizer = ByteTokenizer()
    device = next(model.parameters()).device
    ids = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)
    if n is None:
        n = max(SEQ_LEN - ids.shape[1], 1)
    n = min(n, model.config.max_position_embeddings - ids.shape[1])
    out = generate_greedy(model, ids, n)
    return tokenizer.decode(out[0].tolist())


# ---- CLI -------------------------------------------------------------------

def _report(result: TrainResult, out: Callable[[str], None]) -> None:
    out(
        f"  {result.device:<5} {result.mode:<7} {result.steps:>5} steps  {result.seconds:6.1f} s  "
        f"{result.tokens_per_s:>9,.0f} tokens/s  loss {result.losses[0]:.3f} -> {result.final_loss:.3f}"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_vtpu demo", description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seconds", type=positive_seconds, default=90.0, help="total time budget (default 90)")
    parser.add_argument("--no-debug", action="store_true", help="skip the short debug-mode run")
    parser.add_argument("--no-cpu", action="store_true", help="skip the stock-CPU comparison run")
    parser.add_argument("--prompt", default="The river ", help="prompt for the generated sample")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    args = parser.parse_args(argv)

    out = print
    config = demo_config()
    n_params = sum(p.numel() for p in Qwen3Mini(config).parameters())
    out(f"vtpu demo: Qwen3-style decoder, {n_params / 1e6:.2f}M parameters, byte tokens, "
        f"corpus {len(load_corpus().encode()) / 1024:.0f} KiB, budget {args.seconds:.0f} s")

    # The main run gets most of the budget; the comparison runs only need long enough
    # for a stable throughput figure, and the sample needs a few seconds.
    short = min(10.0, 0.12 * args.seconds)
    main_budget = args.seconds - 6.0 - short * ((not args.no_debug) + (not args.no_cpu))
    main_budget = max(main_budget, short)
    progress = not args.no_progress

    results = [train("vtpu", "strict", max_seconds=main_budget, config=config, progress=progress)]
    trained = results[0].model
    if not args.no_debug:
        results.append(train("vtpu", "debug", max_seconds=short, config=config, progress=progress))
    if not args.no_cpu:
        results.append(train("cpu", max_seconds=short, config=config, progress=progress))

    out("results (same seed, same batches):")
    for result in results:
        _report(result, out)
    out(f"final loss (vtpu strict): {results[0].final_loss:.4f}")
    cpu = [r for r in results if r.device == "cpu"]
    if cpu and cpu[0].tokens_per_s > 0:
        out(f"vtpu strict / stock CPU throughput: {results[0].tokens_per_s / cpu[0].tokens_per_s:.2f}x")

    start = time.perf_counter()
    text = sample(trained, args.prompt)
    out(f"greedy sample ({time.perf_counter() - start:.1f} s):")
    out("  " + text.replace("\n", "\n  "))
    m = torch_vtpu.metrics()
    fallbacks = sum(m["host_fallback_ops"].values())
    out(f"metrics: {m['ops']:,} ops, {m['kernels_launched']:,} kernels, "
        f"{fallbacks:,} host-kernel-path ops, syncs {dict(m['syncs'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
