"""A mechanism that is not in the catalogue's folder: approximate, with random state, causal-capable. It joins the
catalogue through ATTN_CORE_MECHANISMS="tests.toy_mechanism:TOY", the door a user's own mechanism comes through,
and every page and the command line must then work with it selected, knowing of it only its spec."""
from __future__ import annotations

import torch

from attn_core.spec import Cost, Insight, MechanismSpec, Param, Shape, State, Supports

REF = "tests.toy_mechanism:TOY"


def init_state(shape: Shape, device=None, dtype=torch.float32, *, seed: int = 0, features: int = 16) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(shape.D, features, generator=g).to(device=device, dtype=dtype)}


def _weights(q, k, causal: bool, w: torch.Tensor) -> torch.Tensor:
    phi_q, phi_k = torch.relu(q @ w) + 1e-3, torch.relu(k @ w) + 1e-3  # positive ReLU random features
    s = phi_q @ phi_k.transpose(-2, -1)
    if causal:
        s = s.tril()
    return s / s.sum(-1, keepdim=True)


def toy_attention(q, k, v, *, causal: bool = False, features: int = 16, w=None, seed: int = 0):
    """Row-normalized φ(Q)φ(K)ᵀ V with φ(x) = relu(x W) + 10⁻³, W (D, features) random: O(n²·m) as written here."""
    if w is None:
        w = init_state(Shape.of(q, k, causal), q.device, q.dtype, seed=seed, features=features)["w"]
    return _weights(q, k, causal, w) @ v


def _effective(q, k, v, causal: bool, state: dict, features: int = 16):
    return _weights(q, k, causal, state["w"]), v


def _flops(s: Shape, features: int = 16) -> float:
    return 2.0 * s.bh * (s.Nq + s.Nk) * s.D * features + 4.0 * s.bh * s.Nq * s.Nk * max(features, s.D)


def _memory(s: Shape, features: int = 16) -> float:
    return 2.0 * s.bh * s.Nq * s.Nk * s.elem + s.output_bytes


TOY = MechanismSpec(
    key="toy",
    label="Toy (ReLU features)",
    fn=toy_attention,
    description="A test mechanism from outside the catalogue.",
    paper="none",
    params=(Param("features", 16, 1, 4096, "Random ReLU features.", log=True, small=lambda n: 8),),
    exact=False,
    state=State(init=init_state, keys=("w",)),
    cost=Cost(flops=_flops, memory_bytes=_memory, time_big_o="O(n²·m)", memory_big_o="O(n²)"),
    supports=Supports(causal=True, cross=True),
    insight=Insight(effective=_effective, regime=("gentle", "peaky", "ReLU features are a crude kernel.")),
)
