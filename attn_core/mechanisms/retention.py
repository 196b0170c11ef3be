"""The decay-gated linear family as presets of Mamba-2's chunked SSD kernel (mamba2.py): RetNet's retention (Sun et
al. 2023, arXiv 2307.08621), simple GLA (a data-dependent scalar gate a head; Yang et al. 2023, arXiv 2312.06635)
and MiniMax's lightning attention (MiniMax 2025, arXiv 2501.08313). Each is h_t = g_t·h_{t−1} + k_t v_tᵀ,
y_t = q_tᵀ h_t, for its own gates g_t ∈ (0, 1] a head; the projections, norms and gates around it are its layer's.

Not catalogue entries: functions over the `mamba2` mechanism (its step sizes dt and decays A set here), so they run,
cost and generate as `mamba2` does at the same shapes (`fixed_state` feeds its generation cache). `SPECS` holds them
as specs a catalogue can load (ATTN_CORE_MECHANISMS="attn_core.mechanisms.retention:SPECS", or a sweep's
--extra-mechanisms): RetNet and lightning are mamba2's own function and costs with their decays as its state."""
from __future__ import annotations

import dataclasses
import math

import torch

from ..spec import Generation, MechanismSpec, Shape, State
from ._common import check_key_padding, checked_shape, repeated, trusted
from ._linear_core import work_dtype
from . import mamba2
from .mamba2 import SPEC as MAMBA2, SSMCache, mamba2_attention

# GLA's gate is σ(x W + b)^(1/τ), a temperature τ = 16 for slow forgetting (Yang et al. 2023, arXiv 2312.06635); the
# seeded stand-in for a projection's logits is uniform in ±GATE_LOGIT, as gated_deltanet draws its β.
GLA_TEMPERATURE = 16.0
GATE_LOGIT = 2.0


