"""Multi-head latent attention: keys and values rebuilt from one small cached latent per token, plus a shared rotary
key (DeepSeek-AI 2024, 'DeepSeek-V2', arXiv 2405.04434, section 2.1; 'DeepSeek-V3', arXiv 2412.19437)."""
from __future__ import annotations

import numbers

import torch
from torch import nn

from . import masks, rope
from .mechanisms._common import check_finite, scale, trusted

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


def _shared(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scores of per-head queries q (B, H, Nq, e) against keys every head shares, k (B, Nk, e): (B, H, Nq, Nk),
    one matmul with the heads folded into the rows, so k is never copied per head."""
    B, H, Nq, e = q.shape
    return (q.reshape(B, H * Nq, e) @ k.transpose(1, 2)).view(B, H, Nq, k.shape[1])


def _weights(scores: torch.Tensor, causal: bool, q_offset: int) -> torch.Tensor:
    """Softmax over keys; causal: query a (at position q_offset + a) sees key j iff j ≤ q_offset + a."""
    Nq, Nk = scores.shape[-2:]
    if causal and Nk - 1 > q_offset:  # otherwise every query sees every key (a generation step)
        i = torch.arange(Nq, device=scores.device)[:, None] + q_offset
        j = torch.arange(Nk, device=scores.device)[None, :]
        scores = scores.masked_fill(~masks.causal(i, j), float("-inf"))
    return torch.softmax(scores, dim=-1)


def _up(c_kv: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """Per-head vectors W_h c (+ b_h) of every latent: c_kv (B, N, r), w (H, D, r), b (H·D,) → (B, H, N, D)."""
    H, D, r = w.shape
    out = c_kv @ w.reshape(H * D, r).T  # (B, N, H·D)
    if b is not None:
        out = out + b
    return out.unflatten(-1, (H, D)).transpose(1, 2)


def latent_attention_naive(q_c: torch.Tensor, q_r: torch.Tensor, c_kv: torch.Tensor, k_r: torch.Tensor,
                           w_uk: torch.Tensor, w_uv: torch.Tensor, *, causal: bool = False, q_offset: int = 0,
                           b_uk: torch.Tensor | None = None, b_uv: torch.Tensor | None = None) -> torch.Tensor:
    """MLA as written: rebuild each head's keys k_C = W_UK,h c_KV and values v = W_UV,h c_KV for every token, then
    softmax attention with q_h = [q_C,h ; q_R,h], k_h = [k_C,h ; k_R] scaled by 1/√(D + ρ).

    q_c (B, H, Nq, D), q_r (B, H, Nq, ρ) (rotated), c_kv (B, Nk, r), k_r (B, Nk, ρ) (rotated, one for all heads),
    w_uk and w_uv (H, D, r) (nn.Linear(r, H·D).weight viewed so), b_uk and b_uv (H·D,) or None → (B, H, Nq, D).
    Causal: query a, at position q_offset + a, sees key j iff j ≤ q_offset + a. O(Nk·r·H·D + Nq·Nk·H·(D + ρ))
    time; O(Nk·H·D + Nq·Nk·H) memory (the rebuilt K, V and the scores).
    """
    _check_core(q_c, q_r, c_kv, k_r, w_uk, w_uv, q_offset)
    k_c, v = _up(c_kv, w_uk, b_uk), _up(c_kv, w_uv, b_uv)  # (B, H, Nk, D) each
    scores = (q_c @ k_c.transpose(-2, -1) + _shared(q_r, k_r)) * scale(q_c.shape[-1] + q_r.shape[-1])
    return _weights(scores, causal, q_offset) @ v


def latent_attention_absorbed(q_c: torch.Tensor, q_r: torch.Tensor, c_kv: torch.Tensor, k_r: torch.Tensor,
                              w_uk: torch.Tensor, w_uv: torch.Tensor, *, causal: bool = False, q_offset: int = 0,
                              b_uk: torch.Tensor | None = None, b_uv: torch.Tensor | None = None) -> torch.Tensor:
    """MLA in latent space, no per-head K or V ever built: W_UK folds into the queries,
    q̃_h = W_UK,hᵀ q_C,h (width r), so q_C,h·k_C,h,j = q̃_h·c_KV,j; scores q̃_h·c_KV,j + q_R,h·k_R,j scaled by
    1/√(D + ρ); o_h = W_UV,h Σ_j p_hj c_KV,j (+ b_UV,h, as the weights sum to 1). b_UK is not needed: q_C,h·b_UK,h
    is the same for every key of a query and softmax cancels it.

    Shapes and mask as `latent_attention_naive`, the same result up to rounding. O(Nq·H·D·r + Nq·Nk·H·(r + ρ))
    time; O(Nq·Nk·H + Nq·H·r) memory: a head reads the latents themselves, like multi-query attention of width r + ρ.
    """
    _check_core(q_c, q_r, c_kv, k_r, w_uk, w_uv, q_offset)
    B, H, Nq, _ = q_c.shape
    q_lat = torch.einsum("bhnd,hdr->bhnr", q_c, w_uk)  # W_UK,hᵀ q_C,h: (B, H, Nq, r)
    scores = (_shared(q_lat, c_kv) + _shared(q_r, k_r)) * scale(q_c.shape[-1] + q_r.shape[-1])
    p = _weights(scores, causal, q_offset)  # (B, H, Nq, Nk)
    o_lat = (p.reshape(B, H * Nq, -1) @ c_kv).view(B, H, Nq, -1)  # Σ_j p_hj c_KV,j: (B, H, Nq, r)
    out = torch.einsum("bhnr,hdr->bhnd", o_lat, w_uv)
    return out if b_uv is None else out + b_uv.view(H, 1, -1)


def _check_core(q_c, q_r, c_kv, k_r, w_uk, w_uv, q_offset) -> None:
    """ValueError with a sentence unless the shapes fit together (skipped inside `_common.validated()`)."""
    if trusted():
        return
    tensors = {"q_c": q_c, "q_r": q_r, "c_kv": c_kv, "k_r": k_r, "w_uk": w_uk, "w_uv": w_uv}
    for name, t in tensors.items():
        want = 4 if name.startswith("q") else 3
        if not isinstance(t, torch.Tensor) or t.dim() != want or not t.is_floating_point():
            got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a {want}-D floating-point tensor, got {got}")
    B, H, Nq, D = q_c.shape
    r, rho, Nk = c_kv.shape[-1], q_r.shape[-1], c_kv.shape[1]
    expected = {"q_r": (B, H, Nq, rho), "c_kv": (B, Nk, r), "k_r": (B, Nk, rho), "w_uk": (H, D, r),
                "w_uv": (H, D, r)}
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(tensors[name].shape)}, but q_c {tuple(q_c.shape)}, c_kv's "
                             f"width {r} and q_r's {rho} ask for {shape}")
    if len({t.dtype for t in tensors.values()}) > 1 or len({t.device for t in tensors.values()}) > 1:
        raise ValueError("q_c, q_r, c_kv, k_r, w_uk and w_uv must share one dtype and one device")
    if isinstance(q_offset, bool) or not isinstance(q_offset, numbers.Integral) or q_offset < 0:
        raise ValueError(f"q_offset is the position of the first query, a whole number ≥ 0; got {q_offset!r}")


class LatentCache:
    """What MLA remembers of the tokens so far, and only that: the latents c_KV (B, capacity, kv_rank) and the
    rotated shared keys k_R (B, capacity, rope_dim), token p in row p, `length` rows filled. Built from a prompt's
    latents (copied, detached: generation is inference), with room for `max_len` tokens at once; full, it doubles
    (one copy, amortized O(1) a token). `nbytes`: bytes held; `used_bytes`: bytes of the filled rows,
    B·length·(kv_rank + rope_dim)·elem."""

    def __init__(self, c_kv: torch.Tensor, k_r: torch.Tensor, *, max_len: int | None = None):
        B, n, _ = c_kv.shape
        capacity = max(n, max_len or 0)
        self.c_kv = c_kv.new_empty(B, capacity, c_kv.shape[-1])
        self.k_r = k_r.new_empty(B, capacity, k_r.shape[-1])
        self.c_kv[:, :n] = c_kv.detach()
        self.k_r[:, :n] = k_r.detach()
        self.length = n

    @property
    def capacity(self) -> int:
        return self.c_kv.shape[1]

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled rows, (B, length, kv_rank) and (B, length, rope_dim) views."""
        return self.c_kv[:, :self.length], self.k_r[:, :self.length]

    def append(self, c_kv: torch.Tensor, k_r: torch.Tensor) -> None:
        """Write one token's latent (B, 1, kv_rank) and rotated key (B, 1, rope_dim) into row `length`, doubling
        the buffers first when they are full."""
        if self.length == self.capacity:
            grown = 2 * self.capacity
            for name in ("c_kv", "k_r"):
                old = getattr(self, name)
                new = old.new_empty(old.shape[0], grown, old.shape[2])
                new[:, :self.length] = old[:, :self.length]
                setattr(self, name, new)
        self.c_kv[:, self.length:self.length + 1] = c_kv.detach()
        self.k_r[:, self.length:self.length + 1] = k_r.detach()
        self.length += 1

    def mark(self) -> tuple[int]:
        """Where the cache stands: (length,)."""
        return (self.length,)

    def rewind(self, mark: tuple[int]) -> None:
        """Back to `mark` (from `mark()`), for timing one step at a fixed context: only `length` moves. Rows keep
        the token of their position, so the next step writes row `mark` and reads rows 0 … mark, and its output is
        that of the context at `mark`. A cache that grew meanwhile keeps its larger buffers."""
        if (not isinstance(mark, tuple) or len(mark) != 1 or isinstance(mark[0], bool)
                or not isinstance(mark[0], numbers.Integral)):
            raise ValueError(f"rewind takes what mark() returned, a tuple of one whole number such as "
                             f"{self.mark()}; got {mark!r}")
        if not 0 <= mark[0] <= self.length:
            raise ValueError(f"cannot rewind to {mark}: this cache stands at {self.mark()}, and rewind only goes "
                             f"back; take the mark with mark() before the steps to undo")
        self.length = int(mark[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.c_kv, self.k_r))

    @property
    def used_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.view())

    def __repr__(self) -> str:
        return (f"LatentCache(batch={self.c_kv.shape[0]}, kv_rank={self.c_kv.shape[2]}, "
                f"rope_dim={self.k_r.shape[2]}, length={self.length}, capacity={self.capacity}, "
                f"nbytes={self.nbytes})")


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
