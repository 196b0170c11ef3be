"""Multi-head latent attention: keys and values rebuilt from one small cached latent per token, plus a shared rotary
key (DeepSeek-AI 2024, 'DeepSeek-V2', arXiv 2405.04434, section 2.1; 'DeepSeek-V3', arXiv 2412.19437)."""
from __future__ import annotations

import numbers

import torch
from torch import nn

from attn_core.positions import rope
from attn_core.mechanisms._common import check_finite
from attn_core.mechanisms.mla import LatentCache, latent_attention_absorbed, latent_attention_naive

# DeepSeek-V2 and V3 (both papers, their model settings): 128 heads of head_dim 128, kv_rank (d_c) 512 = 4·head_dim,
# rope_dim (d_h^R) 64 = head_dim/2, q_rank (d_c') 1536 = 12·head_dim. A token then caches 512 + 64 = 576 values a
# layer, where multi-head attention of the same heads caches 2·128·128 = 32,768. The V2 paper reports its KV cache
# 93.3% smaller than that of its dense DeepSeek 67B (a different model, not this same-shape comparison).
DEEPSEEK = {"heads": 128, "head_dim": 128, "kv_rank": 512, "rope_dim": 64, "q_rank": 1536}


def deepseek_proportions(heads: int, head_dim: int) -> dict[str, int]:
    """DeepSeek-V2/V3's sizes scaled to `heads` of `head_dim`: kv_rank = 4·head_dim, rope_dim = head_dim/2,
    q_rank = 12·head_dim, as keyword arguments of MultiLatentAttention(d_model, **deepseek_proportions(H, D)).
    head_dim must be a multiple of 4 (rope_dim even)."""
    _positive("heads", heads)
    _positive("head_dim", head_dim)
    if head_dim % 4:
        raise ValueError(f"head_dim {head_dim} gives rope_dim = head_dim/2 = {head_dim / 2}, which must be an even "
                         f"integer; choose a head_dim that is a multiple of 4")
    return {"heads": heads, "head_dim": head_dim, "kv_rank": 4 * head_dim, "rope_dim": head_dim // 2,
            "q_rank": 12 * head_dim}


def cache_elements(kv_rank: int, rope_dim: int) -> int:
    """Values a token caches in one layer: its latent c_KV and its shared rotary key k_R, kv_rank + rope_dim
    (multi-head attention caches 2·H·D, `mha_cache_elements`)."""
    return kv_rank + rope_dim


def mha_cache_elements(heads: int, head_dim: int) -> int:
    """Values a token caches in one layer of multi-head attention: a key and a value per head, 2·H·D."""
    return 2 * heads * head_dim


def cache_bytes(batch: int, tokens: int, kv_rank: int, rope_dim: int, elem: int) -> int:
    """Bytes of the latent cache of `tokens` tokens: B·tokens·(kv_rank + rope_dim)·elem."""
    return batch * tokens * cache_elements(kv_rank, rope_dim) * elem


