"""Compare runs: kept and saved runs from several machines on one chart, a ratio between two, published figures
beside; the history of the runs the local store keeps."""
import streamlit as st

from attn_core import MECHANISMS
from attn_core.engine import untrusted
from attn_core.insight import charts as insight_charts
from attn_core.insight import published, ratio
from attn_core.engine import analysis, results
from pages import _run_store as history
from pages._shared import ensure_routed, export_row, keyed, show_chart

ensure_routed()  # a deep link as a server's first request: let the router run first

METRICS = {"time_median_s": "Time", "peak_bytes": "Peak memory"}


def load(files) -> dict:
    """Each upload parsed as data by results.load_run; a clear message for each one refused."""
    runs = {}
    for f in files:
        try:
            run = results.load_run(f.getvalue(), name=f.name)
        except results.RunFileError as e:
            st.error(untrusted.literal(e), icon=":material/block:")
            continue
        if not (run.frame["status"] == "ok").any():
            st.warning(f"{untrusted.literal(f.name)} holds no measured point (every point was skipped, failed or "
                       "cancelled).")
            continue
        name = f.name if f.name not in runs else f"{f.name} ({len(runs) + 1})"
        runs[name] = run
    return runs


st.title("Compare runs")
history.confirmations()
kept = history.history_panel()
st.subheader("Run files")
st.caption("Runs saved by `python -m attn_core sweep --out run.json` or by the Benchmark page's export, from this "
           "machine or others. Files are read as JSON or CSV data only; nothing in them is executed.")
files = st.file_uploader(f"Saved runs (JSON or CSV, up to {results.MAX_FILE_BYTES // 2**20} MiB each)",
                         type=["json", "csv"], accept_multiple_files=True, key="cmp_upload")
runs = kept | load(files or [])
if not runs:
    st.info("Upload one or more saved runs to overlay them, or open kept runs above.", icon=":material/upload_file:")
    st.stop()

frame = published.runs_frame(runs)
metric = st.segmented_control("Metric", list(METRICS), default="time_median_s", required=True,
                              format_func=METRICS.get, **keyed("cmp_metric"))
chart = insight_charts.runs_chart(frame, metric)
show_chart(chart)
export_row(chart, frame.drop(columns="time_samples"), "runs-overlay", "cmp_dl_runs-overlay")

st.subheader("Relative to a baseline, with published figures")
left, mid, right = st.columns(3)
baseline = left.selectbox("Baseline", ["softmax", "sdpa"], format_func=lambda k: MECHANISMS[k].label,
                          **keyed("cmp_baseline"))
forward = not analysis.generating(frame)  # the published figures are of forward passes
overlay = mid.toggle(f"Overlay {published.PUBLISHED}", forward, **keyed("cmp_published"), disabled=not forward,
                     help=None if forward else "The published figures are of forward passes; these runs generate "
                     "token by token.") and forward
matching = right.toggle("Only published methods matching the mechanisms shown", True, **keyed("cmp_matching"))
relative = published.relative_to_baseline(frame, metric, baseline)
if relative.empty:
    st.warning(f"No run measured {MECHANISMS[baseline].label} at the same n and settings as the others; choose "
               "another baseline or upload a run that includes it.")
else:
    ref = published.relative("speed" if metric == "time_median_s" else "memory") if overlay else None
    if ref is not None and matching:
        ref = ref[ref["mechanism"].isin(set(frame["mechanism"]))]
    chart = insight_charts.relative_chart(relative, metric, baseline_label=MECHANISMS[baseline].label,
                                          reference=ref)
    show_chart(chart)
    export_row(chart, relative, "runs-relative", "cmp_dl_runs-relative")
    if overlay:
        st.caption("Published figures, measured on other hardware with other models and settings: "
                   + " · ".join(published.citations()))

st.subheader("Ratio between two runs")
if len(runs) < 2:
    st.info("Upload a second run to see the ratio between two runs.")
    st.stop()
names = list(runs)
left, right = st.columns(2)
a = left.selectbox("Run A", names, 0, **keyed("cmp_a"))
b = right.selectbox("Run B", names, 1, **keyed("cmp_b"))
if a == b:
    st.error("Run A and run B are the same; choose two different runs.", icon=":material/edit:")
    st.stop()
ratios = published.run_ratio(runs[a].frame, runs[b].frame, metric)
if ratios.empty:
    st.warning(f"{untrusted.literal(a)} and {untrusted.literal(b)} share no point (same mechanism, parameters, n, "
               "dtype, mode, mask and sizes).")
    st.stop()
chart = ratio.ratio_chart(ratios, a, b, metric)
show_chart(chart)
export_row(chart, ratios, "runs-ratio", "cmp_dl_runs-ratio")
