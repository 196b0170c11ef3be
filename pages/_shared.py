"""What the pages share: widget keys and labels, charts shown and exported, the router's guard, the Benchmark page's
state (other pages read it and ask it for a preset), and the server's sweeps (the engine's sweep API is called here)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import streamlit as st

from attn_core import MEASURED
from attn_core.charts import insight as insight_charts, scaling, style
from attn_core.engine import stage, worker
from attn_core.engine.config import SweepConfig
from attn_core.engine.job import Job
from attn_core.engine.pacing import Pacing
from attn_core.engine.problem import sharing
from attn_core.engine.results import Run


def keyed(key: str, *, link: bool = False) -> dict:
    """A widget's stable key, its value kept across page switches; `link`: also in the URL, so a link reproduces
    the setup."""
    return {"key": key, "persist_state": "session", **({"bind": "query-params"} if link else {})}


def label(key: str) -> str:
    return MEASURED[key].label


KV_HELP = ("Key and value heads, each shared by a group of query heads: all (multi-head attention, MHA), fewer "
           "(grouped-query, GQA-g: Llama 3 has 8 for 32 or 64 query heads), or 1 (multi-query, MQA). The cache "
           "and the keys a token reads shrink by the same factor")


ALL_HEADS = 0  # the selector's "all (MHA)": one key/value head per query head, whatever their number


def kv_choices(heads: int) -> list[int]:
    """The key/value head counts `heads` query heads can share: ALL_HEADS (one each, MHA), then each divisor below.
    (Not None for MHA: a select box shows None as no choice at all.)"""
    return [ALL_HEADS] + [g for g in range(heads - 1, 0, -1) if heads % g == 0]


def kv_text(kv_heads: int) -> str:
    """'all (MHA)', '8 (GQA-8)', '1 (MQA)': a key/value head count as the selector writes it (and a link)."""
    return "all (MHA)" if kv_heads == ALL_HEADS else f"{kv_heads} ({sharing(0, kv_heads)})"


def export_row(chart, frame, stem: str, key: str, *, folded: bool = False) -> None:
    """The chart as PNG and SVG and its data as CSV, in a row of download buttons keyed `{key}_png` etc. (`folded`:
    in a popover, for a page of many figures)."""
    made = insight_charts.downloads(chart, frame, stem)
    if folded:  # the buttons are made inside the popover's block: made after it, they land on the page
        with st.popover("Export this figure", icon=":material/download:"):
            _download_buttons(made, [st] * len(made), key)
    else:
        _download_buttons(made, st.columns(6), key)


def _download_buttons(made, places, key: str) -> None:
    for place, (fmt, data, name, mime) in zip(places, made):
        place.download_button(fmt, data, name, mime, key=f"{key}_{fmt.lower()}", on_click="ignore")


def show_chart(chart, **options) -> None:
    """An insight page's Altair chart in the house look, with talk mode's large type (every text ≥ 18 px) when on."""
    if st.session_state.get("talk"):
        chart = style.styled(chart, talk=True)
    st.altair_chart(chart, theme=None, **options)


def ensure_routed() -> None:
    """Call first in every page and in the router. On a fresh server's first request streamlit is still in its legacy
    pages/-folder mode: a deep link runs the page alone (the router never runs, the page has no frame), and "/" runs
    the router as a legacy page, whose widgets then change identity on the next run (a first click is lost). Leave
    that mode for good (as st.navigation itself does) and, on a session's first run, run again so the router
    resolves the URL. No public API leaves that mode: the flag is Streamlit's own (PagesManager)."""
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        if not st.session_state:  # a fresh session: no click or value can be lost by running again
            st.rerun()


def drop_bound_param(key: str) -> None:
    """Take `key` out of the URL and out of Streamlit's own copy of it, from which a widget bound to the URL is seeded
    (as Streamlit does with a value it cannot parse). No public API: st.query_params refuses to delete a parameter
    bound to a widget."""
    from streamlit.runtime.state.session_state_proxy import get_session_state

    with get_session_state().query_params() as params:
        params._initial_query_params.pop(key, None)
        params.remove_param(key)


