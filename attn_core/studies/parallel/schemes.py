"""The three schemes, one rank's side: ring attention (Liu, Zaharia, Abbeel 2023, arXiv 2310.01889), the head
all-to-all of DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509) and state passing for linear attention
(Katharopoulos et al. 2020, arXiv 2006.16236, eq. 8–9), Mamba-2 and Gated DeltaNet; every transfer through a `Link`
that counts the bytes it sends."""
from __future__ import annotations

import datetime
import os
import time
from typing import Sequence

import torch
import torch.distributed as dist

from attn_core.studies.parallel.task import Task, mechanism_state, positions

BLOCK = 64  # positions per block of the chunked causal linear form inside one rank's chunk


# -- counted communication ------------------------------------------------------------------------------------------

class Link:
    """This rank's side of the process group: every transfer goes through here, which counts the bytes it sends to
    other ranks and the seconds spent waiting, and waits at most `timeout` on each."""

    def __init__(self, rank: int, procs: int, timeout: datetime.timedelta, die_at: int | None = None,
                 failure: str = "exit"):
        self.rank, self.procs, self.timeout = rank, procs, timeout
        self.bytes_sent, self.comm_s, self.calls = 0, 0.0, 0
        self.die_at, self.failure = die_at, failure  # test hook: at that call this rank exits, or stalls

    def _enter(self) -> None:
        self.calls += 1
        if self.die_at is not None and self.calls >= self.die_at:
            if self.failure == "stall":
                time.sleep(10 * self.timeout.total_seconds())  # alive but silent: the others' timeouts must end it
            os._exit(17)

    def start_exchange(self, send: Sequence[torch.Tensor], to: int, recv: Sequence[torch.Tensor], frm: int) -> list:
        """Start sending `send` to rank `to` and receiving into `recv` from rank `frm`; `wait` on what it returns."""
        self._enter()
        ops = [dist.P2POp(dist.isend, t, to) for t in send] + [dist.P2POp(dist.irecv, t, frm) for t in recv]
        self.bytes_sent += sum(t.numel() * t.element_size() for t in send)
        return dist.batch_isend_irecv(ops)

    def send(self, t: torch.Tensor, to: int) -> list:
        self._enter()
        self.bytes_sent += t.numel() * t.element_size()
        return [dist.isend(t, to)]

    def recv(self, t: torch.Tensor, frm: int) -> torch.Tensor:
        self._enter()
        self.wait([dist.irecv(t, frm)])
        return t

    def wait(self, works: list) -> None:
        start = time.perf_counter()
        for w in works:
            w.wait(self.timeout)
        self.comm_s += time.perf_counter() - start

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """x (P, …) → (P, …): block j goes to rank j, block j of the result came from rank j."""
        self._enter()
        x = x.contiguous()
        out = torch.empty_like(x)
        self.bytes_sent += (x.numel() - x[self.rank].numel()) * x.element_size()  # a block to itself is not sent
        start = time.perf_counter()
        dist.all_to_all_single(out, x, async_op=True).wait(self.timeout)
        self.comm_s += time.perf_counter() - start
        return out


# -- the three schemes, one rank's side -----------------------------------------------------------------------------

def _partial(q, k, v, qpos, kpos, causal: bool, acc, top, total) -> None:
    """Fold one key/value block into the running softmax of q, in place: scores s = q·kᵀ/√D (causal: −∞ where the
    key's position is after the query's), top' = max(top, max s), acc' = acc·e^(top − top') + e^(s − top')·v,
    total' = total·e^(top − top') + Σ e^(s − top')."""
    s = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)
    if causal:
        s.masked_fill_(qpos[:, None] < kpos[None, :], float("-inf"))
    new = torch.maximum(top, s.amax(-1, keepdim=True))
    keep = (top - new).exp()
    p = (s - new).exp()
    acc.mul_(keep).add_(p @ v)
    total.mul_(keep).add_(p.sum(-1, keepdim=True))
    top.copy_(new)


