"""`linear` and `performer` against linear-attention-transformer 0.19.1's core functions, and `performer` against
performer-pytorch 1.1.4's FastAttention (same m, same projection), interleaved in one process:

    python -m attn_core.benchmarks.linear            # n = 4096…32768, causal and not, 5 rounds
    python -m attn_core.benchmarks.linear --quick    # n = 4096 and 8192, 3 rounds
    python -m attn_core.benchmarks.linear --n 8192 --rounds 15 --linear-only   # the issue's target, no Performer

B = 1, H = 8, D = 64, float32, forward, 2 torch threads, glibc's allocator fixed as the engine's worker fixes it
(env.steady_allocator: every block reused once the heap settles, by the third call); q, k, v (and Performer's
projection) are built outside the timed calls. Each round times every contestant once, in turn (A B A B …), so a
busy moment of the machine falls on all of them; the figures are medians over the rounds, the spread their min–max.
On a machine other programs share, `--threads 1 --clock cpu` counts this process's CPU time instead (min over the
rounds): waiting for a descheduled thread then costs nothing, which a 2-thread wall clock there charges to every op.

`attention('linear')` is the public call a user makes, `attn_core.attention("linear", q, k, v)`, every check a user pays
included (its arguments, the finiteness scan, the mechanism's own checks); the targets (≤ 1.0× the peer at n = 8192, ≤
0.8× at 32768, causal and not, on a quiet machine) are for it. `linear` is the mechanism's function alone, as the engine
times it (checked once, outside). Linear attention's finiteness check reads no input again where its whole-tensor form
runs: NaN or inf there reaches its sums and normalizers (`_linear_core.phi_into`). With another process on one of the
two cores, each parallel operation waits for its descheduled thread: the figures then follow the number of operations a
call makes, which is why float32 and float64 calls run in a few large operations, by groups of heads
(`_linear_core.elu_attention`: at any n on a CPU, causal in segments of 4 Mi numbers of queries), φ in one C++ pass
(`native.elu_plus_one`) and the causal block states' sums in another (`native.prefix_sums`).

What is compared: the peer's `linear_attn(q, k, v)` (non-causal: softmax of q over features, of k over positions,
q·D^-½, then (kᵀv) and q·(kᵀv); its softmax over positions normalizes, so it has no normalizer of its own) and
`causal_linear_attn(q, k, v)` (softmax of q over features, exp(k), buckets of 64 positions, each bucket sees the
summed kᵀv of the buckets before it only, not its own: fewer products than exact causal attention, which ours
computes, the masked in-block products included). Both are the whole call, feature maps included, as ours: `linear`
(φ = elu + 1, width D) and `performer` (FAVOR+, m random features: its projections cost 2·m·D per row on top; at
m = 64 its features are as wide as the peer's).
"""
from __future__ import annotations

import argparse
import contextvars

import torch

from .. import MECHANISMS, attention, make_state
from . import interleaved, median, spread
from .runner import Benchmark, Figure, Machine, run
from ..engine.analysis import loglog_slope
from ..spec import Shape

OURS = (("linear", {}), ("performer", {"features": 64}), ("performer", {"features": 256}))
TARGETS = {8192: 1.0, 32768: 0.8}  # ours/peer, the targets for `linear` (and Performer's core)
TARGET_SLOPE = 1.15


def peer_functions():
    """(linear_attn, causal_linear_attn) of linear-attention-transformer, or None when it is not installed."""
    try:
        from linear_attention_transformer.linear_attention_transformer import causal_linear_attn, linear_attn
    except ImportError:
        return None
    return linear_attn, causal_linear_attn


def performer_peer(features: int, causal: bool, projection: torch.Tensor):
    """performer-pytorch 1.1.4's FastAttention with `features` random features, its projection set to ours (the same
    features, so the same work), or None when it is not installed. Causal on a CPU it takes its own non-CUDA path
    (chunked prefix sums of the (m × d) products)."""
    try:
        import contextlib
        import io
        with contextlib.redirect_stdout(io.StringIO()):  # it prints that the CUDA causal kernel is missing
            from performer_pytorch import FastAttention
            attention = FastAttention(projection.shape[-1], nb_features=features, causal=causal)
    except ImportError:
        return None
    attention.projection_matrix.copy_(projection.reshape(-1, projection.shape[-1])[:features])
    return attention