def session_id() -> str:
    """This browser session's id as the server knows it. No public API: st.context has no session id (1.67)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else ""


def session_alive(session: str) -> bool:
    """Whether a session still has a page open; True where no server runs (AppTest): nothing can be told there. No
    public API says whether a session is connected: the runtime's own registry of sessions answers."""
    from streamlit import runtime

    return not runtime.exists() or runtime.get_instance().is_active_session(session)


@dataclass
class BenchState:
    """The Benchmark page's state that no widget holds; its widgets keep their own keys (tests drive them by key, and
    links carry them)."""

    job: Job | None = None  # the job shown (measuring, queued or replaying): its progress ticks, Stop stops it
    own: bool = True  # asked for by this session (False: found running, started by a reload or another tab)
    preset: str | None = None  # the preset that set the panel: its "what to look for" line is shown
    focus: str = "time_median_s"  # the metric charted first
    source: str | None = None  # where the job shown comes from, when not from this page's Run (a file, another tab)
    start_preset: str | None = None  # asked for by another page (Home, Learn): the panel set to it, its sweeps queued
    loaded: tuple[Run, str, bool] | None = None  # a saved run asked for (run, file name, shown at once), set up next
    link_notes: list[str] = field(default_factory=list)  # the link's refused values, said after the rerun
    pacing: Pacing = field(default_factory=Pacing)  # when the live charts redraw
    live_specs: dict[str, scaling.LiveSpec] = field(
        default_factory=lambda: {m: scaling.LiveSpec() for m in scaling.METRICS})  # each chart's spec, points swapped
    summary: tuple[Any, Any] = (None, None)  # (job, its summary table): made once per finished job
    drawing: bool = False  # a full run is drawing: the progress ticker inside it leaves the worker's hold alone
    scrolled_for: tuple[Any, str] = (None, "")  # the job shown and its token: the browser scrolls once per token

    @property
    def running(self) -> bool:
        return self.job is not None and not self.job.done

    @property
    def busy(self) -> bool:
        """This session's own job runs: no second Run, preset or replay meanwhile."""
        return self.running and self.own


def bench_state() -> BenchState:
    """The session's one BenchState."""
    if "bench" not in st.session_state:
        st.session_state["bench"] = BenchState()
    return st.session_state["bench"]


def open_benchmark(preset: str) -> None:
    """Switch to the Benchmark page, which sets its panel to `preset` and queues its sweeps."""
    bench_state().start_preset = preset
    st.switch_page("pages/benchmark.py")


# The engine's jobs (Job on the server's Stage, the worker): the dashboard calls them here, and holds the worker in
# _bench_view.

@st.cache_resource(show_spinner=False)
def prestart_worker() -> bool:
    """Start the measuring process once per server: it imports torch now, so a first point comes fast later."""
    worker.prestart()
    return True


@st.cache_resource(show_spinner=False)
def sweeps() -> stage.Stage:
    """The server's one measuring stage: sweeps run one at a time, each watched by the sessions that show it."""
    return stage.Stage(session_alive)


def submit(name: str, configs: tuple[SweepConfig, ...]) -> Job:
    """Sweeps run one after another as one job, queued on the server's stage for this session. Sweeps that cannot
    run (a preset on a device without its dtype) give a job that ended at once with the sentences as its error, which
    the page shows where a sweep's error goes."""
    try:
        return Job.measure(name, configs, stage=sweeps(), watcher=session_id())
    except ValueError as e:
        return Job.refused(name, str(e))


def adopt_running() -> Job | None:
    """The job the server is measuring, watched by this session from now on (a reload, a second tab); None when
    none is."""
    desk = sweeps()
    job = desk.running()
    if job is not None:
        desk.watch(session_id(), job)
    return job


def replay(run: Run, points_per_s: float, *, at_once: bool) -> Job:
    """A saved run played back point by point, or (`at_once`) shown whole."""
    return Job.replay(run, points_per_s, shown=at_once)
