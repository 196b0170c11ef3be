"""Caches for generating token by token: key-value buffers written in place (growing by doubling, or a ring of a
fixed number of entries) and the fixed-size state of kernelized attention (Katharopoulos et al. 2020, arXiv
2006.16236, section 3.4: linear attention as an RNN)."""
from __future__ import annotations

import numbers
from typing import Any, Mapping

import torch

from ..spec import Shape
from ._common import fold, group_sinks, scale, trusted, unfold


def kv_bytes(s: Shape, tokens: float) -> float:
    """Bytes of the keys and values of `tokens` tokens: 2·B·Hk·tokens·D elements (Hk key/value heads: the cache of
    grouped-query attention is Hk/H of multi-head attention's)."""
    return 2.0 * s.bk * tokens * s.D * s.elem


def tensor_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Ring:
    """Keys and values of the last `limit` tokens (of all of them when `limit` is None) in (B, H, capacity, D)
    buffers written in place: token p sits in slot p mod capacity. Below `limit` the capacity doubles when it is full
    (one copy, amortized O(1) a token); at `limit` each new token overwrites the oldest.

    Built from a prompt's k, v (B, H, n, D), which it copies (its last `limit` tokens); `reserve`: the tokens to
    make room for at once (a caller's longest context), so that no step reallocates."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, *, limit: int | None = None, reserve: int = 0):
        B, H, n, D = k.shape
        capacity = max(n, reserve)  # 0 for a ring that starts empty (the sparse summaries of a short prompt)
        self.limit = limit
        self.keys = k.new_empty(B, H, capacity if limit is None else min(capacity, limit), D)
        self.values = v.new_empty(self.keys.shape)
        self.length = n  # tokens written, the overwritten ones included
        count = min(n, self.capacity)
        first = (n - count) % self.capacity if count else 0  # the oldest token's slot; below `limit` it is 0
        head = min(count, self.capacity - first)  # tokens up to the end of the buffer, the rest wraps to slot 0
        for buf, x in ((self.keys, k), (self.values, v)):
            buf[:, :, first:first + head] = x[:, :, n - count:n - count + head]
            buf[:, :, :count - head] = x[:, :, n - count + head:]

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]

    @property
    def filled(self) -> int:
        return min(self.length, self.capacity)

    def view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The filled slots, (B, H, filled, D) views in slot order (the oldest token first only until it wraps)."""
        return self.keys[:, :, :self.filled], self.values[:, :, :self.filled]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write one token's k, v (B, H, 1, D) into slot length mod capacity, doubling first when full below `limit`
        (before it wraps, so slot p still holds token p and the copy keeps every slot)."""
        full = self.capacity
        if self.length == full and full != self.limit:
            grown = max(1, 2 * full) if self.limit is None else min(max(1, 2 * full), self.limit)
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = old.new_empty(old.shape[0], old.shape[1], grown, old.shape[3])
                new[:, :, :full] = old
                setattr(self, name, new)
        slot = self.length % self.capacity
        self.keys[:, :, slot:slot + 1] = k
        self.values[:, :, slot:slot + 1] = v
        self.length += 1

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.keys, self.values

    @property
    def used_bytes(self) -> int:
        return tensor_bytes(*self.view())


class Cache:
    """What a mechanism remembers of the tokens so far: its `params`, the batch, key/value heads and head dimension
    (`batch_heads_dim`), dtype and device of the tokens it takes, and `length`, the tokens it has seen.
    `key`: the registry key of the mechanism it belongs to, written by generation.prefill and remember (a mechanism
    never names itself; None until then). `nbytes`: the bytes of the tensors it holds; `used_bytes`: of the entries
    holding tokens (fewer while a preallocated or doubled buffer has room left)."""

    def __init__(self, params: Mapping[str, Any], like: torch.Tensor):
        B, H, n, D = like.shape
        self.key: str | None = None
        self.params = dict(params)
        self.batch_heads_dim = (B, H, D)
        self.dtype, self.device = like.dtype, like.device
        self.length = n

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The tensors it holds (a reference to the layer's own state, as Performer's projection, not included)."""
        raise NotImplementedError

    def mark(self) -> tuple[int, ...]:
        """Where the cache stands: the tokens it has seen (and, in a key-value cache, each ring's written count)."""
        return (self.length,)

    def rewind(self, mark: tuple[int, ...]) -> None:
        """Back to `mark` (from `mark()`), for timing one step at a fixed context: the next step writes where the
        last one did and reads as many tokens. Only positions move: what a step wrote into a ring's slot or folded
        into a fixed-size state stays (the cost of the next step does not depend on it), so outputs after a rewind
        are not those of the context at `mark`. A cache that grew meanwhile keeps its larger buffers. ValueError
        with a sentence for a mark that is not one of this cache's or lies past where it stands (checked except
        inside `_common.validated()`, where a timed step does not pay for it)."""
        (self.length,) = self._checked(mark)

    def _checked(self, mark: Any) -> tuple[int, ...]:
        if trusted():
            return mark
        now = self.mark()
        if (not isinstance(mark, tuple) or len(mark) != len(now)
                or not all(isinstance(m, numbers.Integral) and not isinstance(m, bool) for m in mark)):
            raise ValueError(f"rewind takes what this cache's mark() returned, a tuple of {len(now)} whole numbers "
                             f"such as {now}; got {mark!r}")
        if not all(0 <= m <= n for m, n in zip(mark, now)):
            raise ValueError(f"cannot rewind to {mark}: this cache stands at {now}, and rewind only goes back, to a "
                             f"mark between 0 and there; take the mark with mark() before the steps to undo")
        return tuple(int(m) for m in mark)

    @property
    def nbytes(self) -> int:
        return tensor_bytes(*self.tensors())

    @property
    def used_bytes(self) -> int:
        return self.nbytes

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.key!r}, {self.params}, B, Hk, D = {self.batch_heads_dim}, "
                f"length={self.length}, nbytes={self.nbytes})")


