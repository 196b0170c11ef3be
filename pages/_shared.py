"""What the pages share: widget keys and labels, charts shown and exported, the router's guard, the Benchmark page's
state (other pages read it and ask it for a preset), and this session's side of the server's sweeps
(attn_core.engine.server)."""
from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

import streamlit as st
from altair.utils import schemapi

from attn_core import MEASURED
from attn_core.insight import charts as insight_charts
from attn_core.charts import scaling, style
from attn_core.engine import server
from attn_core.engine.config import SweepConfig
from attn_core.engine.job import Job
from attn_core.engine.pacing import Pacing
from attn_core.engine.problem import sharing
from attn_core.engine.results import Run
from attn_core.engine.stage import Stage

UNBOUND = "links_unbound"  # session state: the linked widgets drawn unbound once (see unbind)

# Altair checks each object of a chart against the Vega-Lite schema as the object is made (its debug mode), at every
# rerun of a page: a rerun of Learn (39 charts) took 1.15-1.42 s with it and 0.94-0.98 s without, Theory 0.71-0.98
# and 0.63-0.69, the planner 0.84 and 0.55-0.58 (AppTest, 3 reruns each, quiet). The charts are the library's
# functions, whose tests validate each one's whole spec (to_dict), as every export does (charts.export); a page
# draws them unvalidated (style.page_spec). Once for the server's process.
schemapi.disable_debug_mode()


def keyed(key: str, *, link: bool = False) -> dict:
    """A widget's stable key, its value kept across page switches; `link`: also in the URL, so a link reproduces
    the setup (unless `unbind` let go of it for this run)."""
    if link and key in st.session_state.get(UNBOUND, ()):
        st.session_state[UNBOUND].discard(key)
        link = False
    return {"key": key, "persist_state": "session", **({"bind": "query-params"} if link else {})}


def unbind(key: str, value: Any) -> None:
    """Take a value out of the URL that the widget bound to it cannot take (Back or Forward brought it back), and
    set the widget to `value`: st.query_params may not delete a bound parameter, so the widget is drawn unbound once,
    and Streamlit, seeing the binding dropped, takes the parameter out of the URL; the next run binds it again."""
    st.session_state.setdefault(UNBOUND, set()).add(key)
    st.session_state[key] = value


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
    show_spec(chart_spec(chart, talk=bool(st.session_state.get("talk"))), **options)


def chart_spec(chart, *, talk: bool) -> dict:
    """The Vega-Lite spec show_chart sends for `chart` (talk: laid out for talk mode's type); a page that keeps the
    specs of charts it draws again and again (Learn) shows them with show_spec."""
    return style.page_spec(style.styled(chart, talk=True) if talk else chart)


def show_spec(spec: dict, **options) -> None:
    """A spec made by chart_spec, drawn as show_chart draws its chart."""
    st.vega_lite_chart(spec, theme=None, **options)


# Every page's look beyond the theme (style tags only: Streamlit sends them aside, they take no room on the page).
HOUSE_CSS = """<style>
[data-testid="stMultiSelectTagsContainer"] [data-tag] { height: auto; min-height: 1.75rem; }
[data-testid="stMultiSelectTagsContainer"] [data-tag] > span { white-space: normal; overflow: visible;
  text-overflow: clip; }
[data-testid="stMainBlockContainer"] { padding-top: 3.5rem; }
[data-testid="stMainBlockContainer"] h1 { font-size: 2.25rem; padding-top: 0; }
</style>"""  # a chip holds its whole label, on two lines if need be (Streamlit cuts it "Performe…"); less blank
# above the title (Streamlit's 6rem), so that a page's first chart starts higher in the window


# The box of the first element matching SELECTOR brought whole into the window, once per TOKEN in the browser (once
# per element drawn when TOKEN is empty: a page opened anew, not a widget's rerun). It waits for the element; if any
# of it lies under Streamlit's header bar or below the window, it scrolls the main area by the least that shows it
# whole (a box taller than the room gets its top just under the header). It holds that until the app's script has
# been idle for HOLD ms, against late layout (elements above it go when the run ends) and the browser's scroll
# anchoring (a page opened from a scrolled page keeps that scroll), and lets go at once when the reader scrolls,
# clicks or types (never fought), or after WAIT ms. The mark is kept by the browser
# (window.attnLabView, or on the element): one kept on the server is set before the browser has the script, which a
# rerun may drop unsent.
VIEW_WAIT_MS, VIEW_HOLD_MS = 20_000, 3_000
INTO_VIEW = """<script>(() => {
  const token = "TOKEN";
  if (token && window.attnLabView === token) return;
  if (token) window.attnLabView = token;
  const until = Date.now() + WAIT, events = ["wheel", "touchstart", "keydown", "mousedown"];
  let held = null, idle = null, done = false;
  const stop = () => { done = true; events.forEach(e => window.removeEventListener(e, stop, true)); };
  events.forEach(e => window.addEventListener(e, stop, true));
  const tick = () => {
    if (done || (token && window.attnLabView !== token)) return stop();
    const main = document.querySelector('[data-testid="stMain"]');
    const box = main?.querySelector(SELECTOR);  // found anew each time: a rerun may replace it
    const mark = "MARK";
    if (box && !token && held === null && box.dataset.attnLabViewed === mark) return stop();  // shown already
    if (box && box.getBoundingClientRect().height > 0) {
      box.dataset.attnLabViewed = mark;
      const header = document.querySelector('[data-testid="stHeader"]')?.getBoundingClientRect().bottom || 0;
      const b = box.getBoundingClientRect(), room = window.innerHeight - header - 16;
      const by = b.top < header || (b.bottom > window.innerHeight && b.height > room) ? b.top - header - 8
               : b.bottom > window.innerHeight ? b.bottom - window.innerHeight + 8 : 0;
      if (by) main.scrollBy({top: by, behavior: "instant"});  // not smoothly: the next tick reads where it is
      held = held ?? Date.now();
    }
    const running = document.querySelector('[data-testid="stApp"]')?.dataset.testScriptState !== "notRunning";
    idle = running || held === null ? null : idle ?? Date.now();
    if (Date.now() < until && (idle === null || Date.now() - idle < HOLD)) setTimeout(tick, 100); else stop();
  };
  tick();
})();</script>"""
FIRST_CHART = '[data-testid="stVegaLiteChart"]'


