"""Heads that share keys: grouped-query and multi-query attention (k and v with Hk < H heads; Ainslie et al. 2023,
'GQA', arXiv 2305.13245) against multi-head attention, and multi-head latent attention decoding in its absorbed
form against its naive one (DeepSeek-V2, arXiv 2405.04434, section 2.1). Every figure comes from interleaved calls
(A B A B …, so a busy spell of the machine hits both alike), median with its spread, through the public functions a
user calls: `attn_core.attention`, `attn_core.nn.generation.remember` / `step`, `MultiLatentAttention.step`.

    python -m attn_core.benchmarks.heads            # B=1, H=8, D=64, fp32: n = 8192 (softmax 4096), decode 16384
    python -m attn_core.benchmarks.heads --quick    # n = 2048, decode at 4096, for a first look

1. Forward time with Hk = 2 against Hk = 8 key/value heads, for softmax, sdpa, sliding_window (w = 256) and linear,
   non-causal, and causal for the last three: t(Hk=2)/t(Hk=8), target ≤ 1.05 (sharing must not cost time). Softmax
   runs at n = 4096 by default: at 8192 it holds two 8×8192×8192 fp32 matrices (4 GiB) and takes ~9 s a call here.
2. The generation cache with Hk = 2 against 8 (its used bytes, exactly 2/8), and the time of one decode step at a
   long context with Hk = 8, 2, 1 (MHA, GQA, MQA) for softmax and sdpa: a step reads the whole cache, so it should
   fall with Hk. Each step is rewound to the same context (cache.mark / cache.rewind, as the engine's step_call).
3. MLA at DeepSeek's proportions scaled to --heads × --head-dim (default 16 × 64): one decode step, absorbed
   against naive on the same layer (one state_dict, `layer.absorbed` flipped), target ≤ 0.5; the cache per token
   against MHA's; and where absorbed overtakes naive, their ratio at contexts from 1 token up.
"""
from __future__ import annotations

import argparse
from fractions import Fraction
from typing import Callable

import torch

from . import alternate, median, ratio_verdict, ratios, spread, timer
from .runner import Benchmark, Figure, Machine, run
from .. import MultiLatentAttention, attention
from attn_core.nn import generation as gen
from ..engine import env
from ..engine.measure import format_bytes
from attn_core.nn.latent import (DEEPSEEK, LatentCache, cache_elements, deepseek_proportions, mha_cache_elements, step_flops)

LINES = {"softmax": {}, "sdpa": {}, "sliding_window": {"window": 256}, "linear": {}}
CAUSAL = ("sdpa", "sliding_window", "linear")  # softmax causal would only double its slowest line
DECODERS = ("softmax", "sdpa")
HEAD_DIM = 64  # of parts 1 and 2, the issue's; --head-dim sizes the MLA layer
TARGET_GQA, TARGET_MLA = 1.05, 0.5


def seeded(*shape: int, seed: int, device: str) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(device)


def warmed(calls: dict) -> str:
    """One untimed call of each (the warm-up), in inference mode: '' when all ran, else the sentence of the
    ValueError that refused one (a mechanism that cannot share key/value heads says why)."""
    try:
        with torch.inference_mode():
            for call in calls.values():
                call()
    except ValueError as refused:
        return str(refused)
    return ""


def side_by_side(calls: dict, rounds: int, args: argparse.Namespace) -> dict:
    """Seconds per call of each (args.clock), one call of each per round in turn (`alternate`), in inference mode
    but not inside `validated()`: every call checks its arguments, as a user's call does."""
    timed = timer(args.device, args.clock)
    with torch.inference_mode():
        return alternate({name: (lambda call=call: timed(call, 1)) for name, call in calls.items()}, rounds)


