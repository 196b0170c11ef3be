"""`mamba2` (chunked SSD) against the Mamba-2 paper's minimal SSD listing, its time slope in n, and its generation
step and state against context:

    python -m attn_core.benchmarks.ssd            # n = 4096…32768, contexts 1k…32k, 5 rounds
    python -m attn_core.benchmarks.ssd --quick    # n = 4096 and 8192, contexts 1k…8k, 3 rounds

B = 1, H = 8, D = 64, float32, forward, causal, 2 torch threads, glibc's allocator fixed as the engine's worker fixes
it (env.steady_allocator); q, k, v, dt and A are built outside the timed calls. Each round times every contestant
once, in turn (A B A B …); figures are medians over the rounds with their spread, and ours/peer is taken round by
round (the two calls of a round ran side by side).

The peer, `paper_ssd`, is written here from the listing 'ssd_minimal_discrete' of Dao and Gu 2024 ('Transformers are
SSMs', arXiv 2405.21060, section 7 and appendix): the benchmark's stand-in for the public reference a user would reach
for, not the project's code. It computes the same thing (tests/mechanisms/test_mamba2.py checks ours against a recurrence; this
script checks the two against each other before timing) in the paper's four einsum steps: the diagonal blocks with
the decay mask exp(segsum), each chunk's state, the chunk states mixed by an (nc + 1) × (nc + 1) decay matrix (nc
chunks: quadratic in nc, where ours runs the recurrence over chunks), and the states read by the queries. It takes its
inputs in its own layout (b, n, h, p), made outside the call; its discretisation (x·dt, A·dt) runs inside, as ours.

Targets (issue 23): time slope t(32768)/t(4096) on log-log axes ≤ 1.15; ours/peer ≤ 1.0 at n = 8192; generation time
per token and state bytes flat in context (|log-log slope| ≤ 0.1).
"""
from __future__ import annotations

import argparse

import torch

from . import interleaved, median, powers, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run
from attn_core.nn import generation as gen
from ..api import make_state
from ..engine import env
from ..engine.analysis import loglog_slope
from ..engine.measurement import median_iqr
from ..mechanisms import MECHANISMS
from ..mechanisms._common import validated
from ..spec import Shape

TARGET_SLOPE, TARGET_RATIO, TARGET_FLAT, PEER_N = 1.15, 1.0, 0.1, 8192


def paper_ssd(x, dt, A, B, C, block: int):
    """The paper's minimal SSD (see the module docstring), x (b, n, h, p), dt (b, n, h), A (h,), B and C
    (b, n, h, s) → y (b, n, h, p); n a multiple of `block`."""
    b, n, h, p = x.shape
    nc = n // block
    x, a = x * dt[..., None], A * dt  # discretised as the paper's test calls it
    x, B, C = (t.reshape(b, nc, block, h, -1) for t in (x, B, C))
    a = a.reshape(b, nc, block, h).permute(0, 3, 1, 2)  # (b, h, c, l)
    a_cum = a.cumsum(-1)
    L = torch.exp(_segsum(a))  # (b, h, c, l, l)
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C, B, L, x)
    decay_states = torch.exp(a_cum[..., -1:] - a_cum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B, decay_states, x)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(_segsum(torch.nn.functional.pad(a_cum[..., -1], (1, 0))))  # (b, h, nc + 1, nc + 1)
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", C, states, torch.exp(a_cum))
    return (y_diag + y_off).reshape(b, n, h, p)


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """(…, T) → (…, T, T): Σ x[j+1 … i] for j ≤ i, −inf above the diagonal (exp of it: the decay mask)."""
    T = x.shape[-1]
    cum = x.cumsum(-1)
    diff = cum[..., :, None] - cum[..., None, :]
    return diff.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), -torch.inf)


def inputs(n: int, heads: int, head_dim: int, chunk: int, seed: int = 0):
    """q, k, v (1, H, n, D) and the seeded state {'dt', 'A'} of `mamba2`."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=g) for _ in range(3))
    return q, k, v, make_state("mamba2", Shape(1, heads, n, n, head_dim, causal=True), chunk=chunk)


def contestants(n: int, args, peer: bool) -> dict:
    """name → thunk of one forward call; the peer's inputs are laid out for it here, outside the calls."""
    q, k, v, state = inputs(n, args.heads, args.head_dim, args.chunk)
    fn = MECHANISMS["mamba2"].fn
    calls = {"mamba2": lambda: fn(q, k, v, causal=True, chunk=args.chunk, **state)}
    if peer:
        x, B, C = (t.transpose(1, 2).contiguous() for t in (v, k, q))
        dt = state["dt"].transpose(1, 2).contiguous()
        calls["paper listing"] = lambda: paper_ssd(x, dt, state["A"], B, C, args.chunk)
    return calls


def check_peer(args) -> float:
    """Largest difference between ours and the peer at n = 4·chunk, relative to the largest output."""
    q, k, v, state = inputs(4 * args.chunk, args.heads, args.head_dim, args.chunk, seed=1)
    with torch.inference_mode():
        ours = MECHANISMS["mamba2"].fn(q, k, v, causal=True, chunk=args.chunk, **state)
        theirs = paper_ssd(v.transpose(1, 2), state["dt"].transpose(1, 2), state["A"], k.transpose(1, 2),
                           q.transpose(1, 2), args.chunk).transpose(1, 2)
    return float((ours - theirs).abs().max() / ours.abs().max())


