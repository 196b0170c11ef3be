"""Learn: one short sentence walked through a single attention layer, step by step, then what it costs."""
import pandas as pd
import streamlit as st

from attn_core.charts import insight as insight_charts
from attn_core.insight import lesson
from attn_core import untrusted
from pages._shared import ensure_routed, export_row, keyed, open_benchmark, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first
S = st.session_state
SENTENCE, SOURCE = "the cat sat on the mat", "le chat était assis"
D_KS = [1, 2, 4, 8, 16, 64, 128, 512]
WALL = "The quadratic wall"  # the Benchmark preset that measures the cost live


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
         help=f"q·k sums d_k = {d_k} products of unit-variance entries: its variance is about d_k.")
b.metric("Spread of the scores the softmax sees", f"{read['scores_std']:.3g}")
c.metric("Largest softmax weight", f"{read['max_weight']:.3f}", help="Near 1: the softmax has saturated; one key "
         "takes all of a query's attention and the gradient through the others vanishes.")

big = 64 if S.get("talk") else 48  # a cell that holds its number ("-0.18") in the page's type
for number, step in enumerate(lesson.steps(walk), start=1):
    st.subheader(f"{number}. {step.title}")
    st.caption(f"{step.says} **{step.shape}**")
    per_head = (1100 // step.matrix.shape[0] - 140) // len(step.columns)  # heads side by side within ~1,100 px
    cell = max(20, min(big, per_head))
    chart = insight_charts.step_chart(step, cell=cell, numbers=cell >= big * 0.85)
    show_chart(chart, width="content")
    stem = f"learn-{number}-{step.key}"
    export_row(chart, insight_charts.step_frame(step), stem, f"learn_dl_{stem}", folded=True)

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
