"""A multi-head attention layer that runs any mechanism of the catalogue."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from attn_core.api import get, make_state
from attn_core.mechanisms._common import check_finite, check_key_padding, divisors, own_precision
from attn_core.spec import MechanismSpec, Shape, dtype_name


class MultiHeadAttention(nn.Module):
    """Q, K, V and output projections around any mechanism: (B, Nq, d_model), context (B, Nk, d_model) → (B, Nq, d_model).
    A mechanism whose keys are its queries (spec.supports.shared_qk, Reformer) has no K projection. `kv_heads`: key
    and value heads, each shared by heads/kv_heads query heads (grouped-query attention; 1: multi-query attention;
    None: heads, multi-head attention), for a mechanism with spec.supports.shared_kv: the K and V projections and
    the cache shrink by kv_heads/heads.

    Random mechanism state (Performer features, Linformer projections) is drawn from `seed` and kept in a plain
    dict (not parameters or buffers: it is not trained or saved), drawn again when the batch, context length, head
    size, device or dtype changes (Gated DeltaNet's and Mamba-2's gates are drawn per batch row); `redraw(seed)`
    draws it anew. The layer holds its mechanism's key and finds the spec in the catalogue, so it pickles and
    torch.save's like any module.
    """

    def __init__(self, d_model: int, heads: int, mechanism: str = "softmax", causal: bool = False, *,
                 kv_heads: int | None = None, seed: int = 0, bias: bool = True, **params: Any):
        super().__init__()
        for name, value in (("heads", heads), ("d_model", d_model), ("kv_heads", kv_heads)):
            if (value is not None or name != "kv_heads") and (isinstance(value, bool) or not isinstance(value, int)
                                                              or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by {heads} heads; choose a multiple of {heads}")
        kv_heads = heads if kv_heads is None else kv_heads
        if heads % kv_heads:
            raise ValueError(f"kv_heads = {kv_heads} does not divide the {heads} query heads; choose "
                             f"{divisors(heads)}")
        spec = get(mechanism)
        spec.check_causal(causal)
        spec.check_params(params)
        if kv_heads != heads and not spec.supports.shared_kv:
            why = spec.supports.no_shared_kv or "It takes one key/value head per query head."
            raise ValueError(f"{spec.label} cannot share key/value heads between query heads. {why} Leave kv_heads "
                             f"out, or choose a mechanism that shares them")
        if spec.supports.shared_qk and kv_heads != heads:
            raise ValueError(f"{spec.label} uses the queries as keys, so its keys have the {heads} query heads; leave "
                             f"kv_heads out, or choose another mechanism")
        self.mechanism = spec.key  # the key, not the spec: its cost functions are lambdas, which pickle cannot save
        self.d_model, self.heads, self.kv_heads, self.causal, self.seed = d_model, heads, kv_heads, bool(causal), seed
        self.params = spec.resolved(params)
        # a mechanism that uses the queries as keys (supports.shared_qk) gets no key projection, which it would not
        # train; shared key/value heads make the key and value projections kv_heads/heads as wide
        shared_qk, width = spec.supports.shared_qk, kv_heads * (d_model // heads)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            None if role == "k" and shared_qk else nn.Linear(d_model, width if role in "kv" else d_model, bias=bias)
            for role in "qkvo")
        self._state: dict[str, torch.Tensor] = {}
        self._drawn_for: tuple = ()

    @property
    def spec(self) -> MechanismSpec:
        """The mechanism's spec, looked up in the catalogue by key."""
        return get(self.mechanism)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, N, width = x.shape
        head_dim = self.d_model // self.heads
        return x.view(B, N, width // head_dim, head_dim).transpose(1, 2)  # (B, H or kv_heads, N, D)

    def _mechanism_state(self, shape: Shape, ref: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.spec.state.init is None:
            return {}
        drawn_for = (shape.B, shape.Nk, shape.D, ref.device, ref.dtype)  # what any mechanism's state may depend on
        if not self._state or self._drawn_for != drawn_for:
            self._state = make_state(self.spec.key, shape, ref.device, ref.dtype, seed=self.seed, **self.params)
            self._drawn_for = drawn_for
        return self._state

    def redraw(self, seed: int) -> None:
        """Draw new random features or projections at the next call."""
        self.seed, self._state = seed, {}

    def _check_input(self, name: str, t: Any) -> None:
        """ValueError unless `t` is a torch tensor of the layer's dtype (its projections' weights)."""
        dtype = self.q_proj.weight.dtype
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor of dtype {dtype}, got {type(t).__name__}; convert it "
                             f"with torch.as_tensor({name}, dtype={dtype})")
        if t.dtype != dtype:
            other = f", or convert the layer with layer.to({t.dtype})" if t.is_floating_point() else ""
            raise ValueError(f"{name} has dtype {t.dtype} but this layer's weights are {dtype}; convert the input "
                             f"with {name}.to({dtype}){other}")

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, Nq, d_model), context (B, Nk, d_model) or None (self-attention) → (B, Nq, d_model).
        `key_padding_mask`: boolean (B, Nk), True where a context token is padding (torch.nn.MultiheadAttention's
        convention); see attn_core.attention. Refused with a sentence by a mechanism without spec.supports.padding."""
        context = x if context is None else context
        if self.q_proj.weight.is_meta:
            raise ValueError("this layer's weights are on the meta device, which holds shapes but no values; give "
                             "them values first, e.g. layer.to_empty(device='cpu') and then layer.load_state_dict(...)")
        for name, t in (("x", x), ("context", context)):
            self._check_input(name, t)
        if x.dim() != 3 or context.dim() != 3 or x.shape[-1] != self.d_model or context.shape[-1] != self.d_model:
            raise ValueError(f"inputs must be (batch, seq, {self.d_model}), got {tuple(x.shape)} and "
                             f"{tuple(context.shape)}")
        check_finite(x=x, **({} if context is x else {"context": context}))
        q, v = self._split(self.q_proj(x)), self._split(self.v_proj(context))
        k = q if self.k_proj is None else self._split(self.k_proj(context))
        shape = Shape(q.shape[0], self.heads, q.shape[2], k.shape[2], q.shape[3], dtype=dtype_name(q.dtype),
                      causal=self.causal, Hk=k.shape[1], device=q.device.type)
        padding = {}
        if key_padding_mask is not None:
            check_key_padding(self.spec, key_padding_mask, q, v)
            padding = {"key_padding_mask": key_padding_mask}
        with own_precision(q.device.type, {"q": q, "k": k, "v": v}) as given:  # under autocast: its dtype, autocast off
            q, k, v = given["q"], given["k"], given["v"]
            out = self.spec.fn(q, k, v, causal=self.causal, **self.params, **self._mechanism_state(shape, q),
                               **padding)
        B, H, N, D = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, N, H * D))
