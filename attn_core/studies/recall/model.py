"""The tiny causal model recall trains: embeddings, pre-norm blocks of any mechanism of the catalogue, an output
head."""
from __future__ import annotations

import torch
from torch import nn

from attn_core.nn.layers import MultiHeadAttention


class Block(nn.Module):
    """x + attention(norm(x)), then x + MLP(norm(x)) (pre-norm, as GPT-2): (B, n, d) → (B, n, d)."""

    def __init__(self, d_model: int, heads: int, mechanism: str, params: dict, kv_heads: int | None, seed: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attention = MultiHeadAttention(d_model, heads, mechanism, True, kv_heads=kv_heads, seed=seed, **params)
        self.mlp = nn.Sequential(nn.Linear(d_model, 2 * d_model), nn.GELU(), nn.Linear(2 * d_model, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    """Token and learned position embeddings, `layers` causal Blocks of mechanism `key`, a norm and an output head:
    tokens (B, n) int64 → logits (B, n, vocab). Position embeddings because attention alone cannot tell which key
    came just before a value (Zoology's attention baselines carry them too). Weights drawn from `seed`."""

    def __init__(self, key: str, vocab: int, seq: int, *, d_model: int = 64, layers: int = 2, heads: int = 2,
                 kv_heads: int | None = None, params: dict | None = None, seed: int = 0):
        super().__init__()
        with torch.random.fork_rng(devices=[]):  # the weights depend on `seed` alone, never on the caller's RNG
            torch.manual_seed(seed)
            self.embed, self.position = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)
            self.previous = nn.Embedding(vocab, d_model)  # the token before, a width-2 causal convolution
            self.blocks = nn.ModuleList(Block(d_model, heads, key, dict(params or {}), kv_heads, seed + i)
                                        for i in range(layers))
            self.norm, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))
        x = x + nn.functional.pad(self.previous(tokens[:, :-1]), (0, 0, 1, 0))  # position 0 has no token before
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
