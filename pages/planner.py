"""Plan a model: what a whole model's attention holds and costs at a context length, from the specs (planner.py)."""
import streamlit as st

from attn_core import planner
from attn_core.charts import insight as insight_charts
from attn_core.engine import env
from attn_core.engine.measure import format_bytes
from attn_core.insight import theory
from attn_core.untrusted import literal
from pages._shared import ensure_routed, export_row, keyed, label, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

NS = [2**k for k in range(10, 21)]
DTYPES = ["model's own", "bfloat16", "float16", "float32"]
STATE_KINDS = ["gated_deltanet", "mamba2", "linear"]  # mechanisms whose generation keeps a fixed-size state
SHARES = [i / 8 for i in range(9)]

st.title("Plan a model")
st.caption("A model's attention as a stack of layer kinds: what it holds at a context length (keys and values, "
           "latents, recurrent states), its prefill FLOPs and what a new token reads. Predicted from each layer's "
           "spec, not measured; weights, MLPs and activations are left out.")
with st.expander("Settings", expanded=True, icon=":material/tune:"):
    left, mid, right = st.columns(3)
    name = left.selectbox("Model", list(planner.MODELS), format_func=lambda k: planner.MODELS[k].name,
                          **keyed("plan_model"))
    upload = left.file_uploader("Or a model file (JSON, as the download below writes)", type=["json"],
                                key="plan_upload")
    context = mid.select_slider("Context n (tokens)", NS, 131072, format_func="{:,}".format, **keyed("plan_n"))
    batch = int(mid.number_input("Batch (sequences held at once)", 1, 1 << 16, 1, **keyed("plan_batch")))
    dtype = right.selectbox("Cache dtype", DTYPES, **keyed("plan_dtype"))
    gpu_gib = right.number_input("A GPU's memory (GiB)", 1.0, 4096.0, 80.0, **keyed("plan_gpu"))

model = planner.MODELS[name]
if upload is not None:
    try:
        model = planner.Model.from_json(upload.getvalue()[: 1 << 20].decode("utf-8", errors="replace"))
    except ValueError as e:
        st.error(f"The file {literal(upload.name[:80])} is not a model this page can plan: {literal(e)}",
                 icon=":material/edit:")
        st.stop()
made = planner.plan(model, context, batch=batch, dtype=None if dtype == DTYPES[0] else dtype)

st.subheader(model.name)
if model.source:
    st.caption(f"Configuration: {literal(model.source)}")
here = env.device_info(env.resolve_device("auto"))["total_memory_bytes"]
a, b, c, d = st.columns(4)
a.metric("KV cache", format_bytes(made.kv_cache_bytes),
         help="The attention layers' keys and values, or their latents (MLA), for every token of the context.")
b.metric("Recurrent state", format_bytes(made.state_bytes))
c.metric("Prefill attention FLOPs", f"{made.prefill_flops:.3g}")
d.metric("A new token reads", format_bytes(made.decode_bytes))
fits = [f"{where} ({format_bytes(size)}): {'fits' if made.fits(size) else 'does not fit'}"
        for where, size in (("this machine", here), ("the GPU", gpu_gib * theory.GIB))]
st.caption(f"The cache of {made.context:,} tokens × {made.batch} in {made.dtype}, against " + "; ".join(fits)
           + ". The weights need room too.")
for note in made.notes:
    st.caption(f"Note: {literal(note)}")
st.dataframe(planner.kinds_table(made), hide_index=True,
             column_config={"bytes a layer": st.column_config.NumberColumn(format="compact"),
                            "bytes in all": st.column_config.NumberColumn(format="compact"),
                            "prefill FLOPs": st.column_config.NumberColumn(format="scientific")})
st.download_button("This model as a file (JSON)", model.to_json(), f"{name}.json", "application/json",
                   key="plan_dl_model", on_click="ignore")

st.subheader("A hybrid of it")
st.caption("Turn a share of its first kind of layer into layers with a fixed-size state, as Qwen3-Next keeps one full "
           "attention layer in four: the cache stops growing with those layers, the state costs the same at any "
           "context.")
left, right = st.columns(2)
kind = left.selectbox("Turned into", STATE_KINDS, format_func=label, **keyed("plan_hybrid_kind"))
share = right.select_slider("Share of those layers", SHARES, 0.75, format_func="{:.1%}".format,
                            **keyed("plan_hybrid_share"))
mixed = planner.hybrid(model, share, kind)
hybrid_plan = planner.plan(mixed, context, batch=batch, dtype=None if dtype == DTYPES[0] else dtype)
where = planner.crossover(mixed, model, batch=batch, dtype=None if dtype == DTYPES[0] else dtype)
a, b, c = st.columns(3)
a.metric("Hybrid: cache and state", format_bytes(hybrid_plan.total_bytes),
         f"{hybrid_plan.total_bytes / made.total_bytes - 1:+.0%}" if made.total_bytes else None, delta_color="inverse")
b.metric("Hybrid: prefill attention FLOPs", f"{hybrid_plan.prefill_flops:.3g}")
c.metric("Holds less from", "never (within 1M tokens)" if where is None else f"{where:,} tokens")

st.subheader("Cache against context, every built-in model")
models = [*planner.MODELS.values(), *([model] if upload is not None else []), *([mixed] if share else [])]
frame = planner.curves(models, NS, batch=batch, dtype=None if dtype == DTYPES[0] else dtype)
chart = insight_charts.theory_chart(frame, "cache_bytes", legend="Model",
                                    budgets={"this machine": here, "the GPU": gpu_gib * theory.GIB})
show_chart(chart)
export_row(chart, frame, "plan-cache", "plan_dl_cache")