class KVCache(Cache):
    """Key-value cache: `rings['tokens']`, the tokens a step may read (all of them, or the last `limit`); a
    mechanism may add rings of its own (the sparse pattern's summary keys)."""

    def __init__(self, params: Mapping[str, Any], k: torch.Tensor, v: torch.Tensor, *, max_len: int | None = None,
                 limit: int | None = None, sinks: torch.Tensor | None = None):
        super().__init__(params, k)
        self.rings = {"tokens": Ring(k, v, limit=limit, reserve=max_len or 0)}
        self.sinks = sinks  # (H,) the layer's sink logits (a reference, not counted in nbytes), or None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add one token (B, H, 1, D); return the filled keys and values of `rings['tokens']`, views."""
        self.rings["tokens"].append(k, v)
        self.length += 1
        return self.rings["tokens"].view()

    def mark(self) -> tuple[int, ...]:
        return (self.length, *(r.length for r in self.rings.values()))

    def rewind(self, mark: tuple[int, ...]) -> None:
        self.length, *rings = self._checked(mark)
        for ring, length in zip(self.rings.values(), rings, strict=True):
            ring.length = length

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for r in self.rings.values() for t in r.tensors())

    @property
    def used_bytes(self) -> int:
        return sum(r.used_bytes for r in self.rings.values())


class StateCache(Cache):
    """Fixed-size state of kernelized attention after the tokens so far: `kv` = Σ φ(k_j) v_jᵀ (B, Hk, m, D) and
    `z` = Σ φ(k_j) (B, Hk, 1, m), one per key/value head, in the work dtype (float32 for half inputs); for Performer
    also `offset`, the stabilizer its key features share (B, Hk, 1, 1) float64, a base-2 exponent, and `projection`,
    the layer's random features scaled for base 2 (not counted in `nbytes`)."""

    def __init__(self, params: Mapping[str, Any], k: torch.Tensor, phi_k: torch.Tensor, v: torch.Tensor, *,
                 offset: torch.Tensor | None = None, projection: torch.Tensor | None = None):
        super().__init__(params, k)
        self.kv = phi_k.transpose(-2, -1) @ v.to(phi_k.dtype)  # (B, Hk, m, D)
        self.z = phi_k.sum(-2, keepdim=True)  # (B, Hk, 1, m)
        self.offset, self.projection = offset, projection

    def add(self, phi_k: torch.Tensor, v: torch.Tensor) -> None:
        """Fold one token's features φ(k) (B, Hk, 1, m) and value (B, Hk, 1, D) into the state, in place: O(m·D)."""
        self.kv.addcmul_(phi_k.transpose(-2, -1), v.to(self.kv.dtype))  # += φ(k)ᵀ v without an (m, D) temporary
        self.z.add_(phi_k)
        self.length += 1

    def read(self, phi_q: torch.Tensor) -> torch.Tensor:
        """φ(q)ᵀ kv / φ(q)ᵀ z for one query's features (B, H, 1, m) → (B, H, 1, D), tokens' dtype: O(m·D) a head;
        the query heads sharing a key/value head read its state together."""
        heads, phi_q = phi_q.shape[1], fold(phi_q, self.kv.shape[1])  # (B, Hk, H/Hk, m): a group reads one state
        den = (phi_q * self.z).sum(-1, keepdim=True)
        return unfold((phi_q @ self.kv) / den.clamp_min(torch.finfo(den.dtype).tiny), heads).to(self.dtype)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.kv, self.z) + (() if self.offset is None else (self.offset,))


def attend(q: torch.Tensor, *pairs: tuple[torch.Tensor, torch.Tensor], hide: slice | None = None,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q Kᵀ/√D) V of new queries q (B, H, 1, D) over cached keys and values, one joint softmax over all
    `pairs` ((B, Hk, L_i, D) each, Hk dividing H: each cached head read once for the query heads sharing it) with the
    score columns in `hide` left out. O(H · Σ L_i · D) FLOPs, O(Hk · Σ L_i · D) bytes read; no mask tensor.
    `sinks` (H,): each head's sink logit as one more, last column of its softmax, which no value reads (gpt-oss,
    arXiv 2508.10925)."""
    qs = fold(q * scale(q.shape[-1]), pairs[0][0].shape[1])  # (B, Hk, H/Hk, D): a group's queries read its keys once
    parts = [qs @ k.transpose(-2, -1) for k, _ in pairs]
    if sinks is not None:  # (B, Hk, r·Nq, 1)
        parts.append(group_sinks(sinks, qs.shape[1], q.shape[2]).to(qs.dtype)[..., None].expand_as(parts[0][..., :1]))
    scores = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)  # (B, Hk, H/Hk, Σ L_i)
    if hide is not None:
        scores[..., hide] = float("-inf")
    p = torch.softmax(scores, dim=-1)
    out, start = None, 0
    for k, v in pairs:
        part = p[..., start:start + k.shape[-2]] @ v
        out, start = part if out is None else out.add_(part), start + k.shape[-2]
    return unfold(out, q.shape[1])


def kv_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, KVCache]:
    """One token against every filled slot of the cache: softmax attention over all cached tokens (or, in a ring,
    over the last `limit`; their order in the ring does not matter to softmax). O(filled · D)."""
    keys, values = cache.append(k, v)
    return attend(q, (keys, values), sinks=cache.sinks), cache