def step_flops(heads: int, head_dim: int, kv_rank: int, rope_dim: int, context: int, absorbed: bool) -> float:
    """Matmul FLOPs (a multiply-add is 2) of one generation step's attention core, per sequence, reading `context`
    cached tokens (the new one included); the projections of the new token, alike in both forms, are left out.
    With H heads, D = head_dim, r = kv_rank, ρ = rope_dim, L = context:
    naive     4·L·H·D·r (rebuild K and V)    + 2·L·H·(D + ρ) (scores) + 2·L·H·D (weighted values);
    absorbed  2·H·D·r (fold W_UK into q)     + 2·L·H·(r + ρ) (scores) + 2·L·H·r (weighted latents)
              + 2·H·D·r (fold W_UV into the output)."""
    H, D, r, L = heads, head_dim, kv_rank, context
    if absorbed:
        return 4.0 * H * D * r + 2.0 * L * H * (2 * r + rope_dim)
    return 4.0 * L * H * D * r + 2.0 * L * H * (2 * D + rope_dim)


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class MultiLatentAttention(nn.Module):
    """Multi-head latent attention, (B, N, d_model) → (B, N, d_model), with DeepSeek-V2's projections (its eqs. 9–19):

    c_KV = W_DKV h (kv_rank), cached;  k_C,h = W_UK,h c_KV, v_h = W_UV,h c_KV (head_dim each);
    k_R = RoPE(W_KR h) (rope_dim), cached, one for all heads;
    c_Q = W_DQ h (q_rank; with q_rank None the query projections read h itself);
    q_C,h = W_UQ,h c_Q (head_dim), q_R,h = RoPE(W_QR,h c_Q) (rope_dim);
    o_h = softmax_j([q_C,h ; q_R,h]·[k_C,h,j ; k_R,j] / √(head_dim + rope_dim)) v_h,j;  out = W_O [o_1 … o_H].

    `absorbed` (a plain attribute, flip it at will) picks the computation: False rebuilds K and V from the latents
    (`latent_attention_naive`); True attends in latent space (`latent_attention_absorbed`). One state_dict serves
    both. DeepSeek's released models also RMS-normalize c_KV and c_Q; the paper's equations, followed here, do not.
    Generation: `prefill` then `step`, caching only c_KV and k_R (`LatentCache`), kv_rank + rope_dim values a token.
    """

    def __init__(self, d_model: int, heads: int, kv_rank: int, rope_dim: int, head_dim: int, *,
                 q_rank: int | None = None, absorbed: bool = False, bias: bool = False, base: float = 10000.0):
        super().__init__()
        sizes = {"d_model": d_model, "heads": heads, "kv_rank": kv_rank, "rope_dim": rope_dim, "head_dim": head_dim}
        for name, value in {**sizes, **({} if q_rank is None else {"q_rank": q_rank})}.items():
            _positive(name, value)
        if rope_dim % 2:
            raise ValueError(f"rope_dim {rope_dim} must be even: rotary embedding turns features in pairs")
        rope.angles(torch.zeros(1), 2, base)  # ValueError with a sentence for a bad base, before any weight exists
        self.d_model, self.heads, self.head_dim = d_model, heads, head_dim
        self.kv_rank, self.rope_dim = kv_rank, rope_dim
        self.q_rank, self.absorbed, self.base = q_rank, absorbed, float(base)
        H, D = heads, head_dim
        self.w_dkv = nn.Linear(d_model, kv_rank, bias=bias)
        self.w_kr = nn.Linear(d_model, rope_dim, bias=bias)
        self.w_uk = nn.Linear(kv_rank, H * D, bias=bias)
        self.w_uv = nn.Linear(kv_rank, H * D, bias=bias)
        self.w_dq = None if q_rank is None else nn.Linear(d_model, q_rank, bias=bias)
        self.w_uq = nn.Linear(q_rank or d_model, H * D, bias=bias)
        self.w_qr = nn.Linear(q_rank or d_model, H * rope_dim, bias=bias)
        self.w_o = nn.Linear(H * D, d_model, bias=bias)

    def extra_repr(self) -> str:
        return (f"heads={self.heads}, head_dim={self.head_dim}, kv_rank={self.kv_rank}, rope_dim={self.rope_dim}, "
                f"q_rank={self.q_rank}, absorbed={self.absorbed}")

    @property
    def cache_elements(self) -> int:
        """Values a token caches in this layer: kv_rank + rope_dim."""
        return cache_elements(self.kv_rank, self.rope_dim)

    def _queries(self, x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        c_q = x if self.w_dq is None else self.w_dq(x)
        q_c = self.w_uq(c_q).unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)  # (B, H, N, D)
        q_r = self.w_qr(c_q).unflatten(-1, (self.heads, self.rope_dim)).transpose(1, 2)  # (B, H, N, ρ)
        return q_c, rope.apply(q_r, *tables)

    def _latents(self, x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return self.w_dkv(x), rope.apply(self.w_kr(x), *tables)  # (B, N, r), (B, N, ρ)

    def _tables(self, x: torch.Tensor, first: int) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(first, first + x.shape[1], device=x.device)
        return rope.angles(positions, self.rope_dim, self.base,
                           dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)

    def _attend(self, q_c, q_r, c_kv, k_r, *, causal: bool, q_offset: int) -> torch.Tensor:
        """The core on this layer's up-projections, then W_O: → (B, Nq, d_model)."""
        H, D, r = self.heads, self.head_dim, self.kv_rank
        core = latent_attention_absorbed if self.absorbed else latent_attention_naive
        o = core(q_c, q_r, c_kv, k_r, self.w_uk.weight.view(H, D, r), self.w_uv.weight.view(H, D, r),
                 causal=causal, q_offset=q_offset, b_uk=self.w_uk.bias, b_uv=self.w_uv.bias)
        return self.w_o(o.transpose(1, 2).flatten(2))  # (B, Nq, H·D) → (B, Nq, d_model)

    def _run(self, x: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tables = self._tables(x, 0)
        c_kv, k_r = self._latents(x, tables)
        return self._attend(*self._queries(x, tables), c_kv, k_r, causal=causal, q_offset=0), c_kv, k_r

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """x (B, N, d_model) → (B, N, d_model), tokens at positions 0 … N − 1; causal: token i sees tokens
        j ≤ i. Naive: O(N·r·H·D + N²·H·(D + ρ)) time; absorbed: O(N·H·D·r + N²·H·(r + ρ)); both hold the N×N
        scores per head."""
        self._check(x)
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be True or False, got {causal!r}")
        return self._run(x, causal)[0]

    def prefill(self, x: torch.Tensor, *, max_len: int | None = None) -> tuple[torch.Tensor, LatentCache]:
        """The causal outputs of a prompt x (B, n, d_model) and its cache, with room for `max_len` tokens (≥ n; None:
        n, doubling as steps add tokens)."""
        self._check(x)
        n = x.shape[1]
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral)
                                    or max_len < n):
            raise ValueError(f"max_len = {max_len!r} cannot hold the prompt of {n} tokens; pass an integer ≥ {n}, or "
                             f"None to let the cache grow")
        out, c_kv, k_r = self._run(x, True)
        return out, LatentCache(c_kv, k_r, max_len=max_len)

    def step(self, x_t: torch.Tensor, cache: LatentCache) -> tuple[torch.Tensor, LatentCache]:
        """One new token x_t (B, 1, d_model) at position cache.length: its latent and rotated key are written into
        the cache (in place), then it attends to every cached token, itself included → (B, 1, d_model).
        With L = cache.length after the write: naive O(L·r·H·D) (the whole latent cache is up-projected again);
        absorbed O(L·H·(r + ρ) + H·D·r); see `step_flops`."""
        self._check(x_t)
        self._check_cache(x_t, cache)
        tables = self._tables(x_t, cache.length)
        q_c, q_r = self._queries(x_t, tables)
        cache.append(*self._latents(x_t, tables))
        c_kv, k_r = cache.view()
        return self._attend(q_c, q_r, c_kv, k_r, causal=True, q_offset=cache.length - 1), cache

    def _check(self, x: torch.Tensor) -> None:
        """ValueError with a sentence unless x is a finite (B, N, d_model) tensor of the weights' dtype and device."""
        weight = self.w_dkv.weight
        if weight.is_meta:
            raise ValueError("this layer's weights are on the meta device, which holds shapes but no values; give "
                             "them values first, e.g. layer.to_empty(device='cpu') and then layer.load_state_dict(...)")
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"x must be a torch tensor of dtype {weight.dtype}, got {type(x).__name__}")
        if x.dtype != weight.dtype:
            raise ValueError(f"x has dtype {x.dtype} but this layer's weights are {weight.dtype}; convert the input "
                             f"with x.to({weight.dtype}), or the layer with layer.to({x.dtype})")
        if x.device != weight.device:
            raise ValueError(f"x is on {x.device} but this layer's weights are on {weight.device}; move one of them")
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must be (batch, tokens, {self.d_model}), got {tuple(x.shape)}")
        check_finite(x=x)

    def _check_cache(self, x_t: torch.Tensor, cache: LatentCache) -> None:
        if not isinstance(cache, LatentCache):
            raise ValueError(f"cache must be the LatentCache that prefill returned, got {type(cache).__name__}")
        if cache.c_kv.shape[2] != self.kv_rank or cache.k_r.shape[2] != self.rope_dim:
            raise ValueError(f"this cache holds latents of width {cache.c_kv.shape[2]} and rotary keys of width "
                             f"{cache.k_r.shape[2]}, but this layer makes {self.kv_rank} and {self.rope_dim}: step "
                             f"it with the layer that prefilled it")
        if tuple(x_t.shape[:2]) != (cache.c_kv.shape[0], 1):
            raise ValueError(f"x_t must be one new token per sequence, ({cache.c_kv.shape[0]}, 1, {self.d_model}) "
                             f"for this cache; got {tuple(x_t.shape)}")
        if cache.c_kv.dtype != x_t.dtype or cache.c_kv.device != x_t.device:
            raise ValueError(f"the cache holds {cache.c_kv.dtype} on {cache.c_kv.device} but x_t is {x_t.dtype} on "
                             f"{x_t.device}; step it with the layer and dtype that prefilled it")
