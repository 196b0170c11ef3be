"""`gated_deltanet`: its forward time against n (the slope from 4096 to 32768, target ≤ 1.15), its generation step
time and state bytes against the context (slopes near 0), and its forward beside flash-linear-attention's
pure-PyTorch chunk reference for the gated delta rule (`naive_chunk_gated_delta_rule`, target ours/peer ≤ 1.0 at
n = 8192), interleaved in one process:

    python -m attn_core.benchmarks.deltanet            # n = 4096…32768, 5 rounds; contexts 1k…32k, 50 steps
    python -m attn_core.benchmarks.deltanet --quick    # n = 4096, 8192, 32768, 3 rounds; contexts 1k, 8k, 20 steps

B = 1, H = 8, D = 64, float32, forward, 2 torch threads, causal (the only form), the gates drawn outside the timed
calls (init_state). Each round times every contestant once, in turn; figures are medians over the rounds with their
spread, ratios taken round by round. On a machine other programs share, `--threads 1 --clock cpu` counts this
process's CPU time instead.

The peer is the reference a user would reach for: flash-linear-attention's `fla/ops/gated_delta_rule/naive.py`,
pure PyTorch (its chunked form: a row-by-row forward substitution for the UT transform, then a loop over chunks). It
is not a dependency of this project: install it beside the benchmark only, e.g.
`pip install --no-deps --target /tmp/fla_env flash-linear-attention fla-core` and run with
PYTHONPATH=/tmp/fla_env. Its package imports triton on the way to that module (fla/ops/__init__.py), which a CPU
machine lacks, so the module is loaded from its file (it needs torch and einops only); without it the peer is
skipped and the reason printed. The peer's call is given what ours computes inside: L2-normalised q and k (their
normalisation timed with it), log α, β and the d^(−1/2) scale, in its (B, T, H, D) layout; its chunk is its
default, 64. The two outputs are compared before timing. `--device cuda` times the same calls on the GPU and, where
flash-linear-attention imports with Triton, its fused `chunk_gated_delta_rule` beside them (q and k normalised in
the kernel; its first call compiles and tunes, untimed).
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
from pathlib import Path

import torch
import torch.nn.functional as F

from . import interleaved, median, ratio_verdict, ratios, spread
from .runner import Benchmark, Figure, Machine, run
from attn_core.nn import generation as gen
from ..engine import env
from ..engine.analysis import loglog_slope
from ..engine.measure import format_bytes
from ..mechanisms import MECHANISMS
from ..mechanisms._common import validated
from ..mechanisms.gated_deltanet import draw_gates

KEY = "gated_deltanet"
TARGET_SLOPE, TARGET_STEP_SLOPE, PEER_N, TARGET_PEER = 1.15, 0.1, 8192, 1.0


def peer() -> tuple[object | None, str]:
    """(flash-linear-attention's naive_chunk_gated_delta_rule, its version) or (None, why it cannot be had)."""
    try:
        found = importlib.util.find_spec("fla")  # finds the package without running its __init__
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        return None, "flash-linear-attention is not importable here (see this script's docstring to install it)"
    path = Path(found.submodule_search_locations[0]) / "ops" / "gated_delta_rule" / "naive.py"
    try:
        spec = importlib.util.spec_from_file_location("fla_gated_delta_rule_naive", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        version = importlib.metadata.version("fla-core")
    except (ImportError, OSError, AttributeError, importlib.metadata.PackageNotFoundError) as e:
        return None, f"flash-linear-attention's naive module at {path} does not load ({e})"
    return module.naive_chunk_gated_delta_rule, f"fla-core {version}"


def triton_peer() -> tuple[object | None, str]:
    """(flash-linear-attention's fused Triton `chunk_gated_delta_rule`, its version) or (None, why not): the kernel a
    user of a CUDA device would reach for."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        version = importlib.metadata.version("fla-core")
    except Exception as e:  # noqa: BLE001 - any failure to import is a reason to print, not a crash
        return None, f"flash-linear-attention's Triton kernel does not import here ({type(e).__name__}: {e})"
    return chunk_gated_delta_rule, f"fla-core {version}"


def inputs(n: int, heads: int, head_dim: int, device: str = "cpu") -> tuple[list[torch.Tensor], dict]:
    g = torch.Generator().manual_seed(n)
    qkv = [torch.randn(1, heads, n, head_dim, generator=g).to(device) for _ in range(3)]
    return qkv, {name: t.to(device) for name, t in draw_gates(1, heads, n, seed=0).items()}


def contestants(n: int, args, naive, fused=None) -> dict:
    """name → thunk of one forward call (inputs and gates made here, outside the calls)."""
    (q, k, v), gates = inputs(n, args.heads, args.head_dim, args.device)
    fn, chunk = MECHANISMS[KEY].fn, {"chunk": args.chunk} if args.chunk else {}
    calls = {"ours": lambda: fn(q, k, v, causal=True, **chunk, **gates)}
    if naive is not None and n <= args.peer_max:
        # the peer's (B, T, H, …) layout as views: it transposes and copies them itself, as it would any input
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        g, beta = (t.transpose(1, 2) for t in (gates["alpha"].log(), gates["beta"]))
        scale = args.head_dim ** -0.5
        calls["peer"] = lambda: naive(F.normalize(qt, dim=-1, eps=1e-6), F.normalize(kt, dim=-1, eps=1e-6), vt, g,
                                      beta, scale=scale)[0]
    if fused is not None:  # its own layout, contiguous as it asks; it normalises q and k in the kernel
        qc, kc, vc, gc, bc = (t.transpose(1, 2).contiguous() for t in (q, k, v, gates["alpha"].log(), gates["beta"]))
        calls["triton"] = lambda: fused(qc, kc, vc, gc, bc, scale=args.head_dim ** -0.5,
                                        use_qk_l2norm_in_kernel=True)[0]
    return calls


def check_agreement(calls: dict) -> str:
    """The largest |ours − peer| of one call each: the same computation, or the ratio means nothing."""
    with torch.inference_mode(), validated():
        ours = calls["ours"]()
        found = {name: (ours - calls[name]().transpose(1, 2)).abs().max().item() for name in calls if name != "ours"}
    return ", ".join(f"max |ours − {name}| = {e:.1e}" for name, e in found.items())


def forward(args, naive) -> tuple[dict[int, list[float]], list[Figure]]:
    """n → our seconds per round, printed with the peer's and the ratio where it ran; and those figures."""
    ours, figures = {}, []
    for n in args.ns:
        calls = contestants(n, args, naive, args.fused)
        agree = f"  ({check_agreement(calls)})" if len(calls) > 1 else ""
        times = interleaved(calls, args.rounds, args.device, clock=args.clock)
        ours[n] = times["ours"]
        cells = "  ".join(f"{name} {spread(t, 1e3, '.1f')}" for name, t in times.items())
        print(f"n={n:6d}  ms: {cells}{agree}", flush=True)
        figures += [Figure.of(f"{name} seconds per call, n = {n}", t) for name, t in times.items()]
        if "peer" in times:
            each = ratios(times["ours"], times["peer"])
            told = ratio_verdict(each, TARGET_PEER) if n == PEER_N else f"{spread(each)}×"
            print(f"{'':8s}ours/peer {told}", flush=True)
            figures.append(Figure.judged(f"ours/peer, n = {n}", each, TARGET_PEER) if n == PEER_N else
                           Figure.of(f"ours/peer, n = {n}", each, "×"))
        if "triton" in times:
            print(f"{'':8s}ours/triton {spread(ratios(times['ours'], times['triton']))}×", flush=True)
            figures.append(Figure.of(f"ours/triton, n = {n}", ratios(times["ours"], times["triton"]), "×"))
    return ours, figures


def steps(n: int, args) -> tuple[list[float], int]:
    """Seconds of `args.steps` generation steps after a prompt of n tokens (its state by `remember`; each step's
    gates drawn ahead with the cache), and the bytes the cache holds."""
    (_, k, v), gates = inputs(n, args.heads, args.head_dim, args.device)
    cache = gen.remember(KEY, k, v, max_len=n + args.steps + 1, **gates)
    (q, k, v), _ = inputs(args.steps + 1, args.heads, args.head_dim, args.device)
    timer, times = env.device_timer(args.device), []
    with torch.inference_mode(), validated():
        for i in range(args.steps + 1):
            t = timer(lambda i=i: gen.step(KEY, q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1], cache), 1)
            times += [t] if i else []  # the first, untimed: warm-up
    return times, cache.nbytes


def generation(args) -> list[Figure]:
    medians, held, figures = [], [], []
    for n in args.contexts:
        times, nbytes = steps(n, args)
        medians.append(median(times))
        held.append(nbytes)
        print(f"context {n:6d}: step µs {spread(times, 1e6, '.1f')}, state {format_bytes(nbytes)}", flush=True)
        figures += [Figure.of(f"step seconds, context {n}", times),
                    Figure(f"state bytes, context {n}", nbytes, "bytes")]
    if len(args.contexts) > 1:
        t, b = loglog_slope(args.contexts, medians), loglog_slope(args.contexts, held)
        verdict = "meets" if abs(t) <= TARGET_STEP_SLOPE and abs(b) <= TARGET_STEP_SLOPE else "MISSES"
        print(f"slopes against the context: step time {t:+.3f}, state bytes {b:+.3f}, {verdict} |slope| ≤ "
              f"{TARGET_STEP_SLOPE}", flush=True)
        figures += [Figure.slope(f"step {what} slope against the context", value, TARGET_STEP_SLOPE, absolute=True)
                    for what, value in (("time", t), ("state bytes", b))]
    return figures


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", default="4096,8192,16384,32768", help="comma-separated sequence lengths")
    p.add_argument("--contexts", default="1024,4096,16384,32768", help="generation contexts, comma-separated")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--chunk", type=int, default=0, help="our chunk; 0: the spec's default")
    p.add_argument("--peer-max", type=int, default=PEER_N, help="the longest n the peer is timed at")
    p.add_argument("--quick", action="store_true", help="n = 4096, 8192, 32768, 3 rounds; contexts 1k, 8k, 20 steps")


def settle(args: argparse.Namespace) -> None:
    if args.quick:
        args.n, args.rounds, args.contexts, args.steps = "4096,8192,32768", 3, "1024,8192", 20
    args.ns, args.contexts = ([int(x) for x in s.split(",")] for s in (args.n, args.contexts))


def setting(args: argparse.Namespace) -> str:
    chunk = args.chunk or MECHANISMS[KEY].defaults["chunk"]
    return (f"B=1, H={args.heads}, D={args.head_dim}, float32, causal forward, chunk {chunk}, {args.rounds} "
            f"interleaved rounds; {'wall' if args.clock == 'wall' else 'CPU'} ms: median (IQR, min–max)")


def measure(args: argparse.Namespace) -> list[Figure]:
    naive, version = peer()
    args.fused, fused_version = triton_peer() if args.device == "cuda" else (None, "")
    print(f"peer: naive_chunk_gated_delta_rule of {version}, chunk 64, at n ≤ {args.peer_max}" if naive else
          f"peer skipped: {version}", flush=True)
    if args.device == "cuda":
        print(f"Triton peer: chunk_gated_delta_rule of {fused_version}, q and k normalised in the kernel"
              if args.fused else f"Triton peer skipped: {fused_version}", flush=True)
    ours, figures = forward(args, naive)
    if len(args.ns) > 1:
        slope = loglog_slope(args.ns, [median(ours[n]) for n in args.ns])
        print(f"time slope over n = {args.ns[0]}…{args.ns[-1]}: {slope:.3f}, "
              f"{'meets' if slope <= TARGET_SLOPE else 'MISSES'} ≤ {TARGET_SLOPE}", flush=True)
        figures.append(Figure.slope(f"ours time slope, n = {args.ns[0]}…{args.ns[-1]}", slope, TARGET_SLOPE))
    print(f"\nGeneration: B=1, H={args.heads}, D={args.head_dim}, {args.steps} steps a context, "
          f"each after its own prompt's state (remember)")
    return [*figures, *generation(args)]


BENCHMARK = Benchmark(
    "deltanet", "gated_deltanet: forward time slope, generation step and state against context, and beside "
    "flash-linear-attention's chunk reference.", measure, options, settle, setting,
    Machine(threads=2, rounds=5), __doc__)


def main(argv: list[str] | None = None) -> int:
    return run(BENCHMARK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
