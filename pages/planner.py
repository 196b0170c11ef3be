"""Plan a model: what a whole model's attention holds and costs at a context length, from the specs (planner.py)."""
import dataclasses
import hashlib

import pandas as pd
import streamlit as st

from attn_core.studies.planner import model as planner, measure as planner_measure
from attn_core.insight import charts as insight_charts
from attn_core.studies.planner import chart as planner_charts
from attn_core.engine import env
from attn_core.engine.measure import format_bytes
from attn_core.insight import theory
from attn_core.mechanisms import MEASURED
from attn_core.spec import DTYPE_BYTES
from attn_core.engine.untrusted import file_stem, literal
from pages._shared import ensure_routed, export_row, keyed, label, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

NS = [2**k for k in range(10, 21)]
DTYPES = ["model's own", "bfloat16", "float16", "float32"]
STATE_KINDS = ["gated_deltanet", "kda", "mamba2", "linear"]  # mechanisms whose generation keeps a fixed-size state
SHARES = [i / 8 for i in range(9)]
NEW = "new"  # the model list's entry for a model built from scratch (planner.NEW_MODEL)
BASES = {**planner.MODELS, NEW: planner.NEW_MODEL}
KINDS = [k for k, spec in MEASURED.items() if spec.supports.generation is not None]  # what a layer can be
SIZE_HELP = {"count": "layers of this kind", "heads": "query heads", "kv_heads": "key/value heads (blank: one each)",
             "head_dim": "a head's width", "window": "tokens a query sees, itself included (sliding_window)",
             "kv_rank": "the latent's width (mla)", "rope_dim": "the shared rotary key's width (mla)",
             "state_dim": "a recurrent state's key side (Mamba-2's d_state; blank: head_dim)"}

st.title("Plan a model")
st.caption("A model's attention as a stack of layer kinds: what it holds at a context length (keys and values, "
           "latents, recurrent states), its prefill FLOPs and what a new token reads. Predicted from each layer's "
           "spec, not measured; weights, MLPs and activations are left out.")
with st.expander("Settings", expanded=True, icon=":material/tune:"):
    left, mid, right = st.columns(3)
    name = left.selectbox("Model", [*planner.MODELS, NEW], format_func=lambda k: BASES[k].name if k != NEW else
                          "A new model (build it below)", **keyed("plan_model"))
    upload = left.file_uploader("Or a model file (JSON, as the download below writes)", type=["json"],
                                key="plan_upload")
    context = mid.select_slider("Context n (tokens)", NS, 131072, format_func="{:,}".format, **keyed("plan_n"))
    batch = int(mid.number_input("Batch (sequences held at once)", 1, 1 << 16, 1, **keyed("plan_batch")))
    dtype = right.selectbox("Cache dtype", DTYPES, **keyed("plan_dtype"))
    gpu_gib = right.number_input("A GPU's memory (GiB)", 1.0, 4096.0, 80.0, **keyed("plan_gpu"))

base, slug = BASES[name], name
if upload is not None:
    text = upload.getvalue()[: 1 << 20]
    try:
        base, slug = planner.Model.from_json(text.decode("utf-8", errors="replace")), hashlib.sha1(text).hexdigest()
    except ValueError as e:
        st.error(f"The file {literal(upload.name[:80])} is not a model this page can plan: {literal(e)}",
                 icon=":material/edit:")
        st.stop()
with st.expander("Edit the model: any field, any layer kind (a row each; add or delete rows)", icon=":material/edit:"):
    left, mid, right = st.columns(3)  # keyed by the model edited: another model starts from its own fields
    title = left.text_input("Name", base.name, max_chars=planner.MAX_NAME, key=f"plan_name_{slug}")
    longest = mid.number_input("Trained context (tokens)", 1, planner.MAX_CONTEXT * 16, base.max_context,
                               key=f"plan_context_{slug}")
    own = right.selectbox("Its cache dtype", list(DTYPE_BYTES), list(DTYPE_BYTES).index(base.dtype),
                          key=f"plan_own_{slug}")
    rows = st.data_editor(
        planner.layers_frame(base), key=f"plan_layers_{slug}", num_rows="dynamic", hide_index=True,
        column_config={"mechanism": st.column_config.SelectboxColumn(options=KINDS, required=True),
                       "prefill_mechanism": st.column_config.SelectboxColumn(options=KINDS),
                       **{f: st.column_config.NumberColumn(help=h, min_value=1, step=1) for f, h in SIZE_HELP.items()}})