def scroll_into_view(selector: str, token: str = "", mark: str = "") -> None:
    """Bring the first element of the main area matching the CSS `selector` whole into the window, once for each
    `token` in the browser, or (no token) once for each element drawn (not at every redraw: a reader may scroll
    meanwhile). See INTO_VIEW."""
    script = INTO_VIEW.replace("TOKEN", token).replace("SELECTOR", json.dumps(selector)).replace("MARK", mark)
    st.html(script.replace("WAIT", str(VIEW_WAIT_MS)).replace("HOLD", str(VIEW_HOLD_MS)),
            unsafe_allow_javascript=True)


BENCH_CHART = '[class*="st-key-bench_chart_"] [data-testid="stVegaLiteChart"]'


def bench_chart_into_view(job) -> None:
    """The Benchmark page's first chart whole in the window once when a job is shown (a run, a preset, a replay) and
    once more when it ends (the progress line above it goes)."""
    state = bench_state()
    if job is None:
        return
    if state.scrolled_for[0] is not job:  # the job itself, not its id: a new job may reuse a freed one's id
        state.scrolled_for = (job, uuid.uuid4().hex)
    scroll_into_view(BENCH_CHART, f"{state.scrolled_for[1]}-{'ended' if job.done else 'shown'}")


def ensure_routed() -> None:
    """Call first in every page and in the router. The one private Streamlit call of the dashboard, kept here alone
    (tests/engine/test_server.py fails the day Streamlit changes it). A folder named pages/ beside app.py puts a fresh
    server in Streamlit's legacy multipage mode until st.navigation first runs: a deep link as its first request runs
    the page alone (the router never runs, the page has no frame), and "/" runs the router as a legacy page, whose
    widgets then change identity on the next run (a first click is lost). Leave that mode for good (as st.navigation
    itself does) and, on a session's first run, run again so the router resolves the URL. No public API leaves that
    mode, and the layout names the folder pages/."""
    from streamlit.runtime.pages_manager import PagesManager

    st.html(HOUSE_CSS)  # every page and the router call this first: the one place that reaches every page
    # a page's first chart whole in view once drawn, and again when talk mode's type has grown it (a changed mark:
    # the browser runs a script again only when its text changes, so the page's file is in it too)
    page = Path(sys._getframe(1).f_globals.get("__file__", "app")).stem  # the calling page's file
    scroll_into_view(FIRST_CHART, mark=f"{page}-{'talk' if st.session_state.get('talk') else 'plain'}")
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        if not st.session_state:  # a fresh session: no click or value can be lost by running again
            st.rerun()


def session_id() -> str:
    """This browser session's id, made here at its first use and kept in its session state (a reload or a second
    tab is a new session)."""
    if "session_id" not in st.session_state:
        st.session_state["session_id"] = uuid.uuid4().hex
    return st.session_state["session_id"]


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


# The server's jobs (attn_core.engine.server), asked for by this session.

def sweeps() -> Stage:
    """The server's one measuring stage."""
    return server.stage()


def submit(name: str, configs: tuple[SweepConfig, ...]) -> Job:
    """Sweeps run one after another as one job, queued for this session; sweeps that cannot run give a job that
    ended at once with the sentences as its error, which the page shows where a sweep's error goes."""
    return server.submit(name, configs, session_id())


def adopt_running() -> Job | None:
    """The job the server is measuring, watched by this session from now on (a reload, a second tab)."""
    return server.adopt_running(session_id())


def replay(run: Run, points_per_s: float, *, at_once: bool) -> Job:
    """A saved run played back point by point, or (`at_once`) shown whole."""
    return server.replay(run, points_per_s, at_once=at_once)


def seen() -> None:
    """This session shows its page now: the jobs it watches are kept (its heartbeat on the server's stage)."""
    server.seen(session_id())


def keep_watching() -> None:
    """In the router: while this session's job measures or waits, whatever page is shown, say so now and every
    server.HEARTBEAT_S (a fragment that draws nothing), so that a reader on another page keeps the sweep."""
    if bench_state().running:
        st.fragment(seen, run_every=server.HEARTBEAT_S)()
