"""Theory at scale: FLOPs and memory from the specs, budgets, extrapolated time, the big-O table."""
from __future__ import annotations

import math

import pytest

import attn_core as ac
from attn_core.insight import theory
from tests.baselines import plain_causal


def test_softmax_costs_by_hand():
    # B=2, H=4, n=1000, D=64, float16: 4·B·H·n²·D FLOPs, scores + probabilities 2·B·H·n²·2 bytes.
    row = theory.costs(["softmax"], [1000], d_model=256, heads=4, batch=2, dtype="float16").iloc[0]
    assert row["flops"] == 4 * 8 * 1000**2 * 64
    assert row["memory_bytes"] == 2 * 8 * 1000**2 * 2
    assert row["input_bytes"] == 3 * 8 * 1000 * 64 * 2
    assert row["total_bytes"] == row["memory_bytes"] + row["input_bytes"]
    assert math.isnan(row["predicted_time_s"]) and row["status"] == "ok"


def test_backward_counts_three_forwards_and_time_is_flops_over_throughput():
    fwd = theory.costs(["sdpa"], [4096], gflops=100.0).iloc[0]
    both = theory.costs(["sdpa"], [4096], mode="forward+backward", gflops=100.0).iloc[0]
    assert both["flops"] == 3 * fwd["flops"]
    assert fwd["predicted_time_s"] == pytest.approx(fwd["flops"] / 100e9)
    with pytest.raises(ValueError, match="mode must be one of"):
        theory.costs(["sdpa"], [16], mode="backward")


def test_a_million_tokens_for_every_mechanism():
    settings = dict(d_model=4096, heads=32, batch=4, dtype="bfloat16")
    frame = theory.costs(list(ac.MECHANISMS), [1 << 20], **settings)
    only = frame["mechanism"].map(lambda key: plain_causal(ac.get(key)))  # refused without a causal mask, saying so
    assert (frame.loc[~only, "status"] == "ok").all() and frame.loc[only, "reason"].str.contains("causal only").all()
    frame = theory.costs(list(ac.MECHANISMS), [1 << 20], causal=True, **settings).where(only, frame)
    assert (frame["status"] == "ok").all()
    assert frame[["flops", "memory_bytes"]].map(math.isfinite).all().all()
    by = frame.set_index("mechanism")
    # The materialized n×n matrix dwarfs every linear-memory mechanism at this length.
    assert by.loc["softmax", "memory_bytes"] > 1000 * by.loc["sliding_window", "memory_bytes"]


def test_settings_a_mechanism_cannot_take_are_rows_with_a_sentence():
    frame = theory.costs(["linformer"], [128, 1024], params={"linformer": {"rank": 256}})
    assert frame["status"].tolist() == ["invalid", "ok"]
    assert "choose rank ≤ 128" in frame["reason"].iloc[0] and math.isnan(frame["flops"].iloc[0])
    with pytest.raises(ValueError, match="not divisible by 6 heads"):
        theory.costs(["softmax"], [128], d_model=500, heads=6)


def test_largest_n_is_the_edge_of_the_budget():
    settings = dict(d_model=512, heads=8, batch=1, dtype="float32")
    n = theory.largest_n("softmax", 8 * theory.GIB, **settings)

    def total(m):
        return theory.costs(["softmax"], [m], **settings)["total_bytes"].iloc[0]

    assert total(n) <= 8 * theory.GIB < total(n + 1)
    # By hand: 2·8·n²·4 + 3·8·n·64·4 ≤ 8·2³⁰, i.e. n² + 96·n ≤ 2²⁷, gives n = ⌊(−96 + √(96² + 2²⁹))/2⌋ = 11 537.
    assert n == 11537
    assert theory.largest_n("sdpa", 1e30, **settings) == 1 << 24  # capped at n_max
    assert theory.largest_n("softmax", 10, **settings) == 0
    assert theory.largest_n("linformer", 80 * theory.GIB, causal=True, **settings) == 0  # never valid


MIB = 1 << 20
FIT = dict(B=1, H=8, D=64)  # largest_n's default settings: d_model 512 over 8 heads, float32


def spec_fits(key: str, n: int, budget: float) -> bool:
    """The reference, from the spec alone: its check passes at n and its predicted peak plus q, k, v (3·B·H·n·D
    numbers of 4 bytes) is within the budget."""
    spec = ac.get(key)
    shape = ac.Shape(FIT["B"], FIT["H"], n, n, FIT["D"], causal=plain_causal(spec))
    defaults = {p.name: p.default for p in spec.params}
    try:
        spec.check(shape, defaults)
    except ValueError:
        return False
    return spec.cost.memory_bytes(shape, **defaults) + 3 * FIT["B"] * FIT["H"] * n * FIT["D"] * 4 <= budget