# -- the decays of each preset, (H,) log g in float64 ---------------------------------------------------------------
def retnet_decays(heads: int) -> torch.Tensor:
    """log γ_h with γ_h = 1 − 2^(−5−h), h = 0 … H−1 (RetNet, arXiv 2307.08621, section 2.2, multi-scale retention):
    γ from 0.969 (h = 0) towards 1, one fixed rate a head."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float64))))


def lightning_decays(heads: int, layer: int = 0, layers: int = 1) -> torch.Tensor:
    """log λ_h = −s_h, s_h = 2^(−8(h+1)/H)·(1 − l/(L − 1) + 10⁻⁵): ALiBi's slopes a head, scaled down with depth
    (MiniMax-Text-01's lightning layers, arXiv 2501.08313; its released modelling code, `slope_rate`), so the first
    layer forgets fastest and the last hardly at all. `layer` l of `layers` L (L = 1: the factor is 1 + 10⁻⁵)."""
    if not (isinstance(layers, int) and isinstance(layer, int) and 0 <= layer < layers):
        raise ValueError(f"layer must be a whole number from 0 to layers − 1, got layer={layer!r} of "
                         f"layers={layers!r}")
    depth = 1.0 - layer / (layers - 1) + 1e-5 if layers > 1 else 1.0 + 1e-5
    return -(2.0 ** (-8.0 * (torch.arange(heads, dtype=torch.float64) + 1) / heads)) * depth


def gla_gates(B: int, Hk: int, n: int, *, seed: int = 0, device=None, dtype=torch.float32) -> torch.Tensor:
    """Seeded log-gates (B, Hk, n) of simple GLA, log g = log σ(z)/τ with z uniform in ±GATE_LOGIT and τ = 16:
    g from 0.992 to 0.9995 a token (GLA's gate, one scalar a key/value head). Drawn token by token, so the first m
    are the same whatever n; float32 for half dtypes."""
    z = torch.rand(n, B, Hk, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    log_g = torch.nn.functional.logsigmoid(GATE_LOGIT * (2 * z - 1)) / GLA_TEMPERATURE
    return log_g.permute(1, 2, 0).to(device=device, dtype=work_dtype(dtype)).contiguous()


def fixed_state(shape: Shape, log_decay: torch.Tensor, device=None, dtype=torch.float32) -> dict:
    """{'dt': ones (B, H, Nk), 'A': log_decay (H,)}: a fixed decay a head as mamba2's state, for its forward pass
    and its generation (`attn_core.nn.generation.remember("mamba2", k, v, **fixed_state(...))`): with dt = 1,
    h_t = exp(A)·h_{t−1} + k_t v_tᵀ."""
    if tuple(log_decay.shape) != (shape.H,) or not bool((log_decay < 0).all()):
        raise ValueError(f"log_decay must hold one negative log-decay per query head, shape ({shape.H},), got "
                         f"{tuple(log_decay.shape)}; use retnet_decays or lightning_decays")
    return {"dt": torch.ones(shape.B, shape.H, shape.Nk, device=device, dtype=work_dtype(dtype)),
            "A": log_decay.to(device=device, dtype=work_dtype(dtype))}


# -- the presets ------------------------------------------------------------------------------------------------------
def decayed_attention(q, k, v, log_decay: torch.Tensor, *, causal: bool = True, key_padding_mask=None,
                      chunk: int = 64) -> torch.Tensor:
    """y_t = Σ_{s ≤ t} exp(a_h·(t − s))·(q_t·k_s)·v_s, a_h = log_decay[h] < 0: a fixed decay a head, by mamba2's
    chunked SSD at dt = 1. q (B, H, n, D), k, v (B, Hk, n, D) → (B, H, n, D); causal only. O(n·(chunk + D)·D)
    time, O(n·D) memory. A padded key (`key_padding_mask` True) adds nothing and decays nothing, as in mamba2."""
    shape = checked_shape(MAMBA2, q, k, v, causal, chunk=chunk)
    state = fixed_state(shape, log_decay, q.device, q.dtype)
    return mamba2_attention(q, k, v, causal=causal, key_padding_mask=key_padding_mask, chunk=chunk, **state)


def retnet_attention(q, k, v, *, causal: bool = True, key_padding_mask=None, chunk: int = 64) -> torch.Tensor:
    """RetNet's parallel retention (arXiv 2307.08621, eq. 5 without its norm): y_t = Σ_{s ≤ t} γ_h^(t−s)
    (q_t·k_s) v_s, γ_h = 1 − 2^(−5−h) (`retnet_decays`). Its d^(−1/2) on k, xPos and group norm are the layer's."""
    return decayed_attention(q, k, v, retnet_decays(q.shape[1]), causal=causal, key_padding_mask=key_padding_mask,
                             chunk=chunk)


def lightning_attention(q, k, v, *, causal: bool = True, key_padding_mask=None, chunk: int = 64, layer: int = 0,
                        layers: int = 1) -> torch.Tensor:
    """MiniMax's lightning attention (arXiv 2501.08313; MiniMax-01 and M1 put one softmax layer after every seven of
    these): y_t = Σ_{s ≤ t} λ_h^(t−s) (q_t·k_s) v_s with the slopes of `lightning_decays`, no scaling of q·k. Its
    SiLU on q, k and v, the RMS norm of the output and the sigmoid output gate are the layer's. Lightning
    attention's own kernel is this same blockwise split (intra-block masked products, an inter-block state)."""
    return decayed_attention(q, k, v, lightning_decays(q.shape[1], layer, layers), causal=causal,
                             key_padding_mask=key_padding_mask, chunk=chunk)


def simple_gla_attention(q, k, v, *, causal: bool = True, key_padding_mask=None, chunk: int = 64,
                         log_gate: torch.Tensor | None = None, seed: int = 0) -> torch.Tensor:
    """Simple GLA: h_t = g_t·h_{t−1} + k_t v_tᵀ, y_t = q_tᵀ h_t, with g_t = exp(log_gate[b, j, t]) ∈ (0, 1) a token and
    key/value head j (GLA's gate, arXiv 2312.06635, as one scalar a head rather than one a key channel). None: the
    seeded `gla_gates`. q (B, H, n, D), k, v (B, Hk, n, D), log_gate (B, Hk, n) < 0 → (B, H, n, D); causal only.

    Mamba-2's kernel weighs a token's input by the dt of its decay exp(dt·A); with A = −1 and dt = −log g, the
    values enter as v/dt, so the kernel's dt·(v/dt) is v: O(n·(chunk + D)·D) time as mamba2, O(n·D) more memory."""
    shape = checked_shape(MAMBA2, q, k, v, causal, chunk=chunk)
    if log_gate is None:
        log_gate = gla_gates(shape.B, shape.key_heads, shape.Nk, seed=seed, device=q.device, dtype=q.dtype)
    elif not trusted():
        _check_gate(log_gate, k)
    work = work_dtype(v.dtype)
    dt = -log_gate.to(work)  # (B, Hk, n) > 0
    values = v.to(work) / dt[..., None]
    if key_padding_mask is not None:
        check_key_padding(MAMBA2, key_padding_mask, q, k)
        pad = key_padding_mask[:, None, :]
        dt, values = dt.masked_fill(pad, 0.0), values.masked_fill(pad[..., None], 0.0)  # adds and decays nothing
    group = shape.H // shape.key_heads
    A = -torch.ones(shape.H, dtype=work, device=q.device)
    out = mamba2_attention(q.to(work), k.to(work), values, causal=causal, chunk=chunk,
                           dt=dt.repeat_interleave(group, dim=1), A=A)
    return out.to(v.dtype)


def _check_gate(log_gate, k: torch.Tensor) -> None:
    want = (k.shape[0], k.shape[1], k.shape[2])
    if not isinstance(log_gate, torch.Tensor) or not log_gate.is_floating_point() or tuple(log_gate.shape) != want:
        got = tuple(log_gate.shape) if isinstance(log_gate, torch.Tensor) else type(log_gate).__name__
        raise ValueError(f"log_gate must be a floating tensor of shape (batch, key/value heads, tokens) = {want}, "
                         f"got {got}; gla_gates draws one")
    if log_gate.device != k.device:
        raise ValueError(f"log_gate is on {log_gate.device} but the keys are on {k.device}; move it with "
                         f"log_gate.to({str(k.device)!r})")
    if not bool((torch.isfinite(log_gate) & (log_gate < 0)).all()):
        raise ValueError("log_gate must be negative and finite (a gate g = exp(log_gate) in (0, 1)); pass e.g. "
                         "logsigmoid(z) / 16, or key_padding_mask for a token that should change nothing")


PRESETS = {"retnet": retnet_attention, "simple_gla": simple_gla_attention, "lightning": lightning_attention}
PAPERS = {"retnet": "Sun et al. 2023, 'Retentive Network: A Successor to Transformer for Large Language Models', "
                    "arXiv 2307.08621",
          "simple_gla": "Yang et al. 2023, 'Gated Linear Attention Transformers with Hardware-Efficient Training', "
                        "arXiv 2312.06635 (its gate as one scalar a head)",
          "lightning": "MiniMax 2025, 'MiniMax-01: Scaling Foundation Models with Lightning Attention', "
                       "arXiv 2501.08313"}


# -- spec'd: mamba2's spec at other gates, for a catalogue that loads them ------------------------------------------
def retnet_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, chunk: int = 64) -> dict:
    """RetNet's decays as mamba2's state (`fixed_state`); nothing drawn, `seed` unused, `chunk` checked."""
    MAMBA2.check_params({"chunk": chunk}, shape)
    return fixed_state(shape, retnet_decays(shape.H), device, dtype)


def lightning_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, chunk: int = 64) -> dict:
    """Lightning attention's decays (a first layer's slopes, `lightning_decays(H)`) as mamba2's state."""
    MAMBA2.check_params({"chunk": chunk}, shape)
    return fixed_state(shape, lightning_decays(shape.H), device, dtype)


