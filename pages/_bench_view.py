"""The Benchmark page's results: the live charts and their progress ticks, the summary, exports, and saved runs
shown or replayed."""
import functools
import time

import streamlit as st

from attn_core.engine import untrusted
from attn_core.charts import export, payoff, scaling
from attn_core.engine import analysis, positions, results, worker
from pages._bench_form import AXES, BASELINES, CURVES, NUMBERS, SHOWN_PRESETS, keyed, talk
from pages._shared import bench_state, export_row, label, seen, show_chart

S = st.session_state
# No animation while points are timed: a browser easing a progress bar draws for the whole transition.
STILL_CSS = "<style>[data-testid='stProgress'] * { transition: none !important; animation: none !important; }</style>"
# Less blank space above the title (Streamlit's 6rem): the chart a run draws starts in the upper half of the window.
TOP_CSS = ("<style>[data-testid='stMainBlockContainer'] { padding-top: 3.5rem; } "
           "[data-testid='stMainBlockContainer'] h1 { font-size: 2.25rem; padding-top: 0; }</style>")
# Each chart's box: as tall as the screen allows (the chart fills it, title included). In talk mode a chart and its
# title fill the window below Streamlit's header bar, at 1280×720 as at 1920×1080.
CHART_CSS = "".join(f".st-key-bench_chart_{m} {{ flex: 0 0 auto !important; height: auto !important; }} "
                    f".st-key-bench_chart_{m} * {{ height: auto; }} "
                    f".st-key-bench_chart_{m} [data-testid='stVegaLiteChart'] {{ height: HEIGHT !important; }} "
                    for m in scaling.METRICS)
CHART_HEIGHT = {False: "clamp(380px, calc(100vh - 12rem), 1000px)", True: "max(420px, calc(100vh - 4.5rem))"}
# The columns a speaker talks about; the rest of the summary is one click away.
# Each ratio is followed by the n it was taken at (a speaker quotes the pair).
FIRST_COLUMNS = ["Mechanism", "time ∝ n^k: k", "memory ∝ n^k: k", "speed-up vs softmax (×)", "speed-up at n",
                 "memory saving vs softmax (×)", "memory saving at n"]


def style() -> None:
    st.html(STILL_CSS + TOP_CSS + f"<style>{CHART_CSS.replace('HEIGHT', CHART_HEIGHT[talk()])}</style>")


def live(job, chart_place=st) -> None:
    """Draw a running job: the worker is held while this run draws (no timed sample competes with it), the progress
    ticks in a fragment between full runs, and the next full run is paced (engine.pacing)."""
    seen()  # this session shows the job: the stage keeps it
    worker.hold(True)  # measure.take_turn waits for the hold, 3 s at most
    state = bench_state()
    state.drawing = True
    clock = state.pacing
    replay = job.replaying
    if replay:
        job.poll()  # the points due now, drawn by this run
    clock.begin(id(job), job.progress.done, time.monotonic())
    st.fragment(ticker, run_every=clock.tick_every(job.points_per_s if replay else None))()
    results_view(job, chart_place)
    clock.end(time.monotonic())
    state.drawing = False
    worker.hold(False)  # the charts are sent; the worker waits for the browser to draw them (a quiet moment)


def ticker() -> None:
    """A fragment rerun every few seconds while a job measures: it advances the job and redraws only the progress
    bar. When points have arrived it asks for a full run, which draws them, when the pacing allows. Every tick and
    full run holds the worker: no timed sample starts until it is over and the browser has drawn what it was sent
    (worker.hold)."""
    seen()
    state = bench_state()
    inside = state.drawing  # run inside a full run, which holds the worker from its start to its end
    if not inside:
        worker.hold(True)
    job = state.job
    replay = job.replaying
    if replay:  # points are taken only by the full run that draws them: the count is what the charts show
        if not inside and job.due > job.progress.done:
            st.rerun()
    else:
        job.poll()
    if job.done:
        st.rerun()  # Run comes back, the table and the exports appear
    p = job.progress
    eta = f" · {p.eta_text}" if p.eta_text else ""  # retakes and a busy machine counted; none before a rate
    st.progress(min(p.done / max(p.total, 1), 1.0),
                text=f"{p.done} of {p.total} points · now {untrusted.literal(p.current)}{eta}")
    if not replay and state.pacing.wants_redraw(id(job), p.done, time.monotonic()):
        st.rerun()
    if not inside:
        worker.hold(False)