@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_largest_n_is_a_scan_of_every_length_on_a_small_budget(key):
    # Past budget / (q, k, v bytes a token) the inputs alone do not fit: every shorter n is scanned.
    budget = 64 * MIB
    bound = budget // (3 * FIT["H"] * FIT["D"] * 4)
    fitting = [n for n in range(1, bound + 1) if spec_fits(key, n, budget)]
    assert fitting, key
    assert theory.largest_n(key, budget, causal=plain_causal(ac.get(key))) == max(fitting)


@pytest.mark.parametrize("budget", [1 << 30, 16 << 30, 80 << 30], ids=["1GiB", "16GiB", "80GiB"])
@pytest.mark.parametrize("key", list(ac.MECHANISMS))
def test_largest_n_is_the_edge_of_the_spec_for_every_mechanism(key, budget):
    n = theory.largest_n(key, budget, causal=plain_causal(ac.get(key)))
    assert n > 0 and spec_fits(key, n, budget) and not spec_fits(key, n + 1, budget)
    # Nothing longer fits either, in a window above it and at each doubling up to the inputs' own bound.
    bound = budget // (3 * FIT["H"] * FIT["D"] * 4)
    longer = [*range(n + 1, n + 4097), *(n << k for k in range(1, 12) if n << k <= bound)]
    assert not any(spec_fits(key, m, budget) for m in longer)


def test_nystrom_fits_where_its_landmarks_do():
    # 64 landmarks need n ≥ 64: the search starts there, not at n = 1, which the spec refuses.
    assert not spec_fits("nystrom", 1, 16 << 30) and spec_fits("nystrom", 4096, 16 << 30)
    assert theory.largest_n("nystrom", 16 << 30) > 4096
    # 1,000 landmarks: the shortest n is 1,000, found by doubling and halving back, not by a list of guesses.
    n = theory.largest_n("nystrom", 1 << 30, params={"landmarks": 1000})
    assert n >= 1000 and theory.largest_n("nystrom", 1 << 30, params={"landmarks": 1000}, n_max=1000) == 1000
    assert theory.largest_n("nystrom", 1 << 16) == 0  # at its shortest n, 64, its inputs alone are 384 KiB


def test_fit_table_and_budgets():
    named = theory.budgets(this_device_bytes=16 * theory.GIB, custom_bytes=1e9)
    assert list(named) == ["this device", "24 GB GPU", "80 GB GPU", "custom"]
    assert list(theory.budgets()) == ["24 GB GPU", "80 GB GPU"]
    table = theory.fit_table(["softmax", "sdpa"], named, d_model=256, heads=4)
    assert len(table) == 8
    fits = table.pivot(index="mechanism", columns="budget", values="largest_n")
    assert (fits.loc["sdpa"] > fits.loc["softmax"]).all()
    assert fits.loc["softmax", "80 GB GPU"] > fits.loc["softmax", "24 GB GPU"]


def test_log_ns():
    assert theory.log_ns(1024, 8192) == [1024, 2048, 4096, 8192]
    assert theory.log_ns(1024, 4096, per_octave=2) == [1024, 1448, 2048, 2896, 4096]
    with pytest.raises(ValueError, match="n_min"):
        theory.log_ns(10, 5)


def test_big_o_table_covers_the_registry():
    table = theory.big_o_table()
    assert table["mechanism"].tolist() == list(ac.MECHANISMS)
    row = table.set_index("mechanism").loc["softmax"]
    assert (row["time"], row["memory"]) == (ac.get("softmax").cost.time_big_o, ac.get("softmax").cost.memory_big_o)
    assert "arXiv" in row["paper"]
    shared = table.set_index("mechanism")["shared key/value heads"]
    assert shared["sliding_window"] == "yes, read in place" and shared["reformer"] == "no"


# ---- generation: a whole model's cache ----

MODEL = dict(layers=32, heads=32, head_dim=128, batch=1, dtype="float16")  # a 7B-class model's attention


def test_a_whole_models_key_value_cache_by_hand():
    # K and V: 2 × 32 layers × 32 heads × 4096 tokens × 128 dims × 2 bytes = 2 GiB
    assert theory.model_cache_bytes("softmax", 4096, **MODEL) == 2 * 32 * 32 * 4096 * 128 * 2 == 2 * theory.GIB
    assert theory.model_cache_bytes("softmax", 4096, **{**MODEL, "batch": 4}) == 8 * theory.GIB
    window = theory.model_cache_bytes("sliding_window", 1 << 20, **MODEL, params={"window": 1024})
    assert window == 2 * 32 * 32 * 1025 * 128 * 2  # the last w + 1 tokens, whatever the context
    assert theory.model_cache_bytes("linear", 1 << 20, **MODEL) == theory.model_cache_bytes("linear", 16, **MODEL)


