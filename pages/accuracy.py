"""Accuracy: what an approximate or sparse mechanism gives up against exact softmax on the same inputs."""
import streamlit as st

from attn_core import MECHANISMS
from attn_core.engine.untrusted import literal
from attn_core.insight import accuracy
from attn_core.insight import charts as insight_charts
from pages._shared import ensure_routed, export_row, keyed, label, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

S = st.session_state
COLUMNS = {"params": "parameters", "label": "mechanism", "time_s": "time (ms)",
           "predicted_bytes": "predicted memory (MiB)", "pareto": "on the Pareto front"}
NS = [32, 64, 128, 256, 512, 1024, 2048]


def readable(table):
    """Column names a class can read: the metrics' labels, time in ms, memory in MiB."""
    table = table.assign(**{c: table[c] * 1e3 for c in ("time_s",) if c in table},
                         **{c: table[c] / 2**20 for c in ("predicted_bytes",) if c in table})
    return table.rename(columns={**accuracy.METRIC_LABELS, **COLUMNS})


# Headers short enough that every column shows at 1280 px; the full name is the header's help.
SHORT = {"relative Frobenius error": "rel. Frobenius", "max absolute error": "max |error|",
         "mean cosine similarity": "cosine", "KL(softmax ‖ mechanism), mean over rows": "KL, row mean",
         "softmax mass on cells the mechanism ignores": "mass ignored", "predicted memory (MiB)": "memory (MiB)",
         "on the Pareto front": "Pareto"}


def shown(table) -> None:
    """A readable table as a data grid whose headers fit: short labels, the full names in their help."""
    table = readable(table)
    config = {c: st.column_config.Column(SHORT[c], help=c) for c in table.columns if c in SHORT}
    st.dataframe(table, hide_index=True, column_config=config)


def parse_values(text: str) -> list[int | float]:
    """'16, 64, 256' → [16, 64, 256]; ValueError with a sentence otherwise."""
    parts = [p.strip() for p in text.replace(";", ",").split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"Values must be numbers separated by commas, e.g. 16, 64, 256; got {text!r}") from None
    if not values:
        raise ValueError("Type at least one value to try, e.g. 16, 64, 256")
    return sorted({int(v) if v == int(v) else v for v in values})


@st.cache_data(show_spinner="Comparing with exact softmax…", max_entries=32)
def sweep(key, param, values, settings):
    return accuracy.parameter_sweep(key, param, values, **settings)


@st.cache_data(show_spinner="Timing every mechanism…", max_entries=8)
def scatter(settings, keys: tuple[str, ...]):
    """Every mechanism of the catalogue (`keys`, so a catalogue that grew is timed anew) at these settings."""
    return accuracy.speed_accuracy(accuracy.default_configs(settings["n"], keys), **settings)


st.title("Accuracy")
st.caption("Each mechanism's output against exact softmax attention computed in float64 on the same seeded inputs.")
with st.expander("Settings", icon=":material/tune:"):  # folded: the chart first in view
    left, mid, right = st.columns(3)
    key = left.selectbox("Mechanism", list(MECHANISMS), list(MECHANISMS).index("performer"), format_func=label,
                         **keyed("acc_mechanism"))
    params = [p.name for p in MECHANISMS[key].params]
    param = left.selectbox("Parameter to sweep", params, **keyed(f"acc_param_{key}")) if params else None
    n = mid.select_slider("Sequence length n", NS, 256, **keyed("acc_n"))
    values_text = left.text_input("Values to try", ", ".join(map(str, accuracy.sweep_values(key, param, n)))
                                  if param else "", max_chars=500, disabled=param is None,
                                  **keyed(f"acc_values_{key}_{param}"))
    d_model = mid.number_input("d_model", 1, 4096, 256, **keyed("acc_d_model"))
    heads = mid.number_input("Heads", 1, 64, 4, **keyed("acc_heads"))
    easy, hard, why_hard = MECHANISMS[key].insight.regime or ("gaussian", None, "")
    inputs = right.selectbox("Inputs", accuracy.INPUTS, accuracy.INPUTS.index(easy), **keyed(f"acc_inputs_{key}"),
                             help="Each mechanism opens on inputs where it works as designed; the button beside "
                                  "shows its hard case.")
    right.caption(accuracy.INPUT_HELP[inputs])
    if hard:
        flip = easy if inputs == hard else hard
        right.button(f"{'Working' if inputs == hard else 'Hard'} case: {flip}", key="acc_flip",
                     on_click=S.__setitem__, args=(f"acc_inputs_{key}", flip), icon=":material/swap_horiz:",
                     help=f"Show {label(key)} on {flip} inputs, where it "
                          + ("works as designed." if inputs == hard else "fails: " + why_hard))
    seed = right.number_input("Seed", 0, 2**31 - 1, 0, **keyed("acc_seed"))
    if only := MECHANISMS[key].supports.causal_only:  # a recurrence (KDA, Mamba-2, ...) has no other form
        causal = right.toggle("Causal mask", True, disabled=True, key=f"acc_causal_only_{key}",
                              help=f"{label(key)} runs causal only: {only}.")
    else:
        causal = right.toggle("Causal mask", **keyed("acc_causal"))
    dtype = right.selectbox("dtype of the mechanism", ["float32", "float64"], **keyed("acc_dtype"))

