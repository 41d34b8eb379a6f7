"""A small Qwen3-style decoder-only language model in plain PyTorch.

Architecture (as in the Qwen3 family): token embedding, N pre-norm blocks of
grouped-query self-attention (with RMSNorm applied per head to queries and keys
before the rotary embedding) and a SwiGLU MLP, a final RMSNorm and an lm_head
that may share the embedding matrix.

Parameter names follow the Hugging Face ``Qwen3ForCausalLM`` layout
(``model.layers.0.self_attn.q_proj.weight`` ...), so a state dict of a tiny
HF model loads into this one; the tests use that to check this implementation
against an independent one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# One (key, value) pair per layer, each (batch, kv_heads, seq, head_dim).
KVCache = List[Tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Qwen3MiniConfig:
    vocab_size: int = 256
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 so that half-precision activations keep their accuracy.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        # Not persistent: derived from the config, so it stays out of state dicts.
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of shape (seq, head_dim) for integer positions of shape (seq,)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: Qwen3MiniConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        # Qwen3's addition over Qwen2: per-head RMSNorm of q and k keeps attention
        # logits bounded without a learned bias.
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        past: Optional[Tuple[torch.Tensor, torch.Tensor]],
    ) -> Tuple[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        batch, seq, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, seq, self.num_heads, self.head_dim))
        k = self.k_norm(self.k_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(batch, seq, self.num_kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)

        past_len = 0
        if past is not None:
            past_len = past[0].shape[2]
            k = torch.cat((past[0], k), dim=2)
            v = torch.cat((past[1], v), dim=2)
        present = (k, v)

        # Grouped-query attention: each kv head serves num_heads / num_kv_heads query
        # heads. Repeating k and v explicitly works with every SDPA kernel.
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)

        if past_len == 0 and seq > 1:
            # A branch, not is_causal=seq > 1: under torch.compile(dynamic=True)
            # `seq > 1` is a SymBool, which SDPA's is_causal refuses (a graph
            # break that sent the whole forward back to eager); Dynamo guards
            # on a branch.
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif seq == 1:
            # One new token attends to every cached position: no mask needed.
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            # Several new tokens after a cache: causal with an offset of past_len.
            total = past_len + seq
            rows = torch.arange(past_len, total, device=x.device)[:, None]
            cols = torch.arange(total, device=x.device)[None, :]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=cols <= rows)
        out = out.transpose(1, 2).reshape(batch, seq, self.num_heads * self.head_dim)
        return self.o_proj(out), present


class SwiGLU(nn.Module):
    def __init__(self, config: Qwen3MiniConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3MiniConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x, cos, sin, past):
        attn, present = self.self_attn(self.input_layernorm(x), cos, sin, past)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, present


class _Backbone(nn.Module):
    """The decoder stack; a separate module so that parameter names match HF's ``model.*``."""

    def __init__(self, config: Qwen3MiniConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)


class Qwen3Mini(nn.Module):
    def __init__(self, config: Optional[Qwen3MiniConfig] = None):
        super().__init__()
        self.config = config or Qwen3MiniConfig()
        self.model = _Backbone(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Small normal init (std 0.02) as in GPT-style models; the default Linear
        # init makes tied logits too large at the start of training.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        past_key_values: Optional[KVCache] = None,
        use_cache: bool = False,
    ):
        """Logits (batch, seq, vocab); with ``use_cache`` also the updated KV cache."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
        seq = input_ids.shape[1]
        past_len = past_key_values[0][0].shape[2] if past_key_values else 0
        if past_len + seq > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {past_len + seq} tokens exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings})"
            )
        positions = torch.arange(past_len, past_len + seq, device=input_ids.device)
        cos, sin = self.model.rotary(positions)
        cos, sin = cos.to(self.lm_head.weight.dtype), sin.to(self.lm_head.weight.dtype)

        x = self.model.embed_tokens(input_ids)
        presents: KVCache = []
        for i, layer in enumerate(self.model.layers):
            past = past_key_values[i] if past_key_values else None
            x, present = layer(x, cos, sin, past)
            presents.append(present)
        logits = self.lm_head(self.model.norm(x))
        if use_cache:
            return logits, presents
        return logits


@torch.no_grad()
def generate_greedy(model: Qwen3Mini, ids: torch.Tensor, n: int) -> torch.Tensor:
    """Append ``n`` greedily chosen tokens to ``ids`` (batch, seq) using the KV cache.

    Returns the prompt followed by the new tokens, on the prompt's device.
    """
    if ids.dim() == 1:
        ids = ids[None, :]
    was_training = model.training
    model.eval()
    try:
        logits, cache = model(ids, use_cache=True)
        out = [ids]
        for step in range(n):
            next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)
            out.append(next_id)
            if step + 1 < n:
                logits, cache = model(next_id, past_key_values=cache, use_cache=True)
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)