def test_the_longest_context_is_the_edge_of_the_budget():
    n = theory.longest_context("softmax", 24 * theory.GIB, **MODEL)
    assert n == 49152  # 512 KiB a token
    assert theory.model_cache_bytes("softmax", n, **MODEL) <= 24 * theory.GIB
    assert theory.model_cache_bytes("softmax", n + 1, **MODEL) > 24 * theory.GIB
    assert theory.longest_context("linear", 24 * theory.GIB, **MODEL) is None  # a fixed state fits at any length
    assert theory.longest_context("softmax", 1000.0, **MODEL) == 0


def test_generation_costs_predict_tokens_per_second_from_the_bandwidth():
    frame = theory.generation_costs(["softmax", "linear", "linformer"], [1024, 1 << 20], bandwidth=1e12, **MODEL)
    assert set(frame["mechanism"]) == {"softmax", "linear"}  # Linformer cannot generate: no row
    soft = frame[frame["mechanism"] == "softmax"].set_index("n")
    assert soft.loc[1 << 20, "time_per_token_s"] == pytest.approx(soft.loc[1 << 20, "cache_bytes"] / 1e12)
    assert soft.loc[1024, "tokens_per_s"] == pytest.approx(1024 * soft.loc[1 << 20, "tokens_per_s"])
    assert theory.generation_costs(["softmax"], [1024], **MODEL)["tokens_per_s"].isna().all()
    assert theory.cannot_generate(["softmax", "linformer"])[0].startswith("Linformer: Its projections")


@pytest.mark.parametrize("change, sentence", [({"heads": 0}, "heads must be a whole number of at least 1"),
                                              ({"layers": 1.5}, "layers must be a whole number of at least 1")])
def test_a_model_it_cannot_size_is_refused_with_a_sentence(change, sentence):
    with pytest.raises(ValueError, match=sentence):
        theory.model_cache_bytes("softmax", 1024, **{**MODEL, **change})
    with pytest.raises(ValueError, match="Reformer .*cannot generate token by token"):
        theory.model_cache_bytes("reformer", 1024, **MODEL)


@pytest.fixture
def env(monkeypatch):
    """The engine's environment measuring bandwidth from copies of 8 MiB, its cache kept apart for the test: what
    is asserted (a finite positive rate, cached, and its flag) does not hang on the size, and the 256 MiB copies
    (past any cache) take seconds on a busy machine."""
    from attn_core.engine import env
    monkeypatch.setattr(env, "BANDWIDTH_BYTES", 8 << 20)
    monkeypatch.setattr(env, "_BANDWIDTH_CACHE", {})
    return env


def test_the_measured_memory_bandwidth_is_a_positive_rate(env):
    rate = env.memory_bandwidth("cpu")
    assert math.isfinite(rate) and rate > 0 and env.memory_bandwidth("cpu") == rate  # cached


def test_a_bandwidth_taken_while_other_programs_took_the_cpu_is_flagged(env, monkeypatch):
    assert env.measure_bandwidth("cpu")[0] > 0
    monkeypatch.setattr(env.Contention, "disturbed", lambda self, threads: True)
    rate, disturbed = env.measure_bandwidth("cpu")
    assert disturbed and math.isfinite(rate) and rate > 0


def test_the_whole_model_cache_follows_the_key_value_heads_and_latent_attention_caches_its_latent():
    llama = dict(layers=32, heads=32, head_dim=128, batch=1)  # Llama 3 8B: 8 key/value heads for 32 query heads
    mha = theory.model_cache_bytes("sdpa", 4096, **llama)
    assert theory.model_cache_bytes("sdpa", 4096, **llama, kv_heads=8) * 4 == mha
    assert theory.model_cache_bytes("sdpa", 4096, **llama, kv_heads=1) * 32 == mha
    with pytest.raises(ValueError, match="3 key/value heads do not divide the 32 query heads"):
        theory.model_cache_bytes("sdpa", 4096, **llama, kv_heads=3)
    # DeepSeek-V3's proportions: 512 + 64 values a token and layer where 128 heads × 128 cache 2 · 128 · 128
    deepseek = theory.latent_costs([4096], layers=61, heads=128, head_dim=128, dtype="bfloat16")
    assert deepseek["cache_bytes"].iloc[0] == 61 * 4096 * 576 * 2
    assert theory.model_cache_bytes("sdpa", 4096, layers=61, heads=128, head_dim=128, dtype="bfloat16") == \
        61 * 4096 * 32768 * 2
    assert theory.latent_costs([4096], layers=1, heads=8, head_dim=30).empty  # rope_dim 15 is no even integer
    row = theory.latent_context({"1 GiB": theory.GIB}, layers=1, heads=8, head_dim=64, dtype="float32")
    assert row["1 GiB"] == f"{theory.GIB // (288 * 4):,} tokens"


