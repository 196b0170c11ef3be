"""Patterns: which (query, key) cells each mechanism computes, and the attention matrix it effectively applies."""
import streamlit as st

from attn_core import MECHANISMS
from attn_core.insight import accuracy, effective
from attn_core.insight import charts as insight_charts
from pages._shared import ensure_routed, export_row, keyed, label, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

SENTENCE = "the cat sat on the mat because it was tired and warm"
COUNT_MAX = 8192


@st.cache_data(max_entries=64, show_spinner=False)
def counted(key: str, n: int, causal: bool, params: dict, seed: int) -> str:
    try:
        return effective.cells_computed(key, n, causal, seed=seed, **params)["sentence"]
    except ValueError as e:  # e.g. a rank larger than the n counted at
        return f"{MECHANISMS[key].label}: {e}"


st.title("Patterns")
st.caption("Which (query, key) cells each mechanism computes, and the attention matrix it effectively applies, "
           "beside exact softmax.")
with st.expander("Settings", icon=":material/tune:"):  # folded: the chart first in view
    left, mid, right = st.columns(3)
    text = left.text_input("Sentence (its words label the positions)", SENTENCE, max_chars=200,
                           **keyed("pat_sentence"))
    chosen = left.multiselect("Mechanisms (exact softmax is always shown first)",
                              [k for k in MECHANISMS if k != "softmax"], ["sliding_window", "performer", "linformer"],
                              format_func=label, **keyed("pat_mechanisms"))
    heads = mid.number_input("Heads (one panel each)", 1, 4, 1, **keyed("pat_heads"))
    head_dim = mid.number_input("Head dimension", 2, 128, 16, **keyed("pat_head_dim"))
    inputs = mid.selectbox("Embeddings", accuracy.INPUTS, **keyed("pat_inputs"))
    seed = right.number_input("Seed", 0, 2**31 - 1, 0, **keyed("pat_seed"))
    causal = right.toggle("Causal mask", **keyed("pat_causal"))
    pull_back = right.toggle("Linformer on the n keys (W·F)", **keyed("pat_pull_back"),
                             help="Linformer weighs k projected rows, not the n keys: W·F pulls its weights back to "
                                  "the n keys, so its panel reads like the others.")
    count_n = right.number_input("Count computed cells at n =", 2, COUNT_MAX, 1024, **keyed("pat_count_n"),
                                 help=f"Counted cell by cell, up to n = {COUNT_MAX:,}; the Theory page goes further.")

try:
    tokens = effective.token_labels(text)
except ValueError as e:
    st.error(str(e).capitalize(), icon=":material/edit:")
    st.stop()
n = len(tokens)
params = {}
if chosen:
    with st.expander("Mechanism parameters", icon=":material/settings:"):
        for key in chosen:
            spec = MECHANISMS[key]
            small = effective.small_defaults(key, n)
            for column, p in zip(st.columns(max(3, len(spec.params))), spec.params):
                params.setdefault(key, {})[p.name] = column.number_input(
                    f"{spec.label}: {p.name}", p.low, p.high, small[p.name], help=p.help,
                    **keyed(f"pat_{key}_{p.name}"))
problems = [s for key in ["softmax"] + chosen for s in accuracy.problems(
    key, n=n, d_model=int(heads * head_dim), heads=int(heads), causal=causal, **params.get(key, {}))]
if problems:
    for problem in problems:
        st.error(f"{problem} (the sentence has {n} words)", icon=":material/edit:")
    st.stop()

q, k, v = accuracy.make_inputs(inputs, 1, int(heads), n, int(head_dim), seed=int(seed))
st.info(f"Inputs are not a trained model: q, k and v are random {inputs} embeddings (seed {seed}), one per word. The "
        "words only label positions; the maps show what each mechanism can compute, not what a language model "
        "would attend to.", icon=":material/info:")
for key in ["softmax"] + chosen:
    spec, p = MECHANISMS[key], params.get(key, {})
    maps = effective.attention_maps(key, q, k, v, tokens, causal=causal, seed=int(seed), pull_back=pull_back, **p)
    pulled = spec.insight.projected is not None and pull_back
    signed = bool((maps["weights"]["weight"] < 0).any())  # e.g. a pseudo-inverse inside (Nyströmformer)
    note = ("Effective attention pulled back through F (W·F): a linear map of v, not a distribution" if pulled else
            "Effective attention over projected keys: softmax(Q(EK)ᵀ/√d)" if maps["columns"] == effective.PROJECTED
            else "Effective attention: a linear map of v, some weights negative" if signed
            else "Effective attention (rows sum to 1)")
    chart = insight_charts.pattern_chart(
        maps["cells"], maps["weights"], title=spec.label, subtitle=[spec.description, counted(key, int(count_n),
                                                                                               causal, p, int(seed))],
        x_title=maps["columns"], cells_x_title=maps["cells_columns"],
        weights_title=note)
    show_chart(chart, width="content")
    export_row(chart, maps["weights"], f"pattern-{key}", f"pat_dl_{key}")
