"""Learn: one short sentence walked through a single attention layer, step by step, then what it costs."""
import pandas as pd
import streamlit as st

from attn_core.insight import charts as insight_charts
from attn_core.insight import further, lesson
from attn_core.engine import untrusted
from attn_core.positions import chart as rope_chart
from pages._shared import chart_spec, ensure_routed, export_row, keyed, open_benchmark, show_chart, show_spec

ensure_routed()  # a deep link as a server's first request: let the router run first
S = st.session_state
SENTENCE, SOURCE = "the cat sat on the mat", "le chat était assis"
D_KS = [1, 2, 4, 8, 16, 64, 128, 512]
WALL = "The quadratic wall"  # the Benchmark preset that measures the cost live
POSITION_VIEWS = ["permuted sentence", "sinusoidal table", "RoPE by offset", "ALiBi per head",
                  "RoPE past the trained length"]
TEMPERATURES = [0.01, 0.03, 0.1, 0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 100.0]


def size(nbytes: float) -> str:
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    k = 0
    while nbytes >= 1024 and k < len(units) - 1:
        nbytes, k = nbytes / 1024, k + 1
    return f"{nbytes:,.0f} {units[k]}" if k == 0 else f"{nbytes:,.1f} {units[k]}"


st.title("Learn")
st.caption("A short sentence through one attention layer with small seeded weights, computed live by the same "
           "softmax kernel the Benchmark page measures. Change a setting and every step follows.")
with st.expander("Settings", expanded=True, icon=":material/tune:"):
    left, mid, right = st.columns(3)
    sentence = left.text_input(f"Sentence (up to {lesson.MAX_WORDS} words)", SENTENCE, max_chars=200,
                               **keyed("learn_sentence"))
    cross = left.toggle("Cross-attention", help="Keys and values from a second sentence, as a translation model's "
                        "decoder attends to its encoder.", **keyed("learn_cross"))
    source = left.text_input("Source sentence", SOURCE, max_chars=200, disabled=not cross, **keyed("learn_source"))
    d_k = mid.select_slider("d_k", D_KS, 4, help="The size of each head's queries and keys.", **keyed("learn_d_k"))
    scaled = mid.toggle("Divide the scores by √d_k", True, **keyed("learn_scaled"))
    heads = mid.number_input("Heads", 1, 4, 1, **keyed("learn_heads"))
    score = right.radio("Scores", lesson.SCORES, format_func={"dot-product": "scaled dot-product Q Kᵀ",
                                                               "additive": "additive (Bahdanau)"}.get,
                        horizontal=True, **keyed("learn_score"))
    causal = right.toggle("Causal mask", help="A word sees only itself and the words before it, as when a model "
                          "writes text one word at a time.", **keyed("learn_causal"))
    pad = right.number_input("Padding tokens", 0, 4, 0, help="Appended to the keys and masked out, as when "
                             "sentences of different lengths share a batch.", **keyed("learn_pad"))
    seed = right.number_input("Seed", 0, 2**31 - 1, 0, **keyed("learn_seed"))

setup = lesson.Setup(d_k=d_k, heads=int(heads), scaled=scaled, causal=causal, pad=int(pad), score=score,
                     seed=int(seed))
try:
    walk = lesson.walk(sentence, setup, source if cross else None)
except ValueError as e:
    st.error(untrusted.literal(str(e)[0].upper() + str(e)[1:]) + ".", icon=":material/edit:")
    st.stop()

read = walk.readout()
a, b, c = st.columns(3)
a.metric("Spread of Q·K (standard deviation)", f"{read['raw_std']:.3g}",
         help=f"q·k sums d_k = {d_k} products: for entries of variance 1 its standard deviation would be about "
              f"√d_k = {d_k ** 0.5:.3g}.")
b.metric("Spread of the scores the softmax sees", f"{read['scores_std']:.3g}")
c.metric("Largest softmax weight", "—" if read["max_weight"] != read["max_weight"] else f"{read['max_weight']:.3f}",
         help=f"Over the {read['rows_counted']} rows (all heads) that choose between two keys or more: a row that "
              "sees one key gives it weight 1 whatever the scores. Near 1: the softmax has saturated; one key takes "
              "all of a query's attention and the gradient through the others vanishes.")

big = 64 if S.get("talk") else 48  # a cell that holds its number ("-0.18") in the page's type


@st.cache_resource(max_entries=256, show_spinner=False)
def step_chart(_step: lesson.Step, content: str, cell: int, numbers: bool):
    """insight_charts.step_chart, made once for a step of the same `content` (lesson.step_digest) and size, for
    every session: Altair builds each layered heatmap anew in tens of ms, and a click on this page reruns it
    with 13 of them (the defaults), most unchanged."""
    return insight_charts.step_chart(_step, cell=cell, numbers=numbers)


@st.cache_data(max_entries=512, show_spinner=False)
def step_spec(_step: lesson.Step, content: str, cell: int, numbers: bool, talk: bool) -> dict:
    """The spec the page sends for that chart (chart_spec: Altair's to_dict, most of a rerun once the charts are
    kept); a copy for each caller, as cache_data gives: Streamlit copies only a spec's top level before taking its
    data out, so a spec shared between sessions would rest on its leaving the rest alone."""
    return chart_spec(step_chart(_step, content, cell, numbers), talk=talk)


