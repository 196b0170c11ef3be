"""Rotary position embedding against a rotation written out pair by pair, and its defining property."""
from __future__ import annotations

import math

import pytest
import torch

from attn_core.positions import rope


def rotated_by_hand(x: torch.Tensor, positions: list[int], base: float = 10000.0) -> torch.Tensor:
    """x (N, d) float64, each pair (2i, 2i+1) of row n multiplied by the 2×2 matrix of angle p_n·base^(−2i/d)."""
    out = torch.empty_like(x)
    d = x.shape[-1]
    for n, p in enumerate(positions):
        for i in range(d // 2):
            a = p * base ** (-2 * i / d)
            turn = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64)
            out[n, 2 * i:2 * i + 2] = turn @ x[n, 2 * i:2 * i + 2]
    return out


def rotated_complex(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The same as a product of complex numbers (x_2i + i·x_2i+1)·e^{i·p·θ_i}."""
    d = x.shape[-1]
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    turn = torch.exp(1j * positions[:, None].double() * theta)
    z = torch.complex(x[..., 0::2].double(), x[..., 1::2].double()) * turn
    return torch.stack((z.real, z.imag), dim=-1).flatten(-2)


@pytest.mark.parametrize("d", [2, 6, 16])
def test_rotate_matches_the_pairwise_rotation_and_the_complex_product(d):
    torch.manual_seed(d)
    positions = [0, 1, 2, 7, 30, 1001]
    x = torch.randn(len(positions), d, dtype=torch.float64)
    got = rope.rotate(x, torch.tensor(positions))
    torch.testing.assert_close(got, rotated_by_hand(x, positions), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(got, rotated_complex(x, torch.tensor(positions)), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(rope.rotate(x, torch.tensor(positions), base=500.0),
                               rotated_by_hand(x, positions, base=500.0), atol=1e-12, rtol=1e-12)


def test_float32_input_is_rotated_in_float32_and_returned_in_its_dtype():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 11, 8)
    positions = torch.arange(11)
    got = rope.rotate(x, positions)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), rotated_complex(x, positions), atol=2e-6, rtol=2e-6)
    half = rope.rotate(x.bfloat16(), positions)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), got, atol=5e-2, rtol=2e-2)


def test_scores_depend_only_on_the_distance_between_positions():
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(3)
    d = 16
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)

    def score(i: int, j: int) -> float:
        return float(rope.rotate(q[None], torch.tensor([i])) @ rope.rotate(k[None], torch.tensor([j]))[0])

    for _ in range(20):
        i, j, s = (int(v) for v in torch.randint(0, 2000, (3,), generator=g))
        assert score(i, j) == pytest.approx(score(i + s, j + s), rel=1e-9, abs=1e-9)
    # the same token at every position: the score matrix is constant along each diagonal (Toeplitz)
    n = 12
    rq = rope.rotate(q.expand(n, d), torch.arange(n))
    rk = rope.rotate(k.expand(n, d), torch.arange(n))
    scores = rq @ rk.T
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1], atol=1e-12, rtol=1e-12)
    assert not torch.allclose(scores[0, 1:], scores[0, :-1])  # but it does change with the distance


def test_norm_is_preserved_and_position_zero_is_the_identity():
    torch.manual_seed(4)
    x = torch.randn(3, 9, 10, dtype=torch.float64)
    got = rope.rotate(x, torch.randint(0, 5000, (9,)))
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=1e-12)
    assert torch.equal(rope.rotate(x, torch.zeros(9, dtype=torch.long)), x)


def test_positions_per_sequence_broadcast_and_tables_can_be_reused():
    torch.manual_seed(5)
    x = torch.randn(2, 4, 6, 8)  # (B, H, N, d)
    positions = torch.stack([torch.arange(6), torch.arange(10, 16)])[:, None, :]  # (B, 1, N)
    got = rope.rotate(x, positions)
    for b in range(2):
        torch.testing.assert_close(got[b], rope.rotate(x[b], positions[b, 0]))
    cos, sin = rope.angles(positions, 8)
    assert cos.shape == sin.shape == (2, 1, 6, 4)
    torch.testing.assert_close(rope.apply(x, cos, sin), got)


def test_bad_arguments_are_refused_with_a_sentence():
    with pytest.raises(ValueError, match="even number of features"):
        rope.rotate(torch.randn(4, 7), torch.arange(4))
    with pytest.raises(ValueError, match="positive even integer"):
        rope.angles(torch.arange(4), 7)
    with pytest.raises(ValueError, match="positions must be a tensor"):
        rope.rotate(torch.randn(4, 8), torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="do not fit"):
        rope.rotate(torch.randn(4, 8), torch.arange(5))
    with pytest.raises(ValueError, match="base must be"):
        rope.rotate(torch.randn(4, 8), torch.arange(4), base=-2.0)
    with pytest.raises(ValueError, match="floating-point"):
        rope.rotate(torch.ones(4, 8, dtype=torch.long), torch.arange(4))