def forward(args: argparse.Namespace) -> list[Figure]:
    H, D, Hk = args.query_heads, HEAD_DIM, args.key_heads
    figures = []
    print(f"\n1. Forward, attn_core.attention(key, q, k, v, causal=…) as a user calls it (arguments checked, NaN "
          f"scan included): q of H={H} heads, k and v of Hk={Hk} against Hk={H}; seconds per call, median (IQR, "
          f"min–max) of {args.rounds} interleaved rounds; the ratio t(Hk={Hk})/t(Hk={H}) round by round:")
    for key, params in LINES.items():
        n = args.softmax_n if key == "softmax" else args.n
        q = seeded(1, H, n, D, seed=0, device=args.device)
        kv = {heads: (seeded(1, heads, n, D, seed=1, device=args.device),
                      seeded(1, heads, n, D, seed=2, device=args.device)) for heads in (H, Hk)}
        for causal in (False, True) if key in CAUSAL else (False,):
            label = f"  {key:14s} {'causal' if causal else 'full':6s} n={n:5d}"
            calls = {heads: (lambda q=q, pair=kv[heads], c=causal: attention(key, q, *pair, causal=c, **params))
                     for heads in kv}
            refused = warmed(calls)
            if refused:
                print(f"{label}  refused: {refused}", flush=True)
                continue
            t = side_by_side(calls, args.rounds, args)
            print(f"{label}  Hk={H} {spread(t[H], fmt='.3g')} s  Hk={Hk} {spread(t[Hk], fmt='.3g')} s  "
                  f"ratio {ratio_verdict(ratios(t[Hk], t[H]), TARGET_GQA)}", flush=True)
            where = f"{key}, {'causal' if causal else 'full'}, n = {n}"
            figures += [*(Figure.of(f"forward seconds per call, Hk = {heads}, {where}", t[heads]) for heads in t),
                        Figure.judged(f"t(Hk={Hk})/t(Hk={H}), {where}", ratios(t[Hk], t[H]), TARGET_GQA)]
        env.release_cached_memory(args.device)
    return figures


def cache_sizes(args: argparse.Namespace) -> list[Figure]:
    H, D, Hk, n = args.query_heads, HEAD_DIM, args.key_heads, args.n
    want, figures = Fraction(Hk, H), []
    print(f"\n2a. Generation cache, generation.remember(key, k, v) of n={n} tokens: used bytes with Hk={Hk} against "
          f"Hk={H}, which must be exactly {want.numerator}/{want.denominator}:")
    for key, params in LINES.items():
        used = {}
        try:
            with torch.inference_mode():
                for heads in (H, Hk):
                    k, v = (seeded(1, heads, n, D, seed=s, device=args.device) for s in (1, 2))
                    used[heads] = gen.remember(key, k, v, **params).used_bytes
        except ValueError as refused:
            print(f"  {key:14s} refused: {refused}")
            continue
        got = Fraction(used[Hk], used[H])
        print(f"  {key:14s} Hk={H} {format_bytes(used[H]):>10s}  Hk={Hk} {format_bytes(used[Hk]):>10s}  ratio "
              f"{got.numerator}/{got.denominator} = {float(got):.4f}, {'meets' if got == want else 'MISSES'} "
              f"= {want.numerator}/{want.denominator}")
        figures.append(Figure(f"cache bytes Hk = {Hk} over Hk = {H}, {key}, n = {n}", float(got), "×",
                              target=f"= {want.numerator}/{want.denominator}", meets=got == want))
    return figures


def decode(args: argparse.Namespace) -> list[Figure]:
    H, D, n = args.query_heads, HEAD_DIM, args.context
    kinds = {H: "MHA", args.key_heads: "GQA", 1: "MQA"}
    print(f"\n2b. Decode, generation.step(key, q, k, v, cache) as a user calls it, at a context of {n} tokens, the "
          f"cache rewound after each step; µs per token, median (IQR, min–max) of {args.steps} interleaved rounds "
          f"(all {len(DECODERS) * len(kinds)} lines in turn); a step reads Hk·n keys and values, so its bytes fall "
          f"to Hk/{H}:")
    calls: dict[tuple[str, int], Callable[[], object]] = {}
    with torch.inference_mode():
        for key in DECODERS:
            for heads in kinds:
                k, v = (seeded(1, heads, n, D, seed=s, device=args.device) for s in (1, 2))
                cache = gen.remember(key, k, v, max_len=n + 1)
                token = (seeded(1, H, 1, D, seed=3, device=args.device),
                         *(seeded(1, heads, 1, D, seed=s, device=args.device) for s in (4, 5)))
                calls[key, heads] = stepper(key, token, cache)
    refused = warmed(calls)
    if refused:
        print(f"  refused: {refused}")
        return []
    t, figures = side_by_side(calls, args.steps, args), []
    for key in DECODERS:
        for heads, kind in kinds.items():
            versus = "" if heads == H else f"  t/t(MHA) {spread(ratios(t[key, heads], t[key, H]))}×"
            print(f"  {key:8s} {kind} Hk={heads}  {spread(t[key, heads], 1e6, '.1f'):>34s} µs{versus}")
            figures.append(Figure.of(f"decode step seconds, {key}, {kind} Hk = {heads}, context {n}", t[key, heads]))
            if heads != H:
                figures.append(Figure.of(f"decode step t/t(MHA), {key}, {kind} Hk = {heads}, context {n}",
                                         ratios(t[key, heads], t[key, H]), "×"))
        medians = [median(t[key, heads]) for heads in kinds]
        falls = all(a > b for a, b in zip(medians, medians[1:]))
        print(f"  {key:8s} time per token falls with Hk ({' > '.join(str(h) for h in kinds)}): "
              f"{'yes' if falls else 'NO'}")
    return figures