settings = dict(n=n, d_model=int(d_model), heads=int(heads), inputs=inputs, seed=int(seed), causal=causal,
                dtype=dtype)
try:
    values = tuple(parse_values(values_text)) if param else ()
except ValueError as e:
    st.error(str(e), icon=":material/edit:")
    st.stop()
found = [p for v in values or [None] for p in accuracy.problems(key, n=n, d_model=int(d_model), heads=int(heads),
                                                             causal=causal, **({param: v} if param else {}))]
if found:
    st.error(found[0], icon=":material/edit:")
    st.stop()

frame = sweep(key, param, values, settings)
if MECHANISMS[key].insight.accuracy_note:
    st.info(MECHANISMS[key].insight.accuracy_note)
if hard and inputs == hard:
    st.info(f"The hard case for {label(key)}: {why_hard}", icon=":material/warning:")
elif hard and inputs == easy:
    st.caption(f"{label(key)} in its working regime ({easy} inputs); the button under Inputs shows where it fails.")
metric = st.segmented_control("Error shown", list(accuracy.METRICS), default="rel_fro", required=True,
                              format_func=accuracy.METRIC_LABELS.get, **keyed("acc_metric"))
if param:
    chart = insight_charts.error_chart(frame, metric)
    show_chart(chart)
    export_row(chart, frame, f"accuracy-{key}-{param}", "acc_dl_error")
shown(frame[["params", *accuracy.METRICS, "time_s", "predicted_bytes"]])
st.caption("KL(softmax ‖ mechanism) is infinite when the mechanism gives zero weight to a key softmax weights "
           "(sparse patterns): the dropped mass says how much. Weights over projected keys "
           f"({', '.join(s.label for s in MECHANISMS.values() if s.insight.projected)}) have neither, and weights that "
           f"can be negative (a pseudo-inverse) have no KL. KL is computed for n ≤ {accuracy.KL_MAX_N}.")

st.subheader("Speed vs accuracy, every mechanism")
if st.toggle("Time every mechanism at these settings (one call each)", False, **keyed("acc_scatter")):
    table = scatter(settings, tuple(MECHANISMS))
    chart = insight_charts.speed_accuracy_chart(table)
    show_chart(chart)
    export_row(chart, table, "speed-accuracy", "acc_dl_scatter")
    if missing := accuracy.left_out(accuracy.default_configs(settings["n"], tuple(MECHANISMS)), **settings):
        st.caption("Not on the scatter at these settings: " + " ".join(
            literal(why.rstrip(".") + ".") for why in missing.values()))
    st.caption("Time: median of a few in-process calls on this machine, state built outside; memory: the spec's "
               "prediction. Errors below 100 × machine epsilon count as exact for the Pareto front.")
    shown(table[["label", "params", "rel_fro", "time_s", "predicted_bytes", "pareto"]])