def contestants(n: int, causal: bool, heads: int, head_dim: int, peer, ours=OURS) -> dict:
    """name → thunk of one forward call, inputs and state built here, outside the calls."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=g) for _ in range(3))
    calls = {}
    for key, params in ours:
        spec = MECHANISMS[key]
        state = make_state(key, Shape(1, heads, n, n, head_dim, dtype="float32", causal=causal), **params)
        name = key + "".join(f" m={v}" for v in params.values())
        calls[name] = (lambda spec=spec, kw={**params, **state}: spec.fn(q, k, v, causal=causal, **kw))
        if key == "linear":  # what a user calls: arguments checked and scanned for NaN in every call, the kernel's
            # own checks too (a fresh context: outside the engine's `validated`, which the timing loop enters)
            calls["attention('linear')"] = lambda: contextvars.Context().run(attention, "linear", q, k, v,
                                                                             causal=causal)
        if key == "performer" and (fast := performer_peer(params["features"], causal, state["projection"])):
            calls[f"performer-pytorch m={params['features']}"] = lambda fast=fast: fast(q, k, v)
    if peer is not None:
        calls["peer"] = (lambda f=peer[causal]: f(q, k, v))
    return calls


def measure(args: argparse.Namespace, peer) -> tuple[dict[tuple[str, bool, int], float], list[Figure]]:
    """(contestant, causal, n) → its figure in seconds (median of the rounds' wall times, or the least CPU time),
    printed point by point with the spread and ours/peer; and those figures as the runner writes them."""
    clock, pick = ("wall", median) if args.clock == "wall" else ("cpu", min)
    figures, found = {}, []
    for causal in (False, True):
        for n in args.ns:
            calls = contestants(n, causal, args.heads, args.head_dim, peer, OURS[:1] if args.linear_only else OURS)
            times = interleaved(calls, args.rounds, clock=clock)
            fig = {name: pick(t) for name, t in times.items()}
            least = {name: f"min {fig[name] * 1e3:.1f}, " if pick is min else "" for name in fig}
            cells = [f"{name} {least[name]}{spread(t, 1e3, '.1f')}" for name, t in times.items()]
            print(f"{'causal' if causal else 'full  '} n={n:6d}  " + "  ".join(cells), flush=True)
            where = f"{'causal' if causal else 'full'}, n = {n}"
            found += [Figure.of(f"{name} seconds per call, {where}", t) if pick is median else
                      Figure(f"{name} least CPU seconds per call, {where}", min(t), "s", n=len(t))
                      for name, t in times.items()]
            if "peer" in fig:
                target = f"  (target for linear ≤ {TARGETS[n]:.1f})" if n in TARGETS else ""
                print(f"{'':14s}ours/peer: " + ", ".join(f"{name} {fig[name] / fig['peer']:.2f}×" for name in fig
                                                        if name != "peer" and "pytorch" not in name) + target,
                      flush=True)
                found += [Figure(f"{name}/peer, {where}", fig[name] / fig["peer"], "×",
                                 **({"target": f"≤ {TARGETS[n]:g}", "meets": fig[name] / fig["peer"] <= TARGETS[n]}
                                    if n in TARGETS and name == "attention('linear')" else {}))
                          for name in fig if name != "peer" and "pytorch" not in name]
            against = [(name, f"performer-pytorch m={name.split('m=')[1]}") for name in fig
                       if name.startswith("performer m=")]
            if any(peer in fig for _, peer in against):
                print(f"{'':14s}ours/performer-pytorch (same m, same projection): "
                      + ", ".join(f"{name} {fig[name] / fig[peer]:.2f}×" for name, peer in against if peer in fig),
                      flush=True)
                found += [Figure(f"{name}/performer-pytorch, {where}", fig[name] / fig[peer], "×")
                          for name, peer in against if peer in fig]
            figures.update({(name, causal, n): f for name, f in fig.items()})
    return figures, found


def print_slopes(figures: dict[tuple[str, bool, int], float], ns: list[int]) -> list[Figure]:
    print(f"\nTime slopes, least squares of log t on log n over n = {ns[0]}…{ns[-1]} (target ≤ {TARGET_SLOPE}):")
    found = []
    for causal in (False, True):
        for name in dict.fromkeys(name for name, c, _ in figures if c == causal):
            slope = loglog_slope(ns, [figures[name, causal, n] for n in ns])
            print(f"  {name:20s} {'causal' if causal else 'full  '} {slope:5.2f}")
            found.append(Figure.slope(f"{name} time slope, {'causal' if causal else 'full'}, n = {ns[0]}…{ns[-1]}",
                                      slope, TARGET_SLOPE))
    return found


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", default="4096,8192,16384,32768", help="comma-separated sequence lengths")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="n = 4096 and 8192, 3 rounds")
    p.add_argument("--linear-only", action="store_true",
                   help="linear (kernel and public call) and its peer only, without Performer and performer-pytorch")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n, args.rounds = "4096,8192", 3
    args.ns = [int(x) for x in args.n.split(",")]


def setting(args: argparse.Namespace) -> str:
    least = "" if args.clock == "wall" else "min, "
    return (f"B=1, H={args.heads}, D={args.head_dim}, float32, forward, {args.rounds} interleaved rounds; "
            f"{'wall' if args.clock == 'wall' else 'CPU'} ms: {least}median (IQR, min–max)")


def body(args: argparse.Namespace) -> list[Figure]:
    peer = peer_functions()
    if peer is None:
        print("linear-attention-transformer is not installed (pip install linear-attention-transformer==0.19.1): "
              "ours are timed alone, without ratios.")
    print("Whole calls, feature maps included. peer: linear_attn (softmax features, no normalizer) and "
          "causal_linear_attn (buckets of 64 see the buckets before them, not their own); ours: exact causal.")
    figures, found = measure(args, peer)
    return [*found, *(print_slopes(figures, args.ns) if len(args.ns) > 1 else [])]


BENCHMARK = Benchmark(
    "linear", "linear and performer against linear-attention-transformer and performer-pytorch, interleaved.",
    body, options, settle, setting, Machine(threads=2, devices=("cpu",), rounds=5), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