def forward(args) -> tuple[dict[int, float], list[Figure]]:
    """n → our median seconds; prints each n's figures and, at n = 8192, ours/peer round by round; and those
    figures."""
    figures, found = {}, []
    for n in args.ns:
        times = interleaved(contestants(n, args, peer=n == PEER_N), args.rounds)
        print(f"n={n:6d}  " + "  ".join(f"{name} {spread(t, 1e3, '.1f')} ms" for name, t in times.items()), flush=True)
        found += [Figure.of(f"{name} seconds per call, n = {n}", t) for name, t in times.items()]
        if len(times) > 1:
            print(f"{'':8s}ours/peer {ratio_verdict(ratios(times['mamba2'], times['paper listing']), TARGET_RATIO)}",
                  flush=True)
            found.append(Figure.judged(f"ours/peer, n = {n}", ratios(times["mamba2"], times["paper listing"]),
                                       TARGET_RATIO))
        figures[n] = median(times["mamba2"])
    return figures, found


def step_time(n: int, args) -> tuple[float, float, int]:
    """(median seconds of a step, its IQR, the state's bytes) against a context of n tokens: `generation.remember`
    of n random tokens, then `args.steps` steps, each rewound to n (as the engine times a step)."""
    _, k, v, state = inputs(n, args.heads, args.head_dim, args.chunk, seed=n)
    q1, k1, v1 = (t[:, :, :1].clone() for t in inputs(1, args.heads, args.head_dim, args.chunk, seed=n + 1)[:3])
    timer, samples = env.device_timer("cpu"), []
    with torch.inference_mode(), validated():
        cache = gen.remember("mamba2", k, v, max_len=n + 1, chunk=args.chunk, **state)
        mark = cache.mark()
        for i in range(args.steps + 3):
            took = timer(lambda: gen.step("mamba2", q1, k1, v1, cache), 1)
            cache.rewind(mark)
            samples += [took] if i >= 3 else []  # three untimed first steps
    med, iqr = median_iqr(samples)
    return med, iqr, cache.nbytes


def generation(args) -> list[Figure]:
    contexts, figures = powers(1024, args.max_context), []
    print(f"\nGeneration: one step against a context of n tokens, {args.steps} steps each")
    steps, held = [], []
    for n in contexts:
        med, iqr, nbytes = step_time(n, args)
        steps.append(med)
        held.append(nbytes)
        print(f"  n={n:6d}  step {med * 1e6:7.1f} µs (IQR {iqr * 1e6:.1f})  state {nbytes} bytes", flush=True)
        figures += [Figure(f"step seconds, context {n}", med, "s", iqr, n=args.steps),
                    Figure(f"state bytes, context {n}", nbytes, "bytes")]
    for what, ys in (("step time", steps), ("state bytes", held)):
        slope = loglog_slope(contexts, ys)
        verdict = "meets" if abs(slope) <= TARGET_FLAT else "MISSES"
        print(f"  {what} slope {slope:+.3f}, {verdict} |slope| ≤ {TARGET_FLAT}")
        figures.append(Figure.slope(f"{what} slope against the context", slope, TARGET_FLAT, absolute=True))
    return figures


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", default="4096,8192,16384,32768", help="comma-separated sequence lengths")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--chunk", type=int, default=MECHANISMS["mamba2"].param("chunk").default)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--max-context", type=int, default=32768)
    p.add_argument("--quick", action="store_true", help="n = 4096 and 8192, contexts 1k…8k, 3 rounds, 20 steps")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n, args.rounds, args.steps, args.max_context = "4096,8192", 3, 20, 8192
    args.ns = [int(x) for x in args.n.split(",")]


def measure(args: argparse.Namespace) -> list[Figure]:
    print(f"ours against the paper's listing at n = {4 * args.chunk}: largest difference "
          f"{check_peer(args):.1e} of the largest output")
    figures, found = forward(args)
    if len(args.ns) > 1:
        slope = loglog_slope(args.ns, [figures[n] for n in args.ns])
        verdict = "meets" if slope <= TARGET_SLOPE else "MISSES"
        print(f"time slope over n = {args.ns[0]}…{args.ns[-1]}: {slope:.2f}, {verdict} ≤ {TARGET_SLOPE}")
        found.append(Figure.slope(f"mamba2 time slope, n = {args.ns[0]}…{args.ns[-1]}", slope, TARGET_SLOPE))
    return [*found, *generation(args)]


BENCHMARK = Benchmark(
    "ssd", "mamba2 (chunked SSD) against the Mamba-2 paper's minimal SSD listing, its time slope, and its generation "
    "step and state against context.", measure, options, settle,
    lambda args: f"B=1, H={args.heads}, D={args.head_dim}, chunk={args.chunk}, float32, forward, causal, "
                 f"{args.rounds} interleaved rounds; wall ms: median (IQR, min–max)",
    Machine(threads=2, devices=("cpu",), rounds=5, clocks=("wall",)), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
