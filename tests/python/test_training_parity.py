"""Training parity: 20 AdamW steps on vtpu give the same losses as on stock CPU.

Each model starts from the same weights (a CPU model, deep-copied and moved to the
device) and fits the same fixed batch, drawn on the CPU from a seeded generator, so
the loss falls steadily. Nothing random runs on the device (no dropout), so any
difference is the backend's.

Both sides run the same AdamW implementation (foreach, the default on vtpu). Losses
are compared step by step to a relative 1e-5, not bitwise: the MLP and the CNN do
match bitwise today, but PyTorch routes a few ops differently for a PrivateUse1
device than for the CPU (the LSTM runs vtpu's composite of the fused cell that ATen
only has for CUDA; some decoder ops decompose differently), which rounds differently
in the last bit.
"""
import copy
import functools
from typing import Callable, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_vtpu
from torch_vtpu.models import CNNClassifier, LSTMClassifier, MLP, Qwen3Mini, Qwen3MiniConfig

STEPS = 20
LR = 3e-3
RTOL = 1e-5
ATOL = 1e-7  # only matters for losses near 0, where a relative bound is too strict

Batch = Tuple[torch.Tensor, torch.Tensor]


def _classification_batch(make_x: Callable[[torch.Generator], torch.Tensor], classes: int) -> Batch:
    g = torch.Generator().manual_seed(1)
    return make_x(g), torch.randint(0, classes, (8,), generator=g)


def _make_mlp():
    return MLP(in_features=32, hidden=64, out_features=10), _classification_batch(
        lambda g: torch.randn(8, 32, generator=g), 10)


def _make_cnn():
    return CNNClassifier(in_channels=1, num_classes=10, width=8), _classification_batch(
        lambda g: torch.randn(8, 1, 16, 16, generator=g), 10)


def _make_lstm():
    return LSTMClassifier(vocab_size=50, embed=16, hidden=32, num_classes=4), _classification_batch(
        lambda g: torch.randint(0, 50, (8, 12), generator=g), 4)


def _make_qwen(tied: bool):
    config = Qwen3MiniConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             max_position_embeddings=64, tie_word_embeddings=tied)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, config.vocab_size, (4, 17), generator=g)
    return Qwen3Mini(config), (tokens[:, :-1], tokens[:, 1:])


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


CASES = {
    "mlp": (_make_mlp, F.cross_entropy),
    "cnn_batchnorm": (_make_cnn, F.cross_entropy),
    "lstm_2layer": (_make_lstm, F.cross_entropy),
    "qwen3_untied": (functools.partial(_make_qwen, False), _lm_loss),
    "qwen3_tied": (functools.partial(_make_qwen, True), _lm_loss),
}


@functools.lru_cache(maxsize=None)
def _initial(name: str) -> Tuple[nn.Module, Batch]:
    torch.manual_seed(0)
    make, _ = CASES[name]
    return make()


def _train(name: str, device: str) -> Tuple[torch.Tensor, nn.Module]:
    """Per-step losses of STEPS AdamW steps (copied to the CPU) and the trained model."""
    initial, (x, y) = _initial(name)
    _, loss_fn = CASES[name]
    model = copy.deepcopy(initial).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, foreach=True)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses).cpu(), model


@functools.lru_cache(maxsize=None)
def _cpu_reference(name: str) -> Tuple[torch.Tensor, nn.Module]:
    return _train(name, "cpu")


@pytest.mark.parametrize("mode", ["strict", "debug"])
@pytest.mark.parametrize("name", list(CASES))
def test_losses_match_cpu(name: str, mode: str) -> None:
    expected, cpu_model = _cpu_reference(name)
    with torch_vtpu.mode(mode):
        actual, vtpu_model = _train(name, "vtpu")
        torch.vtpu.synchronize()
    # The loss must actually go down, or matching would prove little.
    assert expected[-1] < 0.9 * expected[0], f"{name}: reference did not train: {expected.tolist()}"
    torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL,
                               msg=lambda m: f"{name} ({mode}) losses differ from CPU:\n{m}\n"
                                             f"vtpu {actual.tolist()}\ncpu  {expected.tolist()}")
    # Buffers too: BatchNorm's running statistics are updated by the device.
    device_buffers = dict(vtpu_model.named_buffers())
    for key, ref in cpu_model.named_buffers():
        if ref.dtype.is_floating_point:
            torch.testing.assert_close(device_buffers[key].cpu(), ref, rtol=RTOL, atol=1e-6,
                                       msg=lambda m: f"buffer {key}: {m}")
        else:
            assert torch.equal(device_buffers[key].cpu(), ref), f"buffer {key}"
    # Weights: Adam scales every update to about LR, so an element whose gradient is
    # pure rounding noise may move differently by a fraction of LR; allow 1% of it.
    device_params = dict(vtpu_model.named_parameters(remove_duplicate=False))
    for key, ref in cpu_model.named_parameters(remove_duplicate=False):
        torch.testing.assert_close(device_params[key].detach().cpu(), ref.detach(), rtol=1e-4,
                                   atol=0.01 * LR, msg=lambda m: f"parameter {key}: {m}")


def test_cnn_eval_uses_device_running_stats() -> None:
    """After training, eval-mode BatchNorm normalises with the device's running stats."""
    cpu_model = copy.deepcopy(_cpu_reference("cnn_batchnorm")[1])  # the cached one stays as is
    with torch_vtpu.mode("strict"):
        _, vtpu_model = _train("cnn_batchnorm", "vtpu")
    x = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(7))
    cpu_model.eval()
    vtpu_model.eval()
    with torch.no_grad():
        torch.testing.assert_close(vtpu_model(x.to("vtpu")).cpu(), cpu_model(x), rtol=1e-4, atol=1e-5)


def test_module_to_keeps_tied_weights() -> None:
    """Module.to("vtpu") must move a shared Parameter once and keep it shared, as it
    does for CUDA; otherwise a tied lm_head silently becomes a second matrix."""
    torch.manual_seed(0)
    model = Qwen3Mini(Qwen3MiniConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                      tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    model.to("vtpu")
    assert model.lm_head.weight.device.type == "vtpu"
    assert model.lm_head.weight is model.model.embed_tokens.weight, (
        "Module.to('vtpu') replaced the shared Parameter by two separate ones")