try:
    model = planner.from_rows(rows.to_dict("records"), name=title, dtype=own, max_context=int(longest),
                              source=base.source)
except ValueError as e:
    st.error(f"This model cannot be planned: {literal(e)}", icon=":material/edit:")
    st.stop()
if model != base:
    model = dataclasses.replace(model, source=f"edited here from {base.name}")
made = planner.plan(model, context, batch=batch, dtype=None if dtype == DTYPES[0] else dtype)

st.subheader(literal(model.name))  # a name from a file is text: never bold, a link or an image fetched
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
st.download_button("This model as a file (JSON)", model.to_json(), f"{file_stem(model.name.lower())}.json",
                   "application/json",
                   key="plan_dl_model", on_click="ignore")

st.subheader("A hybrid of it")
st.caption("Turn a share of its first kind of layer into layers with a fixed-size state, as Qwen3-Next keeps one full "
           "attention layer in four: the cache stops growing with those layers, the state costs the same at any "
           "context.")
left, right = st.columns(2)
kind = left.selectbox("Turned into", STATE_KINDS, format_func=label, **keyed("plan_hybrid_kind"))
share = right.select_slider("Share of those layers", SHARES, 0.75, format_func="{:.1%}".format,
                            **keyed("plan_hybrid_share"))
try:  # the hybrid at the share chosen, and all turned (its new kind, to time)
    mixed, turned = planner.hybrid(model, share, kind), planner.hybrid(model, 1.0, kind)
except ValueError as e:  # an edited first kind the new one cannot copy: said, and no layer turned
    st.warning(f"No hybrid of this model into {label(kind)}: {literal(e)}", icon=":material/edit:")
    mixed, turned, share = model, model, 0
share = share if mixed.layers != model.layers else 0  # a share that turns no whole layer: no hybrid to compare
hybrid_plan = planner.plan(mixed, context, batch=batch, dtype=None if dtype == DTYPES[0] else dtype)
where = planner.crossover(mixed, model, batch=batch, dtype=None if dtype == DTYPES[0] else dtype) if share else None
a, b, c = st.columns(3)  # the hybrid's figures, three to a row: no label cut short at 1280 px
a.metric("Hybrid: cache and state", format_bytes(hybrid_plan.total_bytes),
         f"{hybrid_plan.total_bytes / made.total_bytes - 1:+.0%}" if made.total_bytes else None, delta_color="inverse")
b.metric("Hybrid: prefill FLOPs", f"{hybrid_plan.prefill_flops:.3g}", help="Attention FLOPs of the whole prompt")
c.metric("Holds less from", "no layer turned" if not share else "never (within 1M tokens)" if where is None else
         f"{where:,} token{'' if where == 1 else 's'}")
d, speed, _ = st.columns(3)
d.metric("Hybrid: a new token reads", format_bytes(hybrid_plan.decode_bytes),
         f"{hybrid_plan.decode_bytes / made.decode_bytes - 1:+.0%}" if made.decode_bytes else None,
         delta_color="inverse")
measured = st.session_state.setdefault("plan_measured", {"model": None, "timings": None, "hybrid": {}, "check": None})
timings = measured["timings"] if measured["model"] == model.to_json() else None
both = measured.get("hybrid", {}).get(kind) if timings is not None else None  # the model's kinds and the new one
if both is None:
    speed.caption(f"Hybrid decode tokens/s: measure below to time this model and {label(kind)} layers.")
else:
    try:
        fast, slow = (planner_measure.predict(p, t).tokens_per_s for p, t in ((hybrid_plan, both), (made, timings)))
        speed.metric("Hybrid: predicted decode", f"{fast:.3g} tokens/s", f"{fast / slow - 1:+.0%}")
    except ValueError as e:  # a kind without points
        speed.caption(f"Hybrid decode tokens/s: {literal(e)}")

st.subheader("Cache against context, every built-in model")
yours = dataclasses.replace(model, name=f"{model.name} (yours)") if model.name.lower() in planner.MODELS else model
models = [*planner.MODELS.values(), *([yours] if model not in planner.MODELS.values() else []),
          *([mixed] if share else [])]