def gla_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, chunk: int = 64) -> dict:
    """{'log_gate': (B, Hk, Nk)}, seeded (`gla_gates`)."""
    MAMBA2.check_params({"chunk": chunk}, shape)
    return {"log_gate": gla_gates(shape.B, shape.key_heads, shape.Nk, seed=seed, device=device, dtype=dtype)}


def _gla_memory(s: Shape, chunk: int = 64) -> float:
    """mamba2's peak over the work-dtype copies simple GLA hands it, plus those copies: −log g (B·Hk·n), the values
    v/dt (B·Hk·n·D) and −log g a query head (B·H·n); for half inputs q and k in float32 too (the output cast back
    after mamba2's peak)."""
    work = dataclasses.replace(s, dtype="float32") if s.elem < 4 else s
    w = max(s.elem, 4)
    extra = (s.bk * s.Nk * (s.D + 1) + s.bh * s.Nk) * w
    if s.elem < 4:
        extra += (s.bh * s.Nq + s.bk * s.Nk) * s.D * w
    return mamba2._memory(work, chunk) + extra


def _gla_remember(k, v, *, max_len: int | None = None, chunk: int = 64, log_gate=None, seed: int = 0) -> SSMCache:
    """The state after the prompt, h = Σ_s (Π_{s<r≤n} g_r) k_s v_sᵀ (D × D a key/value head: the query heads of a
    group share its gates, so its state), by mamba2's `ssd_state`; the gates of the tokens to come kept as −log g
    (drawn from `seed` up to `max_len` when not given; past them the last gate repeats)."""
    B, Hk, n, _ = k.shape
    if log_gate is None:
        log_gate = gla_gates(B, Hk, max(max_len or 0, n + 1), seed=seed, device=k.device, dtype=k.dtype)
    elif not trusted():
        _check_gate(log_gate[:, :, :n], k)
    work = work_dtype(k.dtype)
    dt = -log_gate.to(work)
    A = -torch.ones(Hk, dtype=work, device=k.device)
    h = mamba2.ssd_state(k, v.to(work) / dt[:, :, :n, None], dt[:, :, :n], A, chunk, Hk)
    return SSMCache({"chunk": chunk}, k, h, dt, A)


