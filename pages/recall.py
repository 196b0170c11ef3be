"""Associative recall: what a mechanism can still learn, trained live, beside what it holds and the time it took
(attn_core.studies.recall.mqar; MQAR, Zoology, Arora et al. 2023, arXiv 2312.04927)."""
import json
import time

import streamlit as st

from attn_core import MECHANISMS
from attn_core.studies.recall import mqar as recall
from attn_core.studies.recall import chart as recall_charts
from attn_core.charts import style
from attn_core.engine import env
from attn_core.engine.untrusted import literal
from pages._shared import ensure_routed, export_row, keyed, label, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

CAUSAL = [key for key, spec in MECHANISMS.items() if spec.supports.causal]
DEFAULTS = dict(recall.DEFAULT_MECHANISMS)
SEQS = [16, 32, 64, 128, 256]
WIDTHS = [16, 32, 64, 128]
REDRAW_S = 2.0  # the live curves are redrawn at most this often (the progress bar at every point)
d = recall.Setup()

st.title("Associative recall")
st.caption("Multi-query associative recall (MQAR, Zoology, arXiv 2312.04927): a sequence of key–value pairs, then "
           "queries of earlier keys; a tiny causal model (two blocks of the mechanism and an MLP) must answer each "
           "with its value. Softmax attention keeps every pair; a window or a fixed-size state keeps only what fits.")

with st.expander("Saved: the reference made with the command line on a larger budget, or a file of yours",
                 expanded=True, icon=":material/table_chart:"):
    upload = st.file_uploader("Or open a saved result (JSON, as `recall --out` writes)", type=["json"],
                              key="rc_upload")
    reference = recall.reference()
    if upload is not None:
        try:
            reference = recall.read_saved(upload.getvalue()[: 1 << 20].decode("utf-8", errors="replace"))
        except ValueError as e:
            st.error(f"{literal(upload.name[:80])} cannot be shown: {literal(e)}", icon=":material/edit:")
    ref, made = recall.frame(reference["results"]), reference["setup"]
    subtitle = (f"seq {made['seq']}, {made['pairs']} pairs, vocabulary {made['vocab']}, d_model "
                f"{made['d_model']}, {made['steps']} steps")  # the machine: in the caption below, once
    show_chart(recall_charts.recall_scatter(ref, chance=made["chance"], title="Recall against state, saved",
                                            subtitle=subtitle))
    st.dataframe(ref[["mechanism", "accuracy", "state_bytes", "train_s", "best_lr"]], hide_index=True)
    st.caption(f"Made by {literal(reference['command'])} on {literal(reference['machine'])}, "
               f"{literal(', '.join(f'{k} {v}' for k, v in reference['versions'].items()))}. "
               f"{literal(reference['note'])} {literal(reference['remark'])}")

with st.expander("Settings", expanded=True, icon=":material/tune:"):
    left, mid, right = st.columns(3)
    keys = left.multiselect("Mechanisms (causal ones)", CAUSAL, list(DEFAULTS), format_func=label, **keyed("rc_mechs"))
    window = int(left.number_input("Sliding window: tokens back", 1, 256, DEFAULTS["sliding_window"]["window"],
                                  **keyed("rc_window")))
    seq = mid.select_slider("Sequence length", SEQS, d.task.seq, **keyed("rc_seq"))
    pairs = int(mid.number_input("Key–value pairs", 1, 64, d.task.pairs, **keyed("rc_pairs")))
    vocab = int(mid.number_input("Vocabulary", 4, 1024, d.task.vocab, **keyed("rc_vocab")))
    width = right.select_slider("Model width (d_model)", WIDTHS, d.d_model, **keyed("rc_width"))
    steps = int(right.number_input("Steps per learning rate", 1, 5000, d.steps, step=50, **keyed("rc_steps")))
    st.caption(f"Learning rates {', '.join(map(str, d.lrs))}, the best kept (as Zoology reports); batch {d.batch}, "
               f"seed {d.seed}, {d.eval_sequences} held-out sequences; one CPU thread.")

try:
    setup = recall.with_setup(d, seq=seq, pairs=pairs, vocab=vocab, d_model=width, steps=steps)
except ValueError as e:
    st.info(f"{literal(e)}.", icon=":material/edit:")
    st.stop()
chosen = [(key, {"window": window} if key == "sliding_window" else {}) for key in keys]
state = st.session_state.setdefault("recall", {"results": [], "points": [], "setup": None})
go, stop = st.columns([1, 5])
clicked = go.button("Train", type="primary", key="rc_train", disabled=not chosen)
stop.button("Stop", key="rc_stop", help="Ends training; the curves so far stay.")  # its click interrupts the run
if clicked:
    state.update(results=[], points=[], setup=setup)
    bar, live = st.progress(0.0), st.empty()
    total, drawn_at = len(chosen) * len(setup.lrs) * setup.steps, [0.0]
    for i, (key, params) in enumerate(chosen):
        name = recall.Result(key, params).name

        def arrived(point, name=name, key=key, i=i):
            state["points"].append({"mechanism": name, "key": key, **vars(point)})
            done = (i * len(setup.lrs) + setup.lrs.index(point.lr)) * setup.steps + point.step
            bar.progress(done / total, text=f"{name}: step {point.step}, lr {point.lr:g}, loss {point.loss:.3f}, "
                                            f"accuracy {point.accuracy:.3f}")
            if time.monotonic() - drawn_at[0] > REDRAW_S or point.step == setup.steps:  # a chart costs ~0.1 s
                chart = recall_charts.curves_chart(recall.curves(state["points"]), chance=setup.task.chance)
                live.vega_lite_chart(style.page_spec(style.styled(chart, talk=True) if st.session_state.get("talk")
                                                     else chart), theme=None)
                drawn_at[0] = time.monotonic()
        try:
            state["results"].append(recall.train(key, params, setup, progress=arrived))
        except ValueError as e:  # settings this machine cannot train (the memory guard): said, the curves kept
            st.error(literal(e))
            st.stop()
    state["stamp"] = env.environment(setup.device, "float32", setup.threads)  # the machine, as recall --out saves
    st.rerun()

shown = state["setup"] or setup
if state["points"]:
    show_chart(recall_charts.curves_chart(recall.curves(state["points"]), chance=shown.task.chance))
    if len(state["results"]) < len({p["mechanism"] for p in state["points"]}):
        st.caption("Stopped: the last mechanism's curve is kept, but it has no held-out accuracy.")
if state["results"]:
    table = recall.frame(state["results"])
    where = f"seq {shown.task.seq}, {shown.task.pairs} pairs, d_model {shown.d_model}, {shown.steps} steps"
    by_state = recall_charts.recall_scatter(table, chance=shown.task.chance, subtitle=where)
    show_chart(by_state)
    show_chart(recall_charts.recall_scatter(table, "train_s", chance=shown.task.chance,
                                            title="Recall against the time it took", subtitle=where))
    st.dataframe(table[["mechanism", "accuracy", "state_bytes", "train_s", "best_lr"]], hide_index=True)
    export_row(by_state, table, "recall", "rc_export")
    made = recall.provenance(state["results"], shown, stamp=state.get("stamp") or {}, note="trained on the page",
                             command=recall.command_line([r.name for r in state["results"]], shown))
    st.download_button("Download the run (JSON, as recall --out writes: it opens above)",
                       lambda: (json.dumps(made, indent=1) + "\n").encode(), "recall-run.json", "application/json",
                       key="rc_download", on_click="ignore", icon=":material/download:")