def figure(step: lesson.Step, stem: str) -> None:
    """A step's heatmap, its shape under its sentence, and its exports."""
    st.caption(f"{step.says} **{step.shape}**")
    # heads side by side within the column, the padded keys (the last columns) included
    talk = bool(S.get("talk"))
    cell = lesson.cell_px(step.matrix.shape[0], len(step.rows), len(step.columns), talk=talk)
    content, numbers = lesson.step_digest(step), cell >= big * 0.85
    show_spec(step_spec(step, content, cell, numbers, talk), width="content")
    export_row(step_chart(step, content, cell, numbers), insight_charts.step_frame(step), stem, f"learn_dl_{stem}",
               folded=True)


shown = lesson.steps(walk)
for number, step in enumerate(shown, start=1):
    st.subheader(f"{number}. {step.title}")
    figure(step, f"learn-{number}-{step.key}")

st.subheader("What it costs")
n = len(walk.queries)
rows = [lesson.cost(length, setup) for length in (n, *lesson.COST_NS)]
table = pd.DataFrame({"n (tokens)": [f"{r['n']:,}" + (" (this sentence)" if r["n"] == n else "") for r in rows],
                      "score cells (heads · n²)": [f"{r['cells']:,.0f}" for r in rows],
                      "their bytes (float32)": [size(r["bytes"]) for r in rows],
                      "softmax's peak, one forward call (spec's prediction)": [size(r["peak_bytes"]) for r in rows]})
st.table(table.set_index("n (tokens)"))
st.caption("Time grows as O(n²·d) and memory as O(n²): doubling the sentence quadruples the score matrix. The "
           "Benchmark page measures it on this machine, and the efficient mechanisms that avoid it.")
if st.button(f"Measure it live: “{WALL}” on the Benchmark page", key="learn_wall", type="primary",
             icon=":material/speed:"):
    open_benchmark(WALL)

st.divider()
st.caption("The rest of the lesson, on the same sentence and weights. Positions and the stack of layers: "
           "self-attention over the sentence with dot-product scores and no mask (a causal mask is itself a position); "
           "the lookup and the Jain–Wallace check: the layer above, as set.")
tokens = walk.queries
number = len(shown) + 1
st.subheader(f"{number}. Where words stand: positions")
view = st.radio("Show", POSITION_VIEWS, horizontal=True, **keyed("learn_pos_view"))
if view == POSITION_VIEWS[0]:
    kind = st.radio("Permutation", further.PERMUTATIONS, horizontal=True, **keyed("learn_pos_perm"))
    step = further.permutation_step(sentence, setup, kind)
elif view == POSITION_VIEWS[1]:
    step = further.sinusoidal_step()
elif view == POSITION_VIEWS[2]:
    left, right = st.columns(2)
    q_at = left.selectbox("Query word", range(len(tokens)), format_func=tokens.__getitem__, **keyed("learn_rope_q"))
    k_at = right.selectbox("Key word", range(len(tokens)), min(1, len(tokens) - 1), format_func=tokens.__getitem__,
                           **keyed("learn_rope_k"))
    step = further.rope_step(sentence, setup, min(q_at, len(tokens) - 1), min(k_at, len(tokens) - 1))
elif view == POSITION_VIEWS[3]:
    step = further.alibi_step(len(tokens))
else:  # RoPE scaling: a published config's scores by offset, with and without its rope_scaling
    name = st.selectbox("Config", list(rope_chart.EXAMPLES), **keyed("learn_rope_scaling"))
    example = rope_chart.EXAMPLES[name]
    show_chart(rope_chart.decay_chart(rope_chart.example_frame(name), example.trained,
                                      subtitle=f"head_dim {example.head_dim}, rope_theta {example.base:,.0f}; "
                                               f"{example.source}"))
    st.caption(rope_chart.CAPTION)
if view != POSITION_VIEWS[4]:
    figure(step, f"learn-{number}-{step.key}")

number += 1
st.subheader(f"{number}. Attention as a soft dictionary lookup")
left, right = st.columns(2)
asked = left.selectbox("Query", range(len(tokens)), format_func=tokens.__getitem__, **keyed("learn_lookup_q"))
temperature = right.select_slider("Temperature T", TEMPERATURES, 1.0, help="Scores are divided by T before the "
                                  "softmax: T → 0 is the hard lookup, large T the mean of the values.",
                                  **keyed("learn_lookup_t"))
found = further.lookup(walk, min(asked, len(tokens) - 1), temperature)
a, b = st.columns(2)
a.metric("Soft vs hard output (relative distance)", f"{found.gap:.3g}")
b.metric("Weight on the best-matching key", f"{float(found.soft.max()):.3f}")
figure(found.step, f"learn-{number}-{found.step.key}")

number += 1
st.subheader(f"{number}. What the weights do and do not explain")
left, mid = st.columns(2)
layers = left.radio("Layers in the stack", further.LAYERS, horizontal=True, **keyed("learn_explain_layers"))
token = mid.selectbox("Word explained", range(len(tokens)), format_func=tokens.__getitem__,
                      **keyed("learn_explain_word"))
view = st.radio("Show", further.EXPLAIN_VIEWS, horizontal=True, **keyed("learn_explain_view"))
if view == further.EXPLAIN_VIEWS[-1]:
    step, moved = further.reweight_step(walk)
    a, b = st.columns(2)
    a.metric("Weights moved (total variation, mean over words)", f"{moved.weight_change:.2f}")
    b.metric("Output moved (relative)", f"{moved.output_change:.1%}")
else:
    step = further.explain_step(view, sentence, setup, layers, min(token, len(tokens) - 1))
figure(step, f"learn-{number}-{step.key}")