frame = planner.curves(models, NS, batch=batch, dtype=None if dtype == DTYPES[0] else dtype)
chart = insight_charts.theory_chart(frame, "cache_bytes", legend="Model",
                                    budgets={"this machine": here, "the GPU": gpu_gib * theory.GIB})
if share:  # the hybrid is drawn: mark where it starts to hold less than the model
    chart = planner_charts.marked(chart, where, "the hybrid holds less from here")
show_chart(chart)
export_row(chart, frame, "plan-cache", "plan_dl_cache")

st.subheader("Measured on this machine")
st.caption("Each kind of layer timed here, on fewer heads where it has many (its group of key/value heads kept), "
           "one CPU thread; the whole model's prefill time and decode speed predicted from those times along each "
           "spec's FLOPs. Attention only: a prediction, labelled as one.")
left, mid, right = st.columns([2, 2, 3])
budget = left.number_input("Seconds to spend, about", 1.0, 120.0, 10.0, step=1.0, **keyed("plan_budget"))
if mid.button("Measure on this machine", type="primary", key="plan_measure"):
    try:
        with st.spinner("Timing each kind of layer, and the hybrid's…"):
            timings, both = planner_measure.measure_hybrid(model, turned, budget_s=float(budget))
    except Exception as e:  # a kernel or the machine failing is a sentence here, never a page taken down
        measured.update(model=None, timings=None, hybrid={}, check=None)
        st.error(f"The measurement did not run: {literal(str(e)[:300])}", icon=":material/error:")
        timings = None
    else:
        measured.update(model=model.to_json(), timings=timings, hybrid={kind: both}, check=None)
        st.rerun()  # from the top: the hybrid's figures above read these timings too
if timings is None:
    st.info("Measure to predict this model's prefill time and decode tokens per second here.", icon=":material/timer:")
    st.stop()
try:
    predicted = planner_measure.predict(made, timings)
except ValueError as e:
    st.warning(f"No prediction: {literal(e)}", icon=":material/edit:")
    st.stop()
a, b = st.columns(2)
a.metric(f"Predicted prefill of {made.context:,} tokens", f"{predicted.prefill_s:.3g} s")
b.metric("Predicted decode", f"{predicted.tokens_per_s:.3g} tokens/s")
st.caption(f"Method: {literal(predicted.prefill_method)}. Timed in {timings.spent_s:.1f} s (load average "
           f"{timings.load_average}: other programs slow a busy machine's timings).")
st.dataframe(pd.DataFrame([{"layers": k.layer.name, "count": k.layer.count, "prefill s a layer": k.prefill_s,
                            "decode s a layer": k.decode_s, "how (prefill)": k.prefill_method,
                            "how (decode)": k.decode_method} for k in predicted.kinds]), hide_index=True)
for note in predicted.notes:
    st.caption(f"Note: {literal(note)}")
speeds = planner_measure.decode_curves(model, timings, NS, batch=batch,
                                       dtype=None if dtype == DTYPES[0] else dtype)
speed_chart = insight_charts.theory_chart(speeds, "tokens_per_s", legend="Model")
show_chart(speed_chart)
export_row(speed_chart, speeds, "plan-decode", "plan_dl_decode")

st.caption("The prediction's own check: a scaled-down stack of this model's kinds in its proportions, run for real "
           "at twice the longest length timed (shorter if the budget asks), against what the same timings predict.")
if st.button("Check the prediction", key="plan_check"):
    try:
        with st.spinner("Running the scaled-down stack…"):
            measured["check"] = planner_measure.check_stack(timings, budget_s=float(budget))
    except Exception as e:  # as above: a sentence, never a page taken down
        st.error(f"The check did not run: {literal(str(e)[:300])}", icon=":material/error:")
if (check := measured["check"]) is not None:
    a, b = st.columns(2)
    a.metric(f"Stack prefill of {check.prefill_n:,}: measured", f"{check.prefill_measured_s * 1e3:.3g} ms",
             f"{check.prefill_ratio:.2f}× the predicted {check.prefill_predicted_s * 1e3:.3g} ms", delta_color="off")
    b.metric(f"Stack decode step at {check.decode_n:,}: measured", f"{check.decode_measured_s * 1e3:.3g} ms",
             f"{check.decode_ratio:.2f}× the predicted {check.decode_predicted_s * 1e3:.3g} ms", delta_color="off")
    st.caption(f"{literal(check.notes[0])}. Within ×1.5 is the target; a busy machine spreads single timings.")
