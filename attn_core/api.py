"""One entry point for every mechanism, by key."""
from __future__ import annotations

import inspect
import numbers
from typing import Any

import torch

from .mechanisms import LATENT, MECHANISMS
from .mechanisms._cpu import ALWAYS, free_core_threads
from .mechanisms._common import (check_finite, check_key_padding, check_output_gate, check_qk_norm, check_qkv,
                                 check_score_bias, check_sinks, own_precision)
from .spec import MechanismSpec, Shape


def get(key: str) -> MechanismSpec:
    """The spec of a mechanism; ValueError listing the known keys otherwise."""
    if key in LATENT:
        raise ValueError(f"{key!r} is multi-head latent attention, which attends over cached latents, not q, k and v; "
                         f"use attn_core.MultiLatentAttention, or its core attn_core.nn.latent.latent_attention_absorbed")
    if key not in MECHANISMS:
        raise ValueError(f"unknown mechanism {key!r}; choose one of {', '.join(MECHANISMS)}")
    return MECHANISMS[key]


def make_state(key: str, shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0,
               **params: Any) -> dict[str, torch.Tensor]:
    """The seeded random state a mechanism takes as keyword arguments ({} for those with none). The parameters are
    checked against the spec (range, and e.g. Linformer's rank ≤ Nk) before anything is allocated."""
    spec = get(key)
    spec.check_params(params, shape)
    check_seed(seed)
    if spec.state.init is None:
        return {}
    return spec.state.init(shape, device, dtype, seed=seed, **spec.resolved(params))


def seeded() -> tuple[str, ...]:
    """The keys of the mechanisms that draw random state (projections, rotations, gates) and so take a `seed`."""
    return tuple(key for key, spec in MECHANISMS.items() if spec.state.init is not None)


def check_seed(seed: Any, spec: MechanismSpec | None = None) -> None:
    """ValueError with a sentence for a seed that is not a whole number from 0 to 2**63 − 1 (torch's generator takes
    a 64-bit one), or, given `spec`, for a mechanism that draws nothing to seed."""
    from .engine.problem import MAX_SEED

    if spec is not None and spec.state.init is None:
        raise ValueError(f"{spec.label} draws no random state, so it takes no seed; drop seed=, or choose a mechanism "
                         f"that does: {', '.join(seeded())}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be a whole number from 0 to 2**63 - 1, got {seed!r}; pass e.g. seed=0")


def attention(key: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              key_padding_mask: torch.Tensor | None = None, score_bias: torch.Tensor | None = None,
              sinks: torch.Tensor | None = None, output_gate: torch.Tensor | None = None,
              qk_norm: bool | torch.Tensor = False, **params: Any) -> torch.Tensor:
    """Run mechanism `key` on q (B, H, Nq, D), k, v (B, Hk, Nk, D) → (B, H, Nq, D) with its keyword parameters.
    Hk < H: each key/value head serves H/Hk consecutive query heads (grouped-query attention; Hk = 1: multi-query),
    for a mechanism whose spec has `supports.shared_kv`; the others refuse it with a sentence.
    NaN or inf in q, k or v is refused here (`check_finite`), outside the timed mechanism function, or by the
    function itself where its spec `supports.checks_finite` (linear attention notices them in its sums).

    `key_padding_mask`: a boolean (B, Nk) tensor on k's device, True where the key is padding (variable lengths in
    a batch; torch.nn.MultiheadAttention's convention), e.g. torch.arange(Nk) >= lengths[:, None]. Padded keys get
    no weight, combined with the mechanism's own pattern and causality; a query that sees no unpadded key (a batch
    element all padding, or causal attention before its first real key) outputs zeros. Mechanisms whose spec has
    `padding` take it; the others refuse it with a sentence saying why.

    `score_bias`: a float tensor broadcastable to (B, H, Nq, Nk) added to the scaled scores (attn_core.positions.encodings's
    ALiBi and relative biases); mechanisms whose spec has `score_bias` take it, the others refuse it with a
    sentence.

    `sinks`: a float tensor (H,), one logit per query head that joins each row's softmax denominator with no value
    (gpt-oss's attention sinks, arXiv 2508.10925); mechanisms whose spec has `sinks` take it, the others refuse it
    with a sentence.

    `output_gate`: gate logits g of q's shape, out ⊙ σ(g) (arXiv 2505.06708); `qk_norm`: True or a (D,) weight, q and
    k RMS-normalised per head before the scores. Options of the softmax family (`supports.output_gate`, `qk_norm`).

    `seed`: for a mechanism that draws random state (`seeded()`: projections, rotations, gates), the seed of the
    state not passed; a mechanism without any refuses it with a sentence.

    On a CPU, a call of a million numbers or more runs on no more threads than the cores other programs leave free
    at that instant (`_cpu.free_core_threads`; torch's own count when the machine is otherwise idle), then torch's
    thread count is set back: a busy core would otherwise hold up every parallel operation of the call. A mechanism
    whose call is a few long fused kernels keeps torch's count where no core is free (`Cost.keeps_threads`: top-k
    with its C++ kernels, the sliding window and block-local on their fused path); one whose threads share its
    blocks as they come free keeps it at any load (NSA, `_cpu.run_blocks`).

    Under torch.autocast the call runs on q, k, v (and the tensors among `params`) in autocast's dtype, autocast off
    inside, and returns that dtype, as torch's scaled_dot_product_attention does (`_common.own_precision`: each
    mechanism sets its own precision, which autocast's cast of each operation broke); float64 stays float64."""
    spec = get(key)
    # before the call: a misspelt or foreign keyword is a ValueError naming the parameters, not a TypeError
    takes_mask = "mask" in inspect.signature(spec.fn).parameters
    if "seed" in params:  # before the names: a seed to a mechanism without state gets its own sentence
        check_seed(params["seed"], spec)
    spec.check_params(params, extra=(*spec.state.keys, "seed", *(("mask",) if takes_mask else ())))
    check_qkv(q, k, v)
    if not spec.supports.checks_finite:
        check_finite(q=q, k=k, v=v)
    if score_bias is not None:
        check_score_bias(spec, score_bias, q, k)
        check_finite(score_bias=score_bias)
        params["score_bias"] = score_bias
    if sinks is not None:
        check_sinks(spec, sinks, q)  # its own finiteness check: a sink of −inf is no sink, said so
        params["sinks"] = sinks
    if output_gate is not None:
        check_output_gate(spec, output_gate, q)
        check_finite(output_gate=output_gate)
        params["output_gate"] = output_gate
    if qk_norm is not False:
        check_qk_norm(spec, qk_norm, q)
        params["qk_norm"] = qk_norm
    if key_padding_mask is not None:
        check_key_padding(spec, key_padding_mask, q, k)
        params["key_padding_mask"] = key_padding_mask
    with own_precision(q.device.type, {"q": q, "k": k, "v": v, **params}) as given:  # under autocast: its dtype
        q, k, v, params = given.pop("q"), given.pop("k"), given.pop("v"), given
        if q.device.type != "cpu":
            return spec.fn(q, k, v, causal=causal, **params)
        fused = spec.cost.keeps_threads is not None and spec.cost.keeps_threads(q=q, k=k, v=v, causal=causal,
                                                                                **params)
        if fused == ALWAYS and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v, *params.values())):
            fused = False  # its blocks run one after another there (nsa.block_workers): fitted
        with free_core_threads(max(q.numel(), k.numel()), fused=fused):  # no more threads than the cores free now
            return spec.fn(q, k, v, causal=causal, **params)