def stepper(key: str, token: tuple[torch.Tensor, ...], cache: gen.Cache) -> Callable[[], torch.Tensor]:
    """One step of `token` against `cache`, then the cache rewound: every call sees the same context."""
    mark = cache.mark()

    def one_step() -> torch.Tensor:
        out, _ = gen.step(key, *token, cache)
        cache.rewind(mark)
        return out
    return one_step


def latent_steps(layer: MultiLatentAttention, n: int, args: argparse.Namespace) -> tuple[dict, LatentCache]:
    """{'naive': thunk, 'absorbed': thunk}: one decode step of `layer` against a cache of n latents drawn at random
    (a prefill of n tokens would cost O(n²)), rewound after each step; and that cache."""
    with torch.inference_mode():
        cache = LatentCache(seeded(1, n, layer.kv_rank, seed=1, device=args.device),
                            seeded(1, n, layer.rope_dim, seed=2, device=args.device), max_len=n + 1)
    x_t, mark = seeded(1, 1, layer.d_model, seed=3, device=args.device), cache.mark()

    def one_step(absorbed: bool) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            layer.absorbed = absorbed
            out, _ = layer.step(x_t, cache)
            cache.rewind(mark)
            return out
        return call
    return {"naive": one_step(False), "absorbed": one_step(True)}, cache