def results_view(job, chart_place=st) -> None:
    """Controls, charts and table of the current job's points; the chart options in `chart_place` (beside Run)."""
    if job is None:
        st.info("Choose settings and press Run, or pick a preset: points appear on the charts as they are measured.")
        return
    if source := bench_state().source:
        st.info(source, icon=":material/folder_open:")
    if job.error:
        st.error(f"The sweep stopped: {untrusted.literal(job.error)}")
    df = job.frame()
    if df.empty:
        st.caption("Waiting for the first point…")
        return
    with chart_place.popover("Chart options", icon=":material/tune:", width="stretch"):
        st.segmented_control("Axes", AXES, default="log-log", required=True, **keyed("bench_axes"))
        st.pills("Theory curves (dashed)", list(CURVES), default=["spec"], selection_mode="multi",
                 format_func=CURVES.get, **keyed("bench_curves"))
        st.segmented_control("Crossover n* against", BASELINES, default="softmax", required=True,
                             format_func=label, **keyed("bench_baseline"))
    baseline = S.get("bench_baseline") or "softmax"
    preset = SHOWN_PRESETS.get(bench_state().preset or "")
    asked = analysis.crossover_asked(preset.look_for if preset else None, baseline)
    if job.done and asked and (missing := analysis.baseline_note(df, baseline)):
        st.info(missing, icon=":material/info:")
    notes = []  # how the points were measured: behind an expander under the charts, not above them
    for metric in metrics():
        options = chart_options(metric)
        with st.container(key=f"bench_chart_{metric}"):  # sized to the screen by CHART_CSS; the chart fills it
            st.vega_lite_chart(live_spec(metric).update(df, metric, fit=True, **options), theme=None,
                               width="stretch", height="stretch")
        if note := scaling.chart_note(df, metric, log=options["log"], curves=options["curves"]):
            notes.append(untrusted.literal(note))  # it quotes labels and reasons, from a file when replayed
    if job.done and (stopped := analysis.stopped_note(df)):
        st.info(stopped, icon=":material/stop_circle:")
    busy = analysis.contention_summary(df)
    notes = [analysis.mode_note(df), analysis.precision_note(df), positions.method_note(df), busy, *notes,
             analysis.matmul_note(job.result().env) if job.done else ""]
    with st.expander("How this was measured" + (" (the computer was busy: hollow points left out)"
                                                 if df["disturbed"].any() else ""), icon=":material/science:"):
        st.markdown("Each point is the median of repeated timed calls after warm-up runs; the dashed theory curves "
                    "are scaled to the clean points.")
        for note in filter(None, notes):
            st.caption(note)
    if job.done:
        table = summary(job)
        # The columns a reader needs first, whole at 1280 px (an HTML table also scales with talk mode's font, a
        # data grid does not; a missing figure reads "—", not "None"); every column behind an expander.
        short = table[[c for c in FIRST_COLUMNS if c in table]].set_index("Mechanism")
        short.index = short.index.map(untrusted.literal)  # st.table renders Markdown; a replayed run's labels are text
        ns = {c: "{:,.0f}" for c in ("speed-up at n", "memory saving at n") if c in short}
        st.table(short.style.format(ns, precision=2, na_rep="—"), border="horizontal")
        with st.expander("Every column of the summary"):
            st.dataframe(table, hide_index=True)
        for note in analysis.summary_notes(df):
            st.caption(note)
        one_time(df)
    else:
        st.caption("The summary table (fitted exponents, speed-ups, GFLOP/s) comes when the sweep ends.")


def one_time(df) -> None:
    """A run with Flex or dense-mask points: where Flex is faster than ours, their one-time costs (compile, mask)
    beside the time per call, and when compiling pays off at a chosen n, exported like the other charts."""
    ns = payoff.payoff_ns(df)
    if not ns:
        return
    if faster := analysis.flex_faster(df):
        st.info(untrusted.literal(faster), icon=":material/bolt:")
    st.markdown("**Paid once, not in the time**: compiling FlexAttention and building its block mask (or the dense "
                "mask), measured once per point before the timed calls.")
    st.dataframe(payoff.one_time_table(df), hide_index=True)
    n = st.selectbox("When does compiling pay off, at n =", ns, index=len(ns) - 1, format_func="{:,}".format,
                     key="bench_payoff_n")
    chart = payoff.payoff_chart(df, n, talk=talk())
    show_chart(chart)
    for series, note in payoff.break_even(df, n)[["series", "note"]].itertuples(index=False):
        st.caption(untrusted.literal(f"{series}: {note}"))
    export_row(chart, payoff.payoff_frame(df, n), "attention-payoff", "bench_dl_payoff")