def test_the_schemes_table_takes_key_value_heads_and_layers():
    from attn_core.studies import parallel as D

    # Llama 3 8B's attention at 1M tokens over 8 devices, bf16: K and V of 8 heads, q and the output of 32
    got = D.schemes_table(1 << 20, 32, 128, 8, kv_heads=8, layers=32).set_index("scheme")
    block = (1 << 20) // 8 * 128 * 2  # one head's n/P positions, bytes
    assert got.loc["ring", "bytes_sent_per_layer"] == 2 * 7 * 8 * block
    assert got.loc["ulysses", "bytes_sent_per_layer"] == 7 * (2 * 32 + 2 * 8) // 8 * block
    assert got.loc["ring", "memory_per_device_bytes"] == (2 * 32 + 4 * 8) * block
    assert got.loc["ring", "bytes_sent_all_layers"] == 32 * 2 * 7 * 8 * block
    assert got.loc["state", "bytes_sent_per_layer"] == 32 * (128 * 128 + 128) * 4  # a state a query head
    refused = D.schemes_table(4096, 16, 256, 8, kv_heads=2).set_index("scheme")
    assert refused.loc["ulysses", "reason"] == "2 key/value heads do not divide among 8 devices"


def test_the_across_devices_tab_takes_a_planner_models_shape():
    from streamlit.testing.v1 import AppTest, app_test

    from tests.dashboard.test_app import APP, Routed, widget

    def ring_row(at):
        tables = [t.value for t in at.dataframe if "bytes_sent_per_layer" in t.value.columns]
        assert len(tables) == 1
        return tables[0].set_index("scheme").loc["ring"]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(app_test, "PagesManager", Routed)
        at = AppTest.from_file(APP, default_timeout=120).run()
        at.switch_page("pages/theory.py").run()
        n, procs = 1 << 20, 8  # the tab's defaults: the longest n of the settings, 8 devices
        own = ring_row(at)  # the page's settings: 16 heads of 1024 / 16 = 64, float32, one layer
        assert own["bytes_sent_per_layer"] == 2 * 7 * 16 * (n // procs) * 64 * 4 and own["layers"] == 1
        assert widget(at, "th_sp_model").value == ""
        widget(at, "th_sp_model").set_value("Llama-3-8B").run()
        llama = ring_row(at)  # 32 layers, 32 query heads, 8 key/value heads of 128, bfloat16 (its config.json)
        assert llama["bytes_sent_per_layer"] == 2 * 7 * 8 * (n // procs) * 128 * 2
        assert llama["layers"] == 32 and llama["bytes_sent_all_layers"] == 32 * llama["bytes_sent_per_layer"]
        assert any(c.value.startswith("Llama-3-8B: 32 attention layers of 32 query heads, 8 key/value heads of 128")
                   for c in at.caption)
        widget(at, "th_sp_model").set_value("Qwen3-Next-80B-A3B").run()
        qwen = ring_row(at)  # its 12 gated attention layers: 16 query heads, 2 key/value heads of 256
        assert qwen["layers"] == 12 and qwen["bytes_sent_per_layer"] == 2 * 7 * 2 * (n // procs) * 256 * 2
    assert not at.exception, [e.value for e in at.exception]


def test_step_reads_count_nsa_decode_tokens_by_branch_and_leave_out_whole_cache_reads():
    table = theory.step_reads(["softmax", "linear", "nsa"], params={"nsa": {"window": 256}})
    assert table["mechanism"].tolist() == ["NSA"] * 4  # softmax reads its whole cache; linear, its state
    # n = 8192, window 256: ⌊(8192 − 32)/16⌋ + 1 = 511 compressed, 16 blocks of 64 selected, 256 in the window
    first = table.iloc[0]
    assert (first["context"], first["tokens_read"]) == (8192, 511 + 1024 + 256)
    assert first["branches"] == "compressed 511 + selected 1,024 + window 256"
    assert first["of_context"] == (511 + 1024 + 256) / 8192
    assert theory.step_reads(["nsa"])["tokens_read"].tolist() == [2047, 2559, 3583, 5631]
    assert theory.step_reads(["softmax"]).empty