def crossing(layer: MultiLatentAttention, args: argparse.Namespace) -> list[Figure]:
    """Where the absorbed step overtakes the naive one: t(absorbed)/t(naive) at contexts from 1 token to
    args.context, and the shortest context from which it stays below 1."""
    contexts = [c for c in (1, 4, 16, 64, 256, 1024, 4096, 16384) if c <= args.context]
    print(f"  Where absorbed overtakes naive, t(absorbed)/t(naive) by context (median of {args.steps // 2} "
          "interleaved rounds):")
    below = []
    for n in contexts:
        calls, _ = latent_steps(layer, n, args)
        warmed(calls)
        t = side_by_side(calls, max(args.steps // 2, 3), args)
        ratio = median(ratios(t["absorbed"], t["naive"]))
        below.append(ratio < 1)
        naive, absorbed = median(t["naive"]) * 1e3, median(t["absorbed"]) * 1e3
        print(f"    context {n:6,}: naive {naive:8.3f} ms, absorbed {absorbed:8.3f} ms, {ratio:.2f}×")
    first = next((n for i, n in enumerate(contexts) if all(below[i:])), None)
    print(f"  absorbed is faster from a context of {first:,} token{'s' if first > 1 else ''} on" if first is not None
          else "  absorbed is not faster for good within these contexts")
    return [Figure("MLA context from which absorbed is faster than naive", first, "tokens")]


def latent(args: argparse.Namespace) -> list[Figure]:
    sizes = deepseek_proportions(args.heads, args.head_dim)
    H, D, r, rho, n = sizes["heads"], sizes["head_dim"], sizes["kv_rank"], sizes["rope_dim"], args.context
    d_model = H * D
    torch.manual_seed(0)
    layer = MultiLatentAttention(d_model, **sizes).to(args.device)
    calls, cache = latent_steps(layer, n, args)
    print(f"\n3. MLA decode, MultiLatentAttention.step(x_t, cache) at DeepSeek-V2/V3's proportions scaled to "
          f"{H} heads × {D} (kv_rank = 4·head_dim = {r}, rope_dim = head_dim/2 = {rho}, q_rank = 12·head_dim = "
          f"{sizes['q_rank']}; d_model = heads·head_dim = {d_model}), a context of {n} latents drawn at random "
          f"(LatentCache, rewound after each step), one layer and state_dict with layer.absorbed flipped; ms per "
          f"token, median (IQR, min–max) of {args.steps} interleaved rounds:")
    warmed(calls)
    t = side_by_side(calls, args.steps, args)
    flops = step_flops(H, D, r, rho, n + 1, True) / step_flops(H, D, r, rho, n + 1, False)
    for name, samples in t.items():
        print(f"  {name:9s} {spread(samples, 1e3, '.3g'):>34s} ms")
    print(f"  t(absorbed)/t(naive) {ratio_verdict(ratios(t['absorbed'], t['naive']), TARGET_MLA)} "
          f"(their matmul FLOPs, latent.step_flops: {flops:.3f}×)")
    mla, mha = cache_elements(r, rho), mha_cache_elements(H, D)
    big_mla = cache_elements(DEEPSEEK["kv_rank"], DEEPSEEK["rope_dim"])
    big_mha = mha_cache_elements(DEEPSEEK["heads"], DEEPSEEK["head_dim"])
    print(f"  Cache per token and layer, in values: MLA kv_rank + rope_dim = {mla:,} against MHA 2·heads·head_dim = "
          f"{mha:,}, {mla / mha:.2%} (at these proportions (4.5·D)/(2·H·D) = 2.25/heads); this LatentCache holds "
          f"{cache.used_bytes // n:,} bytes a token = {cache.used_bytes // n // 4:,} fp32 values.")
    print(f"  At DeepSeek-V3's own sizes ({DEEPSEEK['heads']} heads × {DEEPSEEK['head_dim']}, kv_rank "
          f"{DEEPSEEK['kv_rank']}, rope_dim {DEEPSEEK['rope_dim']}): {big_mla:,} against {big_mha:,}, "
          f"{big_mla / big_mha:.2%}. Sources: DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3, arXiv "
          f"2412.19437 (the same attention sizes).")
    return [*(Figure.of(f"MLA decode step seconds, {name}, context {n}", samples) for name, samples in t.items()),
            Figure.judged(f"MLA t(absorbed)/t(naive), context {n}", ratios(t["absorbed"], t["naive"]), TARGET_MLA),
            Figure(f"MLA cache per token over MHA's, {H} heads × {D}", mla / mha, "×"),
            *crossing(layer, args)]


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=8192, help="sequence length of the forward calls")
    p.add_argument("--softmax-n", type=int, default=4096, help="softmax's own (it holds two H·n² fp32 matrices)")
    p.add_argument("--context", type=int, default=16384, help="tokens in the cache of a decode step")
    p.add_argument("--query-heads", type=int, default=8, help="H of parts 1 and 2 (head_dim 64)")
    p.add_argument("--key-heads", type=int, default=2, help="Hk of grouped-query attention, dividing H")
    p.add_argument("--heads", type=int, default=16, help="heads of the MLA layer (part 3)")
    p.add_argument("--head-dim", type=int, default=64, help="its head_dim, a multiple of 4")
    p.add_argument("--steps", type=int, default=50, help="interleaved rounds of the decode steps")
    p.add_argument("--quick", action="store_true", help="n = 2048 (softmax too), decode at 4096, 20 steps")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n, args.context, args.steps = 2048, 4096, min(args.steps, 20)
    args.softmax_n = min(args.softmax_n, args.n)


def measure(args: argparse.Namespace) -> list[Figure]:
    return [*forward(args), *cache_sizes(args), *decode(args), *latent(args)]


BENCHMARK = Benchmark(
    "heads", "Grouped- and multi-query heads against multi-head attention; MLA's absorbed decode against its naive.",
    measure, options, settle,
    lambda args: f"B=1, fp32, the public calls timed in torch.inference_mode ({args.clock} clock); "
                 f"sliding_window with window {LINES['sliding_window']['window']}.",
    Machine(threads=None, rounds=5), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
