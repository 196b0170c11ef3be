"""Multi-head latent attention: both forms against a per-head reference that builds K and V by hand, generation
against the full causal forward, the cache's size and growth, and the cost formulas against counted FLOPs."""
from __future__ import annotations

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attn_core as ac
from attn_core.nn import latent
from tests.contract.test_flop_counter import baddbmm_flops

SIZES = dict(d_model=24, heads=3, kv_rank=10, rope_dim=4, head_dim=6)


def make(seed: int = 0, **kwargs) -> ac.MultiLatentAttention:
    torch.manual_seed(seed)
    layer = ac.MultiLatentAttention(**{**SIZES, **kwargs})
    if kwargs.get("bias"):
        with torch.no_grad():  # nn.Linear's biases start small; make them matter
            for p in layer.parameters():
                if p.dim() == 1:
                    p.normal_()
    return layer


def rotary(t: torch.Tensor, base: float) -> torch.Tensor:
    """(..., N, e) with token n's pair (2i, 2i+1) read as the complex number t_2i + i·t_2i+1 and multiplied by
    e^{i·n·base^(−2i/e)}."""
    N, e = t.shape[-2:]
    theta = base ** (-torch.arange(0, e, 2, dtype=torch.float64) / e)
    angle = torch.arange(N, dtype=torch.float64)[:, None] * theta
    turn = torch.polar(torch.ones(N, e // 2, dtype=torch.float64), angle)
    z = torch.view_as_complex(t.reshape(*t.shape[:-1], e // 2, 2).contiguous()) * turn
    return torch.view_as_real(z).flatten(-2)


def linear(lin: torch.nn.Linear, t: torch.Tensor) -> torch.Tensor:
    out = t @ lin.weight.double().T
    return out if lin.bias is None else out + lin.bias.double()


def reference(layer: ac.MultiLatentAttention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """The layer in float64, one head at a time: latent, then that head's keys and values built from it, then
    masked softmax written out."""
    x = x.double()
    N = x.shape[1]
    H, D, rho = layer.heads, layer.head_dim, layer.rope_dim
    c = linear(layer.w_dkv, x)  # (B, N, kv_rank)
    k_rope = rotary(linear(layer.w_kr, x), layer.base)  # (B, N, rho), shared by the heads
    c_q = x if layer.w_dq is None else linear(layer.w_dq, x)
    q_content, q_rope = linear(layer.w_uq, c_q), linear(layer.w_qr, c_q)
    k_content, values = linear(layer.w_uk, c), linear(layer.w_uv, c)  # (B, N, H·D)
    allowed = torch.ones(N, N, dtype=torch.bool)
    if causal:
        allowed = allowed.tril()
    outs = []
    for h in range(H):
        heads = slice(h * D, (h + 1) * D)
        q = torch.cat([q_content[..., heads], rotary(q_rope[..., h * rho:(h + 1) * rho], layer.base)], dim=-1)
        k = torch.cat([k_content[..., heads], k_rope], dim=-1)
        s = (q @ k.transpose(1, 2)) / math.sqrt(D + rho)
        s = s.masked_fill(~allowed, float("-inf"))
        w = torch.exp(s - s.max(dim=-1, keepdim=True).values)
        outs.append((w / w.sum(dim=-1, keepdim=True)) @ values[..., heads])
    return linear(layer.w_o, torch.cat(outs, dim=-1))


@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_rank", [None, 8])
@pytest.mark.parametrize("bias", [False, True])
def test_both_forms_match_the_per_head_reference(absorbed, causal, q_rank, bias):
    layer = make(1, q_rank=q_rank, absorbed=absorbed, bias=bias)
    x = torch.randn(2, 9, SIZES["d_model"])
    out = layer(x, causal=causal)
    assert out.shape == x.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), reference(layer, x, causal), atol=1e-5, rtol=1e-5)


def test_float64_layer_matches_the_reference_to_float64_precision():
    layer = make(2, q_rank=8).double()
    x = torch.randn(2, 7, SIZES["d_model"], dtype=torch.float64)
    for absorbed in (False, True):
        layer.absorbed = absorbed
        torch.testing.assert_close(layer(x, causal=True), reference(layer, x, True), atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_rank", [None, 8])
def test_naive_and_absorbed_agree_and_one_state_dict_serves_both(causal, q_rank):
    naive = make(3, q_rank=q_rank, bias=True)
    absorbed = make(4, q_rank=q_rank, bias=True, absorbed=True)  # other weights until the load
    absorbed.load_state_dict(naive.state_dict())
    x = torch.randn(3, 11, SIZES["d_model"])
    torch.testing.assert_close(absorbed(x, causal=causal), naive(x, causal=causal), atol=1e-5, rtol=1e-5)
    naive.absorbed = True  # the attribute alone switches the computation
    torch.testing.assert_close(naive(x, causal=causal), absorbed(x, causal=causal), atol=0, rtol=0)


@pytest.mark.parametrize("absorbed", [False, True])
@pytest.mark.parametrize("max_len", [None, 16])
def test_prefill_and_steps_match_the_full_causal_forward(absorbed, max_len):
    layer = make(5, q_rank=8, absorbed=absorbed)
    x = torch.randn(2, 12, SIZES["d_model"])
    full = layer(x, causal=True)
    out, cache = layer.prefill(x[:, :4], max_len=max_len)
    torch.testing.assert_close(out, full[:, :4], atol=1e-5, rtol=1e-5)
    for t in range(4, 12):
        y, same = layer.step(x[:, t:t + 1], cache)
        assert same is cache and cache.length == t + 1 and y.shape == (2, 1, SIZES["d_model"])
        torch.testing.assert_close(y[:, 0], full[:, t], atol=1e-5, rtol=1e-5)


def test_the_cache_holds_the_latent_and_the_rotated_shared_key_only():
    layer = make(6)
    x = torch.randn(2, 5, SIZES["d_model"])
    _, cache = layer.prefill(x[:, :3])
    layer.step(x[:, 3:4], cache)
    layer.step(x[:, 4:5], cache)
    c_kv, k_r = cache.view()
    torch.testing.assert_close(c_kv.double(), linear(layer.w_dkv, x.double()), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(k_r.double(), rotary(linear(layer.w_kr, x.double()), layer.base), atol=1e-6, rtol=1e-6)
    r, rho = SIZES["kv_rank"], SIZES["rope_dim"]
    assert layer.cache_elements == latent.cache_elements(r, rho) == r + rho
    assert cache.used_bytes == 2 * 5 * (r + rho) * 4 == latent.cache_bytes(2, 5, r, rho, 4)
    assert cache.nbytes == 2 * cache.capacity * (r + rho) * 4


def test_the_cache_is_preallocated_and_doubles_when_full():
    layer = make(7, absorbed=True)
    x = torch.randn(1, 14, SIZES["d_model"])
    _, grown = layer.prefill(x[:, :3])
    _, reserved = layer.prefill(x[:, :3], max_len=10)
    capacities, kept = [grown.capacity], [reserved.capacity]
    for t in range(3, 14):
        layer.step(x[:, t:t + 1], grown)
        layer.step(x[:, t:t + 1], reserved)
        capacities.append(grown.capacity)
        kept.append(reserved.capacity)
    assert capacities == [3] + [6] * 3 + [12] * 6 + [24] * 2  # lengths 3, 4 … 14
    assert kept == [10] * 8 + [20] * 4
    assert grown.k_r.shape[1] == grown.capacity and reserved.k_r.shape[1] == reserved.capacity
    assert grown.used_bytes == reserved.used_bytes == 14 * (SIZES["kv_rank"] + SIZES["rope_dim"]) * 4
    torch.testing.assert_close(grown.view()[0], reserved.view()[0], atol=0, rtol=0)


@pytest.mark.parametrize("absorbed", [False, True])
def test_rewind_repeats_a_step_at_the_same_context(absorbed):
    layer = make(8, absorbed=absorbed)
    x = torch.randn(2, 8, SIZES["d_model"])
    _, cache = layer.prefill(x[:, :6], max_len=8)
    mark = cache.mark()
    first, _ = layer.step(x[:, 6:7], cache)
    layer.step(x[:, 7:8], cache)
    cache.rewind(mark)
    assert cache.length == 6
    again, _ = layer.step(x[:, 6:7], cache)
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    for bad in (7, (9,), (-1,), (True,), (6, 0)):
        with pytest.raises(ValueError, match="rewind"):
            cache.rewind(bad)


@pytest.mark.parametrize("absorbed", [False, True])
def test_step_flops_count_what_the_core_executes(absorbed):
    H, D, r, rho, L = 3, 6, 10, 4, 17
    q_c, q_r = torch.randn(1, H, 1, D), torch.randn(1, H, 1, rho)
    c_kv, k_r = torch.randn(1, L, r), torch.randn(1, L, rho)
    w_uk, w_uv = torch.randn(H, D, r), torch.randn(H, D, r)
    core = latent.latent_attention_absorbed if absorbed else latent.latent_attention_naive
    with FlopCounterMode(display=False, custom_mapping={torch.ops.aten.baddbmm_: baddbmm_flops}) as counter:
        core(q_c, q_r, c_kv, k_r, w_uk, w_uv, causal=True, q_offset=L - 1)
    assert counter.get_total_flops() == latent.step_flops(H, D, r, rho, L, absorbed)


def test_deepseek_sizes_cache_576_values_where_multi_head_attention_caches_32768():
    sizes = latent.deepseek_proportions(128, 128)
    assert (sizes["kv_rank"], sizes["rope_dim"]) == (512, 64)
    assert {k: sizes[k] for k in latent.DEEPSEEK} == latent.DEEPSEEK
    assert latent.cache_elements(sizes["kv_rank"], sizes["rope_dim"]) == 576
    assert latent.mha_cache_elements(128, 128) == 32768
    small = ac.MultiLatentAttention(64, **latent.deepseek_proportions(2, 8))
    assert (small.kv_rank, small.rope_dim, small.q_rank) == (32, 4, 96)
    with pytest.raises(ValueError, match="multiple of 4"):
        latent.deepseek_proportions(2, 6)


@pytest.mark.parametrize("absorbed", [False, True])
def test_gradients_flow_in_both_forms(absorbed):
    layer = make(9, q_rank=8, absorbed=absorbed, bias=True)
    x = torch.randn(2, 6, SIZES["d_model"], requires_grad=True)
    layer(x, causal=True).square().sum().backward()
    grads = {name: p.grad for name, p in layer.named_parameters()}
    if absorbed:  # b_UK adds the same score to every key of a query, which softmax cancels: no gradient reaches it
        assert grads.pop("w_uk.bias") is None
    for name, g in {**grads, "x": x.grad}.items():
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name


@pytest.mark.parametrize("kwargs, match", [
    (dict(heads=0), "heads must be a positive integer"),
    (dict(kv_rank=-3), "kv_rank must be a positive integer"),
    (dict(head_dim=2.5), "head_dim must be a positive integer"),
    (dict(d_model=True), "d_model must be a positive integer"),
    (dict(q_rank=0), "q_rank must be a positive integer"),
    (dict(rope_dim=5), "rope_dim 5 must be even"),
    (dict(rope_dim=0), "rope_dim must be a positive integer"),
    (dict(base=float("nan")), "base must be"),
])
def test_bad_constructor_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ac.MultiLatentAttention(**{**SIZES, **kwargs})


def test_bad_inputs_are_refused_with_a_sentence():
    layer = make(10)
    d = SIZES["d_model"]
    bad = {
        "dtype torch.float64": torch.randn(1, 3, d, dtype=torch.float64),
        "dtype torch.int64": torch.ones(1, 3, d, dtype=torch.long),
        "must be a torch tensor": [[0.0] * d],
        r"must be \(batch, tokens, 24\)": torch.randn(3, d),
        r"must be \(batch, tokens, 24\), got \(1, 3, 25\)": torch.randn(1, 3, d + 1),
        "1 NaN": torch.randn(1, 3, d).index_put_((torch.tensor([0]), torch.tensor([1]), torch.tensor([2])),
                                                 torch.tensor(float("nan"))),
        "infinite": torch.full((1, 3, d), float("inf")),
        "no tokens": torch.randn(1, 0, d),
    }
    for match, x in bad.items():
        with pytest.raises(ValueError, match=match):
            layer(x)
    with pytest.raises(ValueError, match="causal must be True or False"):
        layer(torch.randn(1, 3, d), causal="yes")
    with pytest.raises(ValueError, match="cannot hold the prompt of 3 tokens"):
        layer.prefill(torch.randn(1, 3, d), max_len=2)
    with torch.device("meta"):
        ghost = ac.MultiLatentAttention(**SIZES)
    with pytest.raises(ValueError, match="meta device"):
        ghost(torch.randn(1, 3, d))


def test_bad_steps_are_refused_with_a_sentence():
    layer = make(11)
    d = SIZES["d_model"]
    _, cache = layer.prefill(torch.randn(2, 3, d))
    with pytest.raises(ValueError, match="LatentCache that prefill returned"):
        layer.step(torch.randn(2, 1, d), (cache.c_kv, cache.k_r))
    with pytest.raises(ValueError, match=r"one new token per sequence, \(2, 1, 24\)"):
        layer.step(torch.randn(2, 2, d), cache)
    with pytest.raises(ValueError, match=r"one new token per sequence"):
        layer.step(torch.randn(3, 1, d), cache)
    other = ac.MultiLatentAttention(**{**SIZES, "kv_rank": 12})
    with pytest.raises(ValueError, match="step it with the layer that prefilled it"):
        other.step(torch.randn(2, 1, d), cache)
    assert cache.length == 3  # nothing refused was written


@pytest.mark.parametrize("core", [latent.latent_attention_naive, latent.latent_attention_absorbed])
def test_queries_at_an_offset_see_what_the_same_rows_of_a_causal_call_see(core):
    torch.manual_seed(12)
    H, D, r, rho, N = 2, 4, 6, 2, 7
    q_c, q_r = torch.randn(2, H, N, D), torch.randn(2, H, N, rho)
    kv = (torch.randn(2, N, r), torch.randn(2, N, rho), torch.randn(H, D, r), torch.randn(H, D, r))
    full = core(q_c, q_r, *kv, causal=True)
    for first, last in ((0, 3), (2, 4), (4, 7), (6, 7)):  # a chunk of queries against the keys up to its last
        keys = (kv[0][:, :last], kv[1][:, :last], *kv[2:])
        part = core(q_c[:, :, first:last], q_r[:, :, first:last], *keys, causal=True, q_offset=first)
        torch.testing.assert_close(part, full[:, :, first:last], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(core(q_c, q_r, *kv), full)  # causal or not makes a difference


def test_the_core_functions_refuse_shapes_that_do_not_fit():
    H, D, r, rho = 2, 4, 6, 2
    args = [torch.randn(1, H, 3, D), torch.randn(1, H, 3, rho), torch.randn(1, 5, r), torch.randn(1, 5, rho),
            torch.randn(H, D, r), torch.randn(H, D, r)]
    for core in (latent.latent_attention_naive, latent.latent_attention_absorbed):
        assert core(*args, causal=True, q_offset=2).shape == (1, H, 3, D)
        wrong = list(args)
        wrong[4] = torch.randn(H, D + 1, r)
        with pytest.raises(ValueError, match=r"w_uk has shape \(2, 5, 6\).*\(2, 4, 6\)"):
            core(*wrong)
        with pytest.raises(ValueError, match="q_offset"):
            core(*args, q_offset=-1)