def ring_attention(q, k, v, qpos: torch.Tensor, link: Link, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact softmax attention of this rank's queries over all keys: at step s the rank holds the K, V block of rank
    (r − s) mod P, sends it to r + 1 while folding it into the online softmax (a block pair wholly in the future of
    its queries is skipped), receives the next from r − 1. q, k, v (B, H, n/P, D) → (output, log-sum-exp (B, H,
    n/P, 1)). Time O(n²·D/P) a rank, memory O((n/P)·D + (n/P)²): never the whole sequence's keys."""
    P, r = link.procs, link.rank
    acc, total = torch.zeros_like(q), q.new_zeros(*q.shape[:-1], 1)
    top = torch.full_like(total, float("-inf"))
    kv, kpos = torch.stack([k, v]), qpos
    for step in range(P):
        works = []
        if step < P - 1:
            incoming = torch.empty_like(kv)
            works = link.start_exchange([kv], (r + 1) % P, [incoming], (r - 1) % P)
        for qs in _halves(qpos, causal):  # zig-zag: each query block against each key block not wholly after it
            for ks in _halves(kpos, causal):
                if not causal or kpos[ks].min() <= qpos[qs].max():
                    _partial(q[:, :, qs], kv[0][:, :, ks], kv[1][:, :, ks], qpos[qs], kpos[ks], causal, acc[:, :, qs],
                             top[:, :, qs], total[:, :, qs])
        link.wait(works)
        if step < P - 1:
            kv, kpos = incoming, positions_of(kpos, P, causal, r - step - 1)
    return acc / total, top + total.log()


def _halves(pos: torch.Tensor, causal: bool) -> list[slice]:
    """The two zig-zag blocks of a causal rank's positions; all of them as one otherwise."""
    half = len(pos) // 2
    return [slice(0, half), slice(half, None)] if causal else [slice(None)]


def positions_of(kpos: torch.Tensor, procs: int, causal: bool, owner: int) -> torch.Tensor:
    """The positions of the block first held by rank `owner` (mod P), as `positions` gives them."""
    n = len(kpos) * procs
    task = Task("ring", procs=procs, n=n, causal=causal)
    return positions(task, owner % procs)


def ulysses(q, k, v, link: Link, mechanism: str, causal: bool, params: dict) -> torch.Tensor:
    """Sequence-sharded q, k, v (B, H, n/P, D) → all-to-all → head-sharded (B, H/P, n, D) → the mechanism over the
    whole sequence → all-to-all back → (B, H, n/P, D). Four all-to-alls of (P − 1)/P of a shard each."""
    from attn_core.api import attention

    B, H, nl, D = q.shape
    P = link.procs

    def to_heads(x):  # (B, H, nl, D) → (P, B, H/P, nl, D) → exchange → (B, H/P, P·nl, D)
        y = link.all_to_all(x.view(B, P, H // P, nl, D).transpose(0, 1))
        return y.permute(1, 2, 0, 3, 4).reshape(B, H // P, P * nl, D)

    out = attention(mechanism, to_heads(q), to_heads(k), to_heads(v), causal=causal, **params)
    back = link.all_to_all(out.view(B, H // P, P, nl, D).permute(2, 0, 1, 3, 4))  # block j: rank j's heads
    return back.transpose(0, 1).reshape(B, H, nl, D)


def linear_state_passing(q, k, v, link: Link) -> torch.Tensor:
    """Causal linear attention of this rank's chunk: its own state S_r = Σ φ(k_j) v_jᵀ, z_r = Σ φ(k_j) over the
    chunk; the prefix (S, z) of ranks before it arrives from r − 1 and (prefix + own) goes on to r + 1; then out_i =
    φ(q_i)ᵀ(S + Σ_{j ≤ i in chunk} φ(k_j) v_jᵀ) / φ(q_i)ᵀ(z + Σ φ(k_j)), by blocks of BLOCK positions. q, k, v (B,
    H, n/P, D); O((n/P)·D²) time a rank, O(D²) sent, whatever n."""
    from attn_core.mechanisms.linear import feature_map

    fq, fk = feature_map(q), feature_map(k)
    own = torch.cat([fk.transpose(-2, -1) @ v, fk.sum(-2).unsqueeze(-1)], dim=-1)  # (B, H, D, D + 1): [S | z]
    prefix = _passed_on(own, lambda p: p + own, link)
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # [V, 1]: numerator and normaliser in one product
    out = torch.empty_like(v)
    state = prefix
    for s in range(0, q.shape[2], BLOCK):
        a = (fq[:, :, s:s + BLOCK] @ fk[:, :, s:s + BLOCK].transpose(-2, -1)).tril_()
        num = fq[:, :, s:s + BLOCK] @ state + a @ v1[:, :, s:s + BLOCK]
        out[:, :, s:s + BLOCK] = num[..., :-1] / num[..., -1:]
        state = state + fk[:, :, s:s + BLOCK].transpose(-2, -1) @ v1[:, :, s:s + BLOCK]
    return out


def _passed_on(like: torch.Tensor, carried, link: Link) -> torch.Tensor:
    """The prefix state P_r of the ranks before this one: received from r − 1 (zeros on rank 0), and
    `carried(P_r)` = the state after this rank's chunk sent on to r + 1 (not by the last rank)."""
    prefix = torch.zeros_like(like)
    if link.rank > 0:
        link.recv(prefix, link.rank - 1)
    if link.rank < link.procs - 1:
        link.wait(link.send(carried(prefix).contiguous(), link.rank + 1))
    return prefix


def mamba2_state_passing(q, k, v, link: Link, dt, A, chunk: int = 64) -> torch.Tensor:
    """Mamba-2's SSM (Dao and Gu 2024, arXiv 2405.21060) over this rank's chunk: the state after it from zero,
    S_r = Σ_s exp(A·Σ_{s<t≤end} dt_t)·dt_s·k_s v_sᵀ, and its decay g_r = exp(A·Σ dt); the prefix P_r arrives from
    r − 1, g_r·P_r + S_r goes on; then the product's own chunked kernel runs from P_r. dt (B, H, n/P), A (H,);
    (B, H, D, D) sent, whatever n."""
    from attn_core.mechanisms.mamba2 import ssd, ssd_state

    own = ssd_state(k, v, dt, A, chunk, q.shape[1])
    decay = (dt.sum(-1) * A).exp()[..., None, None]  # (B, H, 1, 1)
    prefix = _passed_on(own, lambda p: decay * p + own, link)
    return ssd(q, k, v, dt, A, chunk, h=prefix)[0]


def deltanet_state_passing(q, k, v, link: Link, alpha, beta, chunk: int = 32) -> torch.Tensor:
    """Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, arXiv 2412.06464) or Kimi Delta Attention (arXiv 2510.26692:
    `alpha` (B, Hk, n/P, D), a decay a key channel) over this rank's chunk: the update Sᵀ ← (I − β k̂k̂ᵀ)·α·Sᵀ + β k̂vᵀ
    (α a number, or Diag(α)) is affine in S, so the chunk maps a state before it to M_r·P + S_r, with M_r (d_k × d_k)
    the chunk's run from the identity with v = 0 and S_r its run from zero; the prefix P_r arrives from r − 1,
    M_r·P_r + S_r goes on; then the chunked kernel runs from P_r. (B·Hk, D, D) sent, M_r stays home."""
    log_alpha = alpha.log()
    B, Hk, _, d = k.shape
    eye = torch.eye(d, dtype=v.dtype, device=v.device).expand(B * Hk, d, d).contiguous()
    through = _deltanet_run(None, k, torch.zeros_like(k), log_alpha, beta, chunk, eye)[1]  # M_r
    own = _deltanet_run(None, k, v, log_alpha, beta, chunk, torch.zeros_like(eye))[1]
    prefix = _passed_on(own, lambda p: through @ p + own, link)
    return _deltanet_run(q, k, v, log_alpha, beta, chunk, prefix)[0]


def _deltanet_run(q, k, v, log_alpha, beta, chunk: int, S):
    """The chunked form from the state S (B·Hk, d_k, d_v) instead of zeros: (out or None, S after); kda's when the
    decays have a key channel each (log_alpha (B, Hk, n, D)), else gated_deltanet's. The two kernels share their
    segment's signature."""
    from attn_core.mechanisms import gated_deltanet, kda
    from attn_core.mechanisms._linear_core import causal_chunks

    kernel = kda if log_alpha.dim() == 4 else gated_deltanet
    B, Hk, n, d = k.shape
    out = None if q is None else torch.empty(*q.shape[:3], v.shape[-1], dtype=v.dtype, device=v.device)
    for s, e, c in causal_chunks(n, kernel.segment_rows(B * Hk, d, chunk, k.device.type), chunk):
        S = kernel._segment(q, k, v, log_alpha, beta, S, out, s, e, c)
    return out, S


def compute(task: Task, link: Link, q, k, v) -> torch.Tensor:
    """This rank's shard of `task`'s output by its scheme, from the whole q, k, v (B, H, n, D): (B, H, n/P, D), the
    rows of its `positions`."""
    pos = positions(task, link.rank).to(q.device)
    ql, kl, vl = (x[:, :, pos].contiguous() for x in (q, k, v))
    if task.scheme == "ring":
        return ring_attention(ql, kl, vl, pos, link, task.causal)[0]
    if task.scheme == "ulysses":
        return ulysses(ql, kl, vl, link, task.mechanism, task.causal, dict(task.params))
    if task.mechanism == "linear":
        return linear_state_passing(ql, kl, vl, link)
    state = {key: t[:, :, pos] if t.dim() >= 3 else t for key, t in mechanism_state(task, q.device).items()}
    if task.mechanism == "mamba2":
        return mamba2_state_passing(ql, kl, vl, link, **state, **dict(task.params))
    return deltanet_state_passing(ql, kl, vl, link, **state, **dict(task.params))  # gated_deltanet or kda
