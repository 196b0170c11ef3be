"""Plan a model: a whole model's weights, cache, decode speed and prefill time on a GPU (the roofline), its designs
compared and its layer pattern drawn (planner.py)."""
import dataclasses
import hashlib

import pandas as pd
import streamlit as st

from attn_core.studies.planner import compare as planner_compare, engines, measure as planner_measure
from attn_core.studies.planner import model as planner, pattern as planner_pattern, roofline
from attn_core.studies.planner import upload as planner_upload
from attn_core.studies.planner.devices import DEVICES, find_device
from attn_core.studies.planner.weights import BITS
from attn_core.insight import charts as insight_charts
from attn_core.studies.planner import chart as planner_charts
from attn_core.engine import env
from attn_core.engine.measure import format_bytes
from attn_core.mechanisms import MEASURED
from attn_core.spec import DTYPE_BYTES
from attn_core.engine.untrusted import file_stem, literal
from pages._shared import ensure_routed, export_row, keyed, label, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

NS = [2**k for k in range(10, 21)]
STATE_KINDS = ["gated_deltanet", "kda", "mamba2", "linear"]  # mechanisms whose generation keeps a fixed-size state
SHARES = [i / 8 for i in range(9)]
NEW = "new"  # the model list's entry for a model built from scratch (planner.NEW_MODEL)
HERE = "here"  # the GPU list's entry for this machine, measured
BASES = {**planner.MODELS, NEW: planner.NEW_MODEL}
KINDS = [k for k, spec in MEASURED.items() if spec.supports.generation is not None]  # what a layer can be
SIZE_HELP = {"count": "layers of this kind", "heads": "query heads", "kv_heads": "key/value heads (blank: one each)",
             "head_dim": "a head's width", "window": "tokens a query sees, itself included (sliding_window)",
             "kv_rank": "the latent's width (mla)", "rope_dim": "the shared rotary key's width (mla)",
             "state_dim": "a recurrent state's key side (Mamba-2's d_state; blank: head_dim)"}
PREDICTED = planner_charts.PREDICTED
CHART_METRICS = {"cache_per_token": "cache a token", "read_bytes": "bytes a step reads",
                 "decode_tokens_per_s": "decode tokens/s", "prefill_seconds": "prefill time"}


def _kinds_shown(made: planner.Plan) -> pd.DataFrame:
    """The plan's kinds with their bytes in IEC units (format_bytes), as the page shows them."""
    table = planner.kinds_table(made)
    for column in ("bytes a layer", "bytes in all"):
        table[column] = table[column].map(format_bytes)
    table["prefill FLOPs"] = table["prefill FLOPs"].map("{:.3g}".format)
    return table


def _designs_shown(table: pd.DataFrame) -> pd.DataFrame:
    """compare's rows with bytes in IEC units, speeds rounded, short headers: no text cut short in a column."""
    return pd.DataFrame({"design": table["design"], "cache": table["cache_bytes"].map(format_bytes),
                         "a token": table["cache_per_token"].map(format_bytes),
                         "a step reads": table["read_bytes"].map(format_bytes),
                         "decode tokens/s": table["decode_tokens_per_s"].round(1),
                         "prefill s": table["prefill_seconds"].map("{:.3g}".format),
                         "bound: decode, prefill": [f"{_short(d)}, {_short(p)}" for d, p in
                                                    zip(table["decode_bound"], table["prefill_bound"])]})


def _short(bound: str) -> str:
    """'memory-bound: bytes' → 'bytes'."""
    return bound.split(": ")[-1]

st.title("Plan a model")
st.caption("A whole model on a GPU: weights, cache, decode speed and prefill time, predicted (roofline), not measured.")
top = st.container()  # the plan and its first chart, filled once the settings below are read: in view when drawn
with st.expander("Settings: model, context, GPU, cache", expanded=True, icon=":material/tune:"):
    left, mid, right = st.columns(3)
    name = left.selectbox("Model", [*planner.MODELS, NEW], format_func=lambda k: BASES[k].name if k != NEW else
                          "A new model (build it below)", **keyed("plan_model"))
    upload = left.file_uploader("Or a file: a Hugging Face config.json, or a model file as the download below "
                                "writes", type=["json"], key="plan_upload")
    context = mid.select_slider("Context n (tokens)", NS, 131072, format_func="{:,}".format, **keyed("plan_n"))
    batch = int(mid.number_input("Batch (sequences held at once)", 1, 1 << 16, 1, **keyed("plan_batch")))
    device_key = right.selectbox("GPU", [*DEVICES, HERE], format_func=lambda k: DEVICES[k].name if k != HERE else
                                 "This machine (measured)", **keyed("plan_device"))
    a, b, c = st.columns(3)
    dtype = a.selectbox("Cache dtype", list(engines.CACHE_DTYPES), list(engines.CACHE_DTYPES).index("bfloat16"),
                        help="How the engine stores a cached value, its scales included (engines.CACHE_DTYPES)",
                        **keyed("plan_dtype"))
    engine = b.selectbox("Engine", list(engines.ENGINES), list(engines.ENGINES).index("vllm"),
                         help="; ".join(f"{k}: {e.label}" for k, e in engines.ENGINES.items()), **keyed("plan_engine"))
    page = int(c.number_input("Page size (tokens)", 1, 1 << 16, 16, help="Tokens a page of the cache holds (vLLM: "
                              "16); 1 holds it token by token", **keyed("plan_page")))
    weights_slot = st.container()  # asked for once the model is known, where its weights are not

