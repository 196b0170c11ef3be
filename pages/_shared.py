"""What the pages share: widget keys and labels, charts shown and exported, the router's guard, and the server's
sweeps (the one place the dashboard calls the engine's sweep API)."""
import streamlit as st

from attn_core import MECHANISMS
from attn_core.charts import insight as insight_charts, style
from attn_core.engine import stage, worker


def keyed(key: str, *, link: bool = False) -> dict:
    """A widget's stable key, its value kept across page switches; `link`: also in the URL, so a link reproduces
    the setup."""
    return {"key": key, "persist_state": "session", **({"bind": "query-params"} if link else {})}


def label(key: str) -> str:
    return MECHANISMS[key].label


def export_row(chart, frame, stem: str, key: str, *, folded: bool = False) -> None:
    """The chart as PNG and SVG and its data as CSV, in a row of download buttons keyed `{key}_png` etc. (`folded`:
    in a popover, for a page of many figures)."""
    made = insight_charts.downloads(chart, frame, stem)
    if folded:
        with st.popover("Export this figure", icon=":material/download:"):
            places = [st] * len(made)
    else:
        places = st.columns(6)
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


@st.cache_resource(show_spinner=False)
def prestart_worker() -> bool:
    """Start the measuring process once per server: it imports torch now, so a first point comes fast later."""
    worker.prestart()
    return True


@st.cache_resource(show_spinner=False)
def sweeps() -> stage.Stage:
    """The server's one measuring stage: sweeps run one at a time, each watched by the sessions that show it."""
    return stage.Stage(session_alive)


def submit(name: str, make, total: int) -> stage.Ticket:
    """Queue a sweep on the server's stage for this session; the ticket answers like the job."""
    desk = sweeps()
    return stage.Ticket(desk, desk.submit(session_id(), name, make), total)
