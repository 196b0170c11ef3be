"""Theory: FLOPs, memory and what fits, from the specs alone, up to a million tokens; time as an extrapolation."""
import pandas as pd
import streamlit as st

from attn_core import MECHANISMS
from attn_core.studies import parallel as distributed
from attn_core.studies.planner import model as planner, roofline
from attn_core.spec import DTYPE_BYTES
from attn_core.engine import env, positions
from attn_core.insight import charts as insight_charts
from attn_core.insight import theory
from pages._shared import ALL_HEADS, KV_HELP, ensure_routed, export_row, keyed, kv_choices, kv_text, label, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

NS = [2**k for k in range(7, 21)]
# The default selection tells one story: quadratic (softmax), windowed, linear; every other mechanism is one click away.
STORY = ["softmax", "sliding_window", "linear"]
GIB = theory.GIB


@st.cache_data(show_spinner="Measuring this device's matmul throughput…")
def measured_gflops(device: str, dtype: str) -> float:
    return env.matmul_gflops(device, dtype)


@st.cache_data(show_spinner="Measuring this device's memory bandwidth…")
def measured_bandwidth(device: str) -> tuple[float, bool]:
    return env.memory_bandwidth(device), env.bandwidth_disturbed(device)


def key_value_heads(column, heads: int, key: str, default: int | None = None) -> int | None:
    """A selector of the key/value heads `heads` query heads can share (MHA, GQA-g, MQA); None: one each."""
    shares = kv_choices(heads)
    if key not in st.session_state and default in shares:
        st.session_state[key] = default
    if st.session_state.get(key) not in shares:
        st.session_state[key] = ALL_HEADS  # the heads changed under a count that no longer divides them
    return column.selectbox("Key/value heads", shares, format_func=kv_text, help=KV_HELP, **keyed(key)) or None


st.title("Theory")
st.caption("Costs from each mechanism's spec: nothing is run, so n can be a million tokens. Memory is the forward "
           "call's predicted peak above its inputs, plus the inputs.")
device = env.resolve_device("auto")
with st.expander("Settings", icon=":material/tune:"):  # folded: the chart first in view
    keys = st.multiselect("Mechanisms", list(MECHANISMS), STORY, format_func=label,  # whole names
                          help="Three to start: softmax's n², a window's and linear attention's n. Add any other.",
                          **keyed("th_mechanisms"))
    left, mid, right = st.columns(3)
    n_min, n_max = left.select_slider("Sequence lengths n", NS, (1024, 1 << 20), format_func="{:,}".format,
                                      **keyed("th_n"))
    d_model = mid.number_input("d_model", 1, 65536, 1024, step=64, **keyed("th_d_model"))
    heads = mid.number_input("Heads", 1, 512, 16, **keyed("th_heads"))
    kv_heads = key_value_heads(mid, int(heads), "th_kv_share")
    batch = mid.number_input("Batch", 1, 4096, 1, **keyed("th_batch"))
    dtype = right.selectbox("dtype", ["float32", "bfloat16", "float16", "float64"], **keyed("th_dtype"))
    causal = right.toggle("Causal mask", **keyed("th_causal"))
    where = right.selectbox("Positions", positions.POSITIONS, format_func=positions.NAMES.get,
                            help="What RoPE (q and k turned in the call) or ALiBi (a score bias) adds to each "
                                 "mechanism's FLOPs and memory; the Benchmark page measures it",
                            **keyed("th_positions"))
    mode = right.radio("FLOPs of", list(theory.MODES), horizontal=True, **keyed("th_mode"),
                       help="Forward + backward counts 3× the forward FLOPs; memory stays the forward call's.")
    budget_gib = right.number_input("Custom memory budget (GiB, 0 = none)", 0.0, 1e6, 0.0, **keyed("th_budget"))
    source = right.radio("Throughput for predicted time", ["this device (measured)", "a figure I type"],
                         **keyed("th_source"))
    typed = right.number_input("Matmul throughput (GFLOP/s)", 0.0, 1e7, 1000.0, **keyed("th_gflops"),
                               disabled=source != "a figure I type")
