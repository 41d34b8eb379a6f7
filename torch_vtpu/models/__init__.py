"""Small models in plain PyTorch, used by the demo, the CLI and the parity tests.

Nothing here depends on the vtpu device: each model runs on any device, which is
what lets tests compare a vtpu run against a stock-CPU run of the same weights.
"""
from .qwen3_mini import KVCache, Qwen3Mini, Qwen3MiniConfig, generate_greedy
from .reference import CNNClassifier, LSTMClassifier, MLP

__all__ = [
    "Qwen3MiniConfig",
    "Qwen3Mini",
    "KVCache",
    "generate_greedy",
    "MLP",
    "CNNClassifier",
    "LSTMClassifier",
]