def chart_options(metric: str) -> dict:
    """How a chart is drawn: the current axes, theory curves, baseline, theme and titles."""
    return {"log": S.get("bench_axes") != "linear", "baseline": S.get("bench_baseline") or "softmax",
            "curves": tuple(S.get("bench_curves", ["spec"])), "talk": talk(),
            "title": S.get(f"bench_title_{metric}") or None, "subtitle": S.get("bench_subtitle") or None}


def metrics() -> list[str]:
    """The chart metrics, the one the preset focuses on first."""
    first = bench_state().focus
    return sorted(scaling.METRICS, key=lambda metric: metric != first)


def live_spec(metric: str) -> scaling.LiveSpec:
    """The session's spec of one chart: rebuilt only when its shape changes, new points swapped in otherwise."""
    return bench_state().live_specs[metric]


def summary(job):
    """The summary table of a finished job, made once (from all its rows: it may have finished a moment ago)."""
    state = bench_state()
    if state.summary[0] is not job:
        state.summary = (job, scaling.summary_table(job.frame()))
    return state.summary[1]


# Each chart's files: (button, its key's end, file name's end, maker, type); "PNG 16:9" fills a 1920×1080 slide,
# "PNG" keeps the chart's own shape.
EXPORTS = (("PNG 16:9", "slide", "-16x9.png", export.chart_slide_png, "image/png"),
           ("PNG", "png", ".png", export.chart_png, "image/png"),
           ("SVG", "svg", ".svg", export.chart_svg, "image/svg+xml"),
           ("HTML", "html", ".html", export.chart_html, "text/html"))


def export_panel(job) -> None:
    record = job.result()
    with st.expander("Export", icon=":material/download:"):
        shown = {metric: scaling.figure(record.frame, metric, **chart_options(metric)) for metric in metrics()}
        cols = st.columns(len(shown) + 1)
        for metric, column in zip(shown, cols):
            column.text_input(f"Title of the {scaling.METRICS[metric][3].lower()} chart", max_chars=200,
                              placeholder=scaling.default_title(record.frame, metric), **keyed(f"bench_title_{metric}"))
        cols[-1].text_input("Subtitle of both", max_chars=300, placeholder=scaling.default_subtitle(record.frame),
                            **keyed("bench_subtitle"))
        for metric, chart in shown.items():
            name = "time" if metric == "time_median_s" else "memory"
            row = st.columns(5)
            row[0].markdown(f"**{scaling.METRICS[metric][3]}** chart")
            for column, (fmt, kind, end, make, mime) in zip(row[1:], EXPORTS):
                column.download_button(fmt, functools.partial(make, chart), f"attention-{name}{end}", mime,
                                       key=f"bench_dl_{name}_{kind}", on_click="ignore", icon=":material/download:")
        row = st.columns(4)
        row[0].markdown("**Data, with the environment stamp**")
        row[1].download_button("CSV", functools.partial(results.to_csv_bytes, record), "attention-run.csv",
                               "text/csv", key="bench_dl_csv", on_click="ignore", icon=":material/download:")
        row[2].download_button("JSON", functools.partial(results.to_json_bytes, record), "attention-run.json",
                               "application/json", key="bench_dl_json", on_click="ignore",
                               icon=":material/download:")


def replay_panel(busy: bool) -> None:
    with st.expander("Replay or show a saved run", icon=":material/replay:", expanded=talk() and not busy):
        upload = st.file_uploader("A run saved by `python -m attn_core sweep --out run.json` or by Export (JSON or "
                                  "CSV)", type=["json", "csv"], key="bench_upload")
        st.slider("Replay speed (points per second)", *NUMBERS["bench_speed"], 3.0, step=0.5, **keyed("bench_speed"))
        left, right = st.columns(2)
        show = left.button("Show it", key="bench_show", disabled=upload is None or busy)
        replay = right.button("Replay point by point", key="bench_replay", disabled=upload is None or busy)
        if upload is None or not (show or replay):
            return
        try:
            run = results.load_run(upload.getvalue(), name=upload.name)
        except results.RunFileError as e:
            st.error(untrusted.literal(e))
            return
        bench_state().loaded = (run, upload.name, show)  # the panel is drawn: the next run sets it (load_saved)
        st.rerun()