params = {}
with st.expander("Mechanism parameters", icon=":material/settings:"):
    for key in keys:
        for column, p in zip(st.columns(4), MECHANISMS[key].params):
            params.setdefault(key, {})[p.name] = column.number_input(
                f"{label(key)}: {p.name}", p.low, p.high, p.default, help=p.help, **keyed(f"th_{key}_{p.name}"))

problems = []
if not keys:
    problems.append("Choose at least one mechanism.")
if d_model % heads:
    problems.append(f"d_model {d_model} is not divisible by {heads} heads; choose a multiple of {heads}")
if source == "a figure I type" and typed <= 0:
    problems.append("Type a matmul throughput above 0 GFLOP/s, or use this device's measured figure.")
for problem in problems:
    st.error(problem, icon=":material/edit:")
if problems:
    st.stop()

gflops = measured_gflops(device, dtype) if source.startswith("this device") else typed
settings = dict(d_model=int(d_model), heads=int(heads), kv_heads=kv_heads, batch=int(batch), dtype=dtype,
                causal=causal, positions=where)
refused = {key: why for key in keys if (why := positions.spec_problem(MECHANISMS[key], where, generating=False,
                                                                     head_dim=int(d_model) // int(heads)))}
if refused:  # one line for them all: with ALiBi most mechanisms are refused
    why = (f"They take no additive score bias; ALiBi needs one ({', '.join(positions.biased())})" if where == "alibi"
           else next(iter(refused.values())))
    st.warning(f"Not drawn with {positions.NAMES[where]}: {', '.join(label(k) for k in refused)}. {why}.",
               icon=":material/info:")
    keys = [key for key in keys if key not in refused]
    if not keys:
        st.stop()
frame = theory.costs(keys, theory.log_ns(n_min, n_max), mode=mode, params=params, gflops=gflops, **settings)
budgets = theory.budgets(env.device_info(device)["total_memory_bytes"], budget_gib * GIB)
for reason in sorted(set(frame.loc[frame["status"] != "ok", "reason"])):
    st.warning(f"Not drawn where it applies: {reason}", icon=":material/info:")
for note in filter(None, (positions.note(MECHANISMS[key], where) for key in keys)):
    st.caption(note)

flops_tab, memory_tab, time_tab, fit_tab, generation_tab, devices_tab, big_o_tab = st.tabs(
    ["FLOPs", "Memory", "Time (extrapolated)", "What fits", "Generation: the cache", "Across devices", "Big-O"])
with flops_tab:
    chart = insight_charts.theory_chart(frame, "flops")
    show_chart(chart)
    export_row(chart, frame, "theory-flops", "th_dl_theory-flops")
with memory_tab:
    chart = insight_charts.theory_chart(frame, "total_bytes", budgets=budgets)
    show_chart(chart)
    export_row(chart, frame, "theory-memory", "th_dl_theory-memory")
with time_tab:
    where = f"{env.device_info(device)['name']} ({device}, {dtype})" if source.startswith("this") else "typed"
    st.warning(f"An extrapolation, not a measurement: FLOPs ÷ {gflops:,.0f} GFLOP/s ({where} matmul throughput). "
               "Real kernels reach a fraction of it, less for small or irregular work.", icon=":material/warning:")
    chart = insight_charts.theory_chart(frame, "predicted_time_s")
    show_chart(chart)
    export_row(chart, frame, "theory-time", "th_dl_theory-time")
with fit_tab:
    table = theory.fit_table(keys, budgets, params=params, **settings)
    chart = insight_charts.fit_chart(table)
    show_chart(chart)
    export_row(chart, table, "theory-fit", "th_dl_theory-fit")
    st.dataframe(table.pivot(index="label", columns="budget", values="largest_n")
                 .reindex(index=[label(k) for k in keys], columns=list(budgets)))
with generation_tab:
    st.caption("What a whole model's attention remembers while it generates, layer by layer: softmax's key-value "
               "cache grows with the context; a window's and a fixed-size state's do not. Key and value heads shared "
               "by groups of query heads shrink every cache by the same factor. The defaults are Llama 3 8B's (32 "
               "layers, 32 query heads, 8 key/value heads of 128: its config.json).")
    a, b, c, e = st.columns(4)
    model_heads = int(b.number_input("Query heads", 1, 512, 32, **keyed("th_model_heads")))
    model = dict(layers=int(a.number_input("Layers", 1, 1024, 32, **keyed("th_layers"))), heads=model_heads,
                 kv_heads=key_value_heads(b, model_heads, "th_model_kv", default=8),
                 head_dim=int(c.number_input("Head dim", 1, 4096, 128, **keyed("th_head_dim"))),
                 batch=int(batch), dtype=e.selectbox("Cache dtype", ["float16", "bfloat16", "float32"],
                                                     **keyed("th_cache_dtype")))
    latent_line = st.toggle("Add multi-head latent attention (MLA) at DeepSeek's proportions", True,
                            help="A latent of 4 × head dim and a shared rotary key of head dim / 2 per token and "
                                 "layer, whatever the heads (DeepSeek-V2, arXiv 2405.04434; V3 caches 512 + 64 = "
                                 "576 values a token and layer where multi-head attention of its 128 heads × 128 "
                                 "would cache 32,768). Needs a head dim that is a multiple of 4.",
                            **keyed("th_latent"))
    for why in theory.cannot_generate(keys):
        st.caption(f"Not drawn: {why}")
    bandwidth, busy = measured_bandwidth(device)
    ns = theory.log_ns(n_min, n_max)
    cache = theory.generation_costs(keys, ns, params=params, bandwidth=bandwidth, **model)
    latent_rows = theory.latent_costs(ns, bandwidth=bandwidth, **model) if latent_line else cache.iloc[:0]
    cache = pd.concat([cache, latent_rows], ignore_index=True) if len(latent_rows) else cache
    chart = insight_charts.theory_chart(cache, "cache_bytes", budgets=budgets)
    show_chart(chart)
    export_row(chart, cache, "theory-cache", "th_dl_theory-cache")
    st.markdown("**The longest context whose cache fits** (the weights and activations need room too)")
    contexts = theory.context_table(keys, budgets, params=params, **model)
    if len(latent_rows):
        contexts = pd.concat([contexts, pd.DataFrame([theory.latent_context(budgets, **model)])], ignore_index=True)
    st.dataframe(contexts, hide_index=True)
    busy = (" Other programs took CPU from every copy it was measured with: the figure is likely low, and so is the "
            "prediction." if busy else "")
    st.warning(f"Tokens per second below: {theory.DECODE_EXTRAPOLATION} ({bandwidth / 1e9:,.0f} GB/s, "
               f"{env.device_info(device)['name']}: the best of 5 copies of a 256 MiB buffer).{busy}",
               icon=":material/warning:")
    chart = insight_charts.theory_chart(cache, "tokens_per_s")
    show_chart(chart)
    export_row(chart, cache, "theory-tokens", "th_dl_theory-tokens")
    ref = roofline.roofline(planner.find("llama-3-8b"), "H100 SXM", 8192)  # Plan a model's one roofline
    st.caption(f"Why Plan a model states fewer tokens a second: these are the memory term of its roofline "
               f"(roofline.py) with the weights and the FLOPs left out, batch ÷ (cache bytes ÷ bandwidth). It adds the "
               f"weights read every step and takes the slower of bytes and FLOPs: Llama 3 8B at 8,192 tokens on an "
               f"{ref.device}, {ref.decode_tokens_per_s:,.1f} tokens/s there, against "
               f"{ref.bandwidth_bytes_per_s / ref.cache_bytes:,.0f} from its cache alone.")
    reads = theory.step_reads(keys, params=params)
    if len(reads):
        st.markdown("**Tokens one decode step reads, against the context** (the rest of the cache stays unread; the "
                    "tokens per second above assume a step reads all of it)")
        st.dataframe(reads, hide_index=True, column_config={
            "context": st.column_config.NumberColumn("context n", format="localized"),
            "tokens_read": st.column_config.NumberColumn("tokens a step reads", format="localized"),
            "of_context": st.column_config.NumberColumn("of the context", format="percent")})
        for key in keys:
            if (form := MECHANISMS[key].supports.generation) is not None and form.step_tokens_note:
                st.caption(f"{label(key)}: {form.step_tokens_note}")
with devices_tab:
    st.caption("One causal attention layer split over P devices (and its bytes over all of a planner model's "
               "attention layers when one is chosen), from attn_core.studies.parallel.cost's model (the "
               "bytes it predicts are the bytes its runs count): ring attention (arXiv 2310.01889), DeepSpeed-Ulysses "
               "(arXiv 2309.14509) and state passing. Measure a small run here with `python -m attn_core "
               "distributed --scheme ring --procs 2 --n 4096 --causal`.")
    a, b, c, e = st.columns(4)
    sp_n = a.select_slider("Context n", NS, n_max, format_func="{:,}".format, **keyed("th_sp_n"))
    procs = b.number_input("Devices P", 2, 1024, 8, **keyed("th_sp_procs"))
    link = c.selectbox("Link", list(distributed.LINKS), index=1, **keyed("th_sp_link"))
    sp_model = e.selectbox("Shape of", [""] + [m.name for m in planner.MODELS.values()],
                           format_func=lambda name: name or "the settings above (one layer)",
                           help="A built-in model of the planner: its attention layers' query and key/value heads, "
                                "head dim, count and dtype", **keyed("th_sp_model"))
    link_rate, link_source = distributed.LINKS[link]
    if sp_model:
        chosen = planner.find(sp_model)
        shape, sp_dtype = distributed.attention_shape(chosen), chosen.dtype
        st.caption(f"{chosen.name}: {shape['layers']} attention layers of {shape['heads']} query heads, "
                   f"{shape['kv_heads'] or shape['heads']} key/value heads of {shape['head_dim']}, {sp_dtype} "
                   f"({chosen.source}).")
    else:
        shape, sp_dtype = dict(heads=int(heads), kv_heads=kv_heads, head_dim=int(d_model) // int(heads)), dtype
    table = distributed.schemes_table(int(sp_n), procs=int(procs), batch=int(batch), elem=DTYPE_BYTES[sp_dtype],
                                      link_bytes_per_s=link_rate, flops_per_s=gflops * 1e9, **shape)
    st.dataframe(table, hide_index=True)
    st.caption(f"{link}: {link_rate / 1e9:,.0f} GB/s a direction ({link_source}). Compute at {gflops:,.0f} GFLOP/s "
               "a device. The ring hides its transfers behind compute when its block n/P reaches "
               "block_to_hide_transfer.")
    st.markdown("**Measured on this machine: the small case**")
    small = distributed.small_case()
    here = distributed.default_device(small[0].procs)
    st.caption(f"The three schemes of one causal layer at n = {small[0].n:,}, {small[0].heads} heads of "
               f"{small[0].head_dim}, float32, over {small[0].procs} processes ({here}), beside the cost model: bytes "
               "sent as counted at the calls and as predicted; time as measured (the slower process) and the "
               "model's compute time at this machine's matmul rate, shared by the processes. On a machine of few "
               "cores the processes share them: this shows what splitting costs, not a speed-up.")
    if st.button("Run the small case here", icon=":material/play_arrow:", key="th_sp_run"):
        with st.spinner(f"Running over {small[0].procs} processes…"):
            try:
                runs = distributed.run_tasks(small, device=here, timeout_s=30, lock_wait_s=0, memory=False)
                st.session_state["th_sp_measured"] = distributed.measured_beside_model(
                    runs, measured_gflops(here, "float32") * 1e9)
            except (ValueError, distributed.DistributedError) as e:
                st.session_state["th_sp_measured"] = f"The small case could not run: {e}"
            except Exception as e:  # noqa: BLE001 - a run that breaks says so; the page stays up
                st.session_state["th_sp_measured"] = f"The small case could not run: {type(e).__name__}: {e}"
    measured = st.session_state.get("th_sp_measured")
    if isinstance(measured, str):
        st.warning(measured, icon=":material/warning:")
    elif measured is not None:
        st.dataframe(measured, hide_index=True)
with big_o_tab:
    st.dataframe(theory.big_o_table(), hide_index=True)
