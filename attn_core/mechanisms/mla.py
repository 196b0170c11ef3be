"""Multi-head latent attention's core: per-head queries against keys and values rebuilt from one cached latent per
token, plus a rotary key every head shares (DeepSeek-AI 2024, 'DeepSeek-V2', arXiv 2405.04434, section 2.1). Two
computations of the same function: naive (rebuild K and V, then attend) and absorbed (attend in latent space).

It attends over latents, not over q, k and v of D values a head, so it takes its own operands (spec.operands) and is
measured by the engine beside the mechanisms (mechanisms.MEASURED), not called through `attention`; the layer around
it, with its projections and rotary embedding, is attn_core.MultiLatentAttention."""
from __future__ import annotations

import numbers

import torch

from .. import masks
from ..spec import Cost, Generation, MechanismSpec, Operands, Param, Shape, State, Supports
from ._common import scale, trusted


def _shared(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scores of per-head queries q (B, H, Nq, e) against keys every head shares, k (B, Nk, e): (B, H, Nq, Nk),
    one matmul with the heads folded into the rows, so k is never copied per head."""
    B, H, Nq, e = q.shape
    return (q.reshape(B, H * Nq, e) @ k.transpose(1, 2)).view(B, H, Nq, k.shape[1])


def _add_shared(scores: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """scores (B, H, Nq, Nk) += `_shared(q, k)`, written into scores (no second Nq × Nk buffer)."""
    B, H, Nq, Nk = scores.shape
    scores.view(B, H * Nq, Nk).baddbmm_(q.reshape(B, H * Nq, q.shape[-1]), k.transpose(1, 2))
    return scores


def _weights(scores: torch.Tensor, causal: bool, q_offset: int) -> torch.Tensor:
    """Softmax over keys, the mask written into scores; causal: query a (at position q_offset + a) sees key j iff
    j ≤ q_offset + a."""
    Nq, Nk = scores.shape[-2:]
    if causal and Nk - 1 > q_offset:  # otherwise every query sees every key (a generation step)
        i = torch.arange(Nq, device=scores.device)[:, None] + q_offset
        j = torch.arange(Nk, device=scores.device)[None, :]
        scores.masked_fill_(~masks.causal(i, j), float("-inf"))
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
    time; O(Nk·H·D + Nq·Nk·H) memory (the rebuilt K, V, the scores and the weights).
    """
    _check_core(q_c, q_r, c_kv, k_r, w_uk, w_uv, q_offset)
    k_c, v = _up(c_kv, w_uk, b_uk), _up(c_kv, w_uv, b_uv)  # (B, H, Nk, D) each
    s = scale(q_c.shape[-1] + q_r.shape[-1])
    scores = _add_shared((q_c * s) @ k_c.transpose(-2, -1), q_r * s, k_r)
    del k_c
    p = _weights(scores, causal, q_offset)
    del scores
    return p @ v


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
    s = scale(q_c.shape[-1] + q_r.shape[-1])
    q_lat = torch.einsum("bhnd,hdr->bhnr", q_c, w_uk).mul_(s)  # W_UK,hᵀ q_C,h, scaled: (B, H, Nq, r)
    scores = _add_shared(_shared(q_lat, c_kv), q_r * s, k_r)
    del q_lat
    p = _weights(scores, causal, q_offset)  # (B, H, Nq, Nk)
    del scores
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




def _checked_widths(c_kv: torch.Tensor, k_r: torch.Tensor, kv_rank: int, rope_dim: int) -> None:
    if not trusted() and (c_kv.shape[-1], k_r.shape[-1]) != (kv_rank, rope_dim):
        raise ValueError(f"kv_rank = {kv_rank} and rope_dim = {rope_dim} do not match the latents given, of widths "
                         f"{c_kv.shape[-1]} and {k_r.shape[-1]}; pass the widths of c_kv and k_r")


def mla_absorbed(q_c: torch.Tensor, q_r: torch.Tensor, c_kv: torch.Tensor, k_r: torch.Tensor, *,
                 causal: bool = False, kv_rank: int = 512, rope_dim: int = 64, w_uk: torch.Tensor,
                 w_uv: torch.Tensor) -> torch.Tensor:
    """`latent_attention_absorbed` as the catalogue calls it: its parameters, the latent widths, checked against
    the operands'."""
    _checked_widths(c_kv, k_r, kv_rank, rope_dim)
    return latent_attention_absorbed(q_c, q_r, c_kv, k_r, w_uk, w_uv, causal=causal)


def mla_naive(q_c: torch.Tensor, q_r: torch.Tensor, c_kv: torch.Tensor, k_r: torch.Tensor, *,
              causal: bool = False, kv_rank: int = 512, rope_dim: int = 64, w_uk: torch.Tensor,
              w_uv: torch.Tensor) -> torch.Tensor:
    """`latent_attention_naive` as the catalogue calls it (see `mla_absorbed`)."""
    _checked_widths(c_kv, k_r, kv_rank, rope_dim)
    return latent_attention_naive(q_c, q_r, c_kv, k_r, w_uk, w_uv, causal=causal)


class _HeldCache(LatentCache):
    """A LatentCache that also holds the up-projections W_UK and W_UV its steps read: what the engine steps is the
    core, not a layer that would hold them."""

    def __init__(self, c_kv: torch.Tensor, k_r: torch.Tensor, *, w_uk: torch.Tensor, w_uv: torch.Tensor,
                 max_len: int | None = None):
        super().__init__(c_kv, k_r, max_len=max_len)
        self.w_uk, self.w_uv = w_uk, w_uv


# -- the spec: operands, state, costs and generation of the core (the layer's projections are not counted, as
# -- no mechanism's are; W_UK and W_UV are, being what MLA pays to read its cache) --

def _draw(s: Shape, device, dtype, *, seed: int, kv_rank: int, rope_dim: int) -> tuple[torch.Tensor, ...]:
    """Seeded q_c (B, H, Nq, D), q_r (B, H, Nq, ρ), c_kv (B, Nk, r), k_r (B, Nk, ρ): standard normal, as the
    engine draws q, k and v (the positions' rotation changes no cost, so k_r and q_r are left unrotated)."""
    g = torch.Generator().manual_seed(seed)
    sizes = ((s.B, s.H, s.Nq, s.D), (s.B, s.H, s.Nq, rope_dim), (s.B, s.Nk, kv_rank), (s.B, s.Nk, rope_dim))
    return tuple(torch.randn(*size, generator=g).to(device, dtype) for size in sizes)


def _operand_bytes(s: Shape, kv_rank: int, rope_dim: int) -> float:
    return float((s.bh * s.Nq * (s.D + rope_dim) + s.B * s.Nk * (kv_rank + rope_dim)) * s.elem)


def _init(s: Shape, device, dtype, *, seed: int, kv_rank: int, rope_dim: int) -> dict[str, torch.Tensor]:
    """W_UK and W_UV (H, D, r) of a layer: normal with variance 1/r, so a rebuilt key or value has unit variance."""
    g = torch.Generator().manual_seed(seed + 1)  # not the operands' stream
    return {name: (torch.randn(s.H, s.D, kv_rank, generator=g) / kv_rank ** 0.5).to(device, dtype)
            for name in ("w_uk", "w_uv")}


def _cells(s: Shape, executed: bool) -> float:
    """Score cells: all Nq·Nk as executed (the mask only sets the upper half to −inf), the kept ones as useful."""
    return s.Nq * (s.Nq + 1) / 2 if s.causal and not executed else s.Nq * s.Nk


def _absorbed_flops(s: Shape, kv_rank: int, rope_dim: int, executed: bool = False) -> float:
    # fold W_UK into q and W_UV out of the output, 2·D·r a query and head each; scores over r + ρ, weights over r
    r = kv_rank
    return 4.0 * s.bh * s.Nq * s.D * r + 2.0 * s.bh * _cells(s, executed) * (2 * r + rope_dim)


def _naive_flops(s: Shape, kv_rank: int, rope_dim: int, executed: bool = False) -> float:
    # rebuild K and V, 2·r·D a key and head each; scores over D + ρ, weights over D
    return 4.0 * s.B * s.H * s.Nk * kv_rank * s.D + 2.0 * s.bh * _cells(s, executed) * (2 * s.D + rope_dim)


def _absorbed_memory(s: Shape, kv_rank: int, rope_dim: int) -> float:
    """The largest of three moments: the scores built beside the latent and rotary queries; the scores and the
    weights; the weights beside the weighted latents and the output."""
    r, rho, cells = kv_rank, rope_dim, s.Nq * s.Nk
    return s.bh * s.elem * max(cells + s.Nq * (r + rho), 2.0 * cells, cells + s.Nq * (r + s.D))


def _naive_memory(s: Shape, kv_rank: int, rope_dim: int) -> float:
    """As `_absorbed_memory`, with the rebuilt K and V (H·D values a key each) alive while the scores are built and V
    until the output."""
    cells, kv = s.Nq * s.Nk, s.Nk * s.D
    # at the end V is also copied contiguous for the product (it is a view of one (B, Nk, H·D) projection)
    return s.bh * s.elem * max(cells + s.Nq * (s.D + rope_dim) + 2 * kv, 2.0 * cells + kv,
                               cells + 2 * kv + s.Nq * s.D)


def _remember(c_kv: torch.Tensor, k_r: torch.Tensor, *, max_len: int | None = None, w_uk: torch.Tensor,
              w_uv: torch.Tensor, **params) -> _HeldCache:
    """The latent cache of a prompt: c_KV and k_R of every token, kv_rank + rope_dim values each, nothing per head."""
    return _HeldCache(c_kv, k_r, w_uk=w_uk, w_uv=w_uv, max_len=max_len)


def _stepper(core):
    def step(q_c: torch.Tensor, q_r: torch.Tensor, c_kv: torch.Tensor, k_r: torch.Tensor,
             cache: _HeldCache) -> tuple[torch.Tensor, _HeldCache]:
        """One token: its latent and rotary key written into the cache, then its queries read every cached token."""
        cache.append(c_kv, k_r)
        return core(q_c, q_r, *cache.view(), cache.w_uk, cache.w_uv, causal=True, q_offset=cache.length - 1), cache
    return step


def _cache_bytes(s: Shape, kv_rank: int, rope_dim: int) -> float:
    return float(s.B * s.Nk * (kv_rank + rope_dim) * s.elem)


def _step_flops(absorbed: bool):
    def flops(s: Shape, kv_rank: int, rope_dim: int) -> float:
        """One step after s.Nk tokens reads Nk + 1 latents (the new one too): `_absorbed_flops` or `_naive_flops`
        of one query against them."""
        one = Shape(s.B, s.H, 1, s.Nk + 1, s.D, dtype=s.dtype, causal=False)
        return (_absorbed_flops if absorbed else _naive_flops)(one, kv_rank, rope_dim)
    return flops


PARAMS = (
    Param("kv_rank", 512, 1, 8192, "Width r of the latent c_KV a token caches (DeepSeek-V2/V3: 512).", log=True),
    Param("rope_dim", 64, 1, 1024, "Width ρ of the rotary key every head shares (DeepSeek-V2/V3: 64).", log=True),
)
_NO_SHARED = ("Its heads already share one cached latent per token, of kv_rank + rope_dim values: set kv_rank to "
              "change what a token caches.")
_PAPER = "DeepSeek-AI 2024, 'DeepSeek-V2', arXiv 2405.04434 (section 2.1); 'DeepSeek-V3', arXiv 2412.19437"
_OPERANDS = Operands(queries=2, draw=_draw, nbytes=_operand_bytes)  # q_c, q_r; then c_kv, k_r


def _spec(fn, core, absorbed: bool) -> MechanismSpec:
    flops, memory = (_absorbed_flops, _absorbed_memory) if absorbed else (_naive_flops, _naive_memory)
    name = "absorbed" if absorbed else "naive"
    return MechanismSpec(
        label=f"MLA {name}",
        fn=fn,
        description=("Multi-head latent attention in latent space: W_UK folded into the queries, W_UV into the output; "
                     "every head reads the cached latents themselves." if absorbed else
                     "Multi-head latent attention as written: each head's keys and values rebuilt from the cached "
                     "latents, then softmax attention."),
        paper=_PAPER,
        params=PARAMS,
        exact=True,
        cost=Cost(flops=flops, executed_flops=lambda s, **p: flops(s, **p, executed=True), memory_bytes=memory,
                  time_big_o="O(n²·H·(r + ρ) + n·H·d·r)" if absorbed else "O(n²·H·(d + ρ) + n·H·d·r)",
                  memory_big_o="O(n²·H)" if absorbed else "O(n²·H + n·H·d)"),
        supports=Supports(
            causal=True, cross=False, no_padding="It takes no key padding mask here.",
            no_shared_kv=_NO_SHARED,
            generation=Generation(remember=_remember, step=_stepper(core), cache_bytes=_cache_bytes,
                                  step_flops=_step_flops(absorbed),
                                  step_big_o="O(n·H·(r + ρ))" if absorbed else "O(n·H·d·r)",
                                  cache_big_o="O(n·(r + ρ))"),
        ),
        state=State(init=_init, keys=("w_uk", "w_uv")),
        operands=_OPERANDS,
    )


SPEC = _spec(mla_absorbed, latent_attention_absorbed, absorbed=True)
NAIVE = _spec(mla_naive, latent_attention_naive, absorbed=False)