base, slug, given = BASES[name], name, None
if upload is not None:
    raw = upload.getvalue()
    try:
        given = planner_upload.read_upload(raw)
    except ValueError as e:
        st.error(f"The file {literal(upload.name[:80])} is not a model this page can plan: {literal(e)}",
                 icon=":material/edit:")
        st.stop()
    base, slug = given.model, hashlib.sha1(raw).hexdigest()
with st.expander("Edit the model: any field, any layer kind (a row each; add or delete rows)", icon=":material/edit:"):
    left, mid, right = st.columns(3)  # keyed by the model edited: another model starts from its own fields
    title = left.text_input("Name", base.name, max_chars=planner.MAX_NAME, key=f"plan_name_{slug}")
    longest = mid.number_input("Trained context (tokens)", 1, planner.MAX_CONTEXT * 16, base.max_context,
                               key=f"plan_context_{slug}")
    own = right.selectbox("Its dtype", list(DTYPE_BYTES), list(DTYPE_BYTES).index(base.dtype),
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
plan_dtype = dtype if dtype in DTYPE_BYTES else None  # the attention's own figures: the model's dtype otherwise
made = planner.plan(model, context, batch=batch, dtype=plan_dtype)

if given is not None and given.weights is not None and model == base:
    weights = given.weights  # counted from the config.json
elif model.name.lower() in roofline.PUBLISHED:
    weights = None  # the published count
else:
    with weights_slot:
        st.caption("This model's weights are not known: give them.")
        a, b = st.columns(2)
        total = a.number_input("Parameters (billions)", 0.001, 10000.0, 8.0, **keyed("plan_params"))
        active = b.number_input("Of them, a token uses (billions)", 0.001, 10000.0, 8.0, **keyed("plan_active"))
    width = BITS[model.dtype] / 8
    weights = (total * 1e9 * width, min(active, total) * 1e9 * width)
try:
    device = find_device(device_key)
    held = engines.cache_by_engine(model, context, dtype=dtype, page_tokens=page, engine=engine, batch=batch)
    line = roofline.roofline(model, device, context, batch=batch, weights=weights, cache_dtype=dtype)
except ValueError as e:
    st.error(f"No plan with these settings: {literal(e)}", icon=":material/edit:")
    st.stop()
st.subheader(literal(model.name))  # a name from a file is text: never bold, a link or an image fetched
if model.source:
    st.caption(f"Configuration: {literal(model.source)}" + (f"; {planner_upload.describe(given)}"
                                                           if given is not None and model == base else ""))
a, b, c, d = st.columns(4)
a.metric("KV cache", format_bytes(held.kv_bytes),
         help="The attention layers' keys and values, or their latents (MLA), for every token of the context, as the "
              "engine holds them.")
b.metric("Recurrent state", format_bytes(held.state_bytes))
c.metric("Prefill attention FLOPs", f"{made.prefill_flops:.3g}")
d.metric("A new token reads", format_bytes(made.decode_bytes),
         help="Of the attention: every cache and state, whole (the weights it reads too are in the decode above)")
for note in dict.fromkeys([*made.notes, *held.notes, *line.notes, f"device: {device.source}"]):
    st.caption(f"Note: {literal(note)}")
if given is not None and given.notes and model == base:
    with st.expander(f"What the config.json reader assumed or left out ({len(given.notes)})"):
        for note in given.notes:
            st.caption(literal(note))
st.dataframe(_kinds_shown(made), hide_index=True)
st.download_button("This model as a file (JSON)", model.to_json(), f"{file_stem(model.name.lower())}.json",
                   "application/json", key="plan_dl_model", on_click="ignore")

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
hybrid_plan = planner.plan(mixed, context, batch=batch, dtype=plan_dtype)
where = planner.crossover(mixed, model, batch=batch, dtype=plan_dtype) if share else None
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

with top:  # metrics and the first chart above the settings: in view once drawn
    a, b, c, d, e = st.columns(5)
    a.metric("Weights", format_bytes(line.weights_bytes), help=f"All of them. Source: {line.weights_source}")
    b.metric("Weights a token reads", format_bytes(line.active_weights_bytes),
             help="Those one token multiplies by: not an untied input embedding table, of which it reads one row; "
                  "a mixture of experts reads its active experts only")
    c.metric("Cache", format_bytes(held.bytes), help=f"{held.label}, {held.dtype}, pages of {held.page_tokens}")
    d.metric("Decode tokens/s", f"{line.decode_tokens_per_s:,.1f}", help=roofline.METHOD)
    e.metric(f"Prefill of {context:,} (s)", f"{line.prefill_seconds:.3g}", help=roofline.METHOD)
    lines = [model, *([mixed] if share else [])]
    known = {m.name: roofline.weights_read(model, weights) for m in lines}
    speeds = planner_compare.speed_curves(lines, device, NS, batch=batch, weights=known, cache_dtype=dtype)
    for metric in ("decode_tokens_per_s", "prefill_seconds"):
        speed_chart = planner_charts.roofline_chart(speeds, metric, device=device.name)
        show_chart(speed_chart)
        export_row(speed_chart, speeds, f"plan-{metric.split('_')[0]}", f"plan_dl_{metric.split('_')[0]}",
                   folded=True)
        if metric.startswith("decode"):
            need = line.weights_bytes + held.bytes
            fits = "fits" if need <= device.memory_bytes else "does not fit"
            st.caption(f"{literal(model.name)} on {literal(device.name)}, {PREDICTED}: decode {line.decode_bound}, "
                       f"prefill {line.prefill_bound}. Weights and cache {format_bytes(need)} against its "
                       f"{format_bytes(device.memory_bytes)}: {fits}.")

st.subheader("Cache against context, every built-in model")
yours = dataclasses.replace(model, name=f"{model.name} (yours)") if model.name.lower() in planner.MODELS else model
models = [*planner.MODELS.values(), *([yours] if model not in planner.MODELS.values() else []),
          *([mixed] if share else [])]
frame = planner.curves(models, NS, batch=batch, dtype=plan_dtype)
here = env.device_info(env.resolve_device("auto"))["total_memory_bytes"]
chart = insight_charts.theory_chart(frame, "cache_bytes", legend="Model",
                                    budgets={"this machine": here, device.name: device.memory_bytes})
if share:  # the hybrid is drawn: mark where it starts to hold less than the model
    chart = planner_charts.marked(chart, where, "the hybrid holds less from here")
show_chart(chart)
export_row(chart, frame, "plan-cache", "plan_dl_cache")

st.subheader("The layers in order, and each kind's mask")
config = given.config if given is not None and model == base else None
layers_frame = planner_pattern.pattern_frame(model, 16, config)
layers_chart = planner_charts.layers_chart(layers_frame, title=f"{model.name}: {model.layer_count} layers")
show_chart(layers_chart)
export_row(layers_chart, layers_frame, "plan-layers", "plan_dl_layers", folded=True)

st.subheader("Compare designs")
st.caption("The same model rebuilt as MHA, GQA, MQA, MLA (DeepSeek's proportions), a sliding-window hybrid and a "
           "hybrid into any kind, each reading this model's weights, on the GPU and context above: "
           f"{PREDICTED}.")
a, b, c, d = st.columns(4)
turned_kind = model.layers[planner_compare.target(model)]
choices = [g for g in range(turned_kind.heads - 1, 0, -1) if turned_kind.heads % g == 0] or [1]
preferred = next((g for g in (turned_kind.kv_heads, 8) if g in choices), choices[0])
groups = a.selectbox("GQA: key/value heads", choices, choices.index(preferred), **keyed("plan_cmp_groups"))
into = b.selectbox("Turned into", KINDS, KINDS.index("gated_deltanet"), format_func=label, **keyed("plan_cmp_into"))
ratio = c.select_slider("Share turned", SHARES, 0.75, format_func="{:.1%}".format, **keyed("plan_cmp_share"))
window = int(d.number_input("Window (tokens)", 2, planner.MAX_CONTEXT, 4096, **keyed("plan_cmp_window")))
designs = planner_compare.Designs(kv_groups=int(groups), share=float(ratio), window=window, into=into)
table, notes = planner_compare.compare(model, device, context, designs=designs, batch=batch, weights=weights,
                                       cache_dtype=dtype)
st.dataframe(_designs_shown(table), hide_index=True)
for note in notes:
    st.caption(f"Note: {literal(note)}")
shown = st.selectbox("Chart", list(CHART_METRICS), format_func=CHART_METRICS.get, **keyed("plan_cmp_metric"))
compare_chart = planner_charts.compare_chart(table, shown, context=context, device=device.name)
show_chart(compare_chart)
export_row(compare_chart, table, "plan-designs", "plan_dl_designs", folded=True)

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
timed = planner_measure.decode_curves(model, timings, NS, batch=batch, dtype=plan_dtype)
timed_chart = insight_charts.theory_chart(timed, "tokens_per_s", legend="Model")
show_chart(timed_chart)
export_row(timed_chart, timed, "plan-decode-timed", "plan_dl_timed")

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