def _gla_step(q, k, v, cache: SSMCache):
    """h ← g·h + k vᵀ a key/value head, then y = qᵀ h for each of its query heads: O(D²) a head."""
    B, Hk, d, dv = cache.h.shape
    work = cache.h.dtype
    decay = (-cache.next_dt().to(work)).exp_()  # (B, Hk): this token's gate
    cache.h.mul_(decay[..., None, None]).add_(k.to(work).transpose(-2, -1) @ v.to(work))
    cache.length += 1
    return (q.to(work).view(B, Hk, -1, d) @ cache.h).view(B, q.shape[1], 1, dv).to(q.dtype), cache


def _gla_cache_bytes(s: Shape, chunk: int = 64) -> float:
    return s.bk * s.D * s.D * max(s.elem, 4)  # one D × D state a key/value head, float32 for half inputs


def _gla_step_flops(s: Shape, chunk: int = 64) -> float:
    """Per key/value head: decay the state (D²), add k vᵀ (2·D²); per query head: read it (2·D²)."""
    return 3.0 * s.bk * s.D * s.D + 2.0 * s.bh * s.D * s.D


def _gla_effective(q, k, v, causal: bool, state: dict, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """W_ts = (q_t·k_s)·Π_{s<r≤t} g_r for s ≤ t, 0 above: the gated mixing matrix, out = W @ v (shared heads
    repeated: a dense picture)."""
    log_gate = state.get("log_gate")
    if log_gate is None:
        log_gate = gla_gates(k.shape[0], k.shape[1], k.shape[2], device=k.device, dtype=k.dtype)
    k, v, log_gate = repeated(q, k, v, log_gate.to(q.dtype))
    cum = log_gate.cumsum(-1)
    n = q.shape[2]
    above = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill_(above, -math.inf).exp_()
    return (q @ k.transpose(-2, -1)) * decay, v


_OWN = ("{} is its own model, not an approximation of softmax: its weights (q·k)·decay are signed, not normalised, "
        "and fade with distance at the rate its gates set")


def _spec(label: str, paper: str, description: str, **changes) -> MechanismSpec:
    """mamba2's spec under another name, paper and state (its key written by the catalogue that loads it)."""
    own = _OWN.format(label)
    insight = dataclasses.replace(MAMBA2.insight, accuracy_note=own + ".", regime=(
        "local", "gaussian", own + ": where nearby tokens score highest both weigh the recent past; with independent "
        "inputs softmax spreads its weight over every earlier key, which the decay forgets."),
        **changes.pop("insight", {}))
    return dataclasses.replace(MAMBA2, key="", label=label, paper=paper, description=description, insight=insight,
                               **changes)


RETNET = _spec("RetNet retention", PAPERS["retnet"],
               "Retention: a D × D state a head decaying by a fixed γ_h = 1 − 2^(−5−h) a token, read by the queries; "
               "Mamba-2's chunked kernel at dt = 1. Causal only.",
               state=State(init=retnet_state, keys=("dt", "A")))
LIGHTNING = _spec("Lightning attention", PAPERS["lightning"],
                  "MiniMax's linear layers: a D × D state a head decaying by exp(−2^(−8(h+1)/H)) a token, no scaling "
                  "of q·k; Mamba-2's chunked kernel at dt = 1. Causal only.",
                  state=State(init=lightning_state, keys=("dt", "A")))
SIMPLE_GLA = _spec("Simple GLA", PAPERS["simple_gla"],
                   "Gated linear attention with one data-dependent gate a key/value head and token: h_t = g_t·h_{t−1} "
                   "+ k_t v_tᵀ, by Mamba-2's chunked kernel (values entering as v/dt). Causal only.",
                   fn=simple_gla_attention, state=State(init=gla_state, keys=("log_gate",)),
                   cost=dataclasses.replace(MAMBA2.cost, memory_bytes=_gla_memory),
                   supports=dataclasses.replace(MAMBA2.supports, generation=Generation(
                       remember=_gla_remember, step=_gla_step, cache_bytes=_gla_cache_bytes,
                       step_flops=_gla_step_flops, step_big_o="O(d²)", cache_big_o="O(d²)")),
                   insight={"effective": _gla_effective})
SPECS = {"retnet": RETNET, "simple_gla": SIMPLE_GLA, "lightning": LIGHTNING}
