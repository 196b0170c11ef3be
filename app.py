"""Attention Lab: the frame and router of the dashboard (`streamlit run app.py`)."""
import streamlit as st
from streamlit.runtime import Runtime
from streamlit.runtime.pages_manager import PagesManager
from streamlit.runtime.scriptrunner import get_script_run_ctx

from attn_core import MECHANISMS
from attn_core.charts import insight as insight_charts, style
from attn_core.engine import env, stage, worker

# Talk mode: type a back row can read, black on white, wide content.
TALK_CSS = """<style>
html { font-size: 21px; }
[data-testid="stAppViewContainer"], [data-testid="stHeader"] { background: #ffffff; color: #000000; }
[data-testid="stMain"] .block-container { max-width: 100%; padding-left: 2rem; padding-right: 2rem; }
[data-testid="stCaptionContainer"], [data-testid="stMarkdownContainer"] p { color: #000000; }
button[kind="primary"] { font-size: 1.15rem; }
button[kind]:disabled, button[kind]:disabled p { color: #6b6b6b !important; }
button[kind]:disabled { border-style: dashed !important; }
</style>"""


@st.cache_resource(show_spinner=False)
def prestart_worker() -> bool:
    """Start the measuring process once per server: it imports torch now, so a first point comes fast later."""
    worker.prestart()
    return True


def session_id() -> str:
    ctx = get_script_run_ctx()
    return ctx.session_id if ctx is not None else ""


def session_alive(session: str) -> bool:
    """Whether a session still has a page open; True where no server runs (AppTest): nothing can be told there."""
    return not Runtime.exists() or Runtime.instance().is_active_session(session)


@st.cache_resource(show_spinner=False)
def sweeps() -> stage.Stage:
    """The server's one measuring stage: sweeps run one at a time, each watched by the sessions that show it."""
    return stage.Stage(session_alive)


def submit(name: str, make, total: int) -> stage.Ticket:
    """Queue a sweep on the server's stage for this session; the ticket answers like the job."""
    desk = sweeps()
    return stage.Ticket(desk, desk.submit(session_id(), name, make), total)


@st.cache_data(ttl=30, show_spinner=False)
def device_line(device: str) -> str:
    info = env.device_info(device)
    return f"{info['name']} · {info['total_memory_bytes'] / 2**30:.0f} GiB · {info['threads']} threads"


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
    """Call first in every page. On a fresh server's first request streamlit is still in its legacy pages/-folder
    mode: a deep link runs the page alone (this router never runs, the page has no frame), and "/" runs this script
    as a legacy page, whose widgets then change identity on the next run (a first click is lost). Leave that mode for
    good (as st.navigation itself does) and, on a session's first run, run again so the router resolves the URL."""
    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        if not st.session_state:  # a fresh session: no click or value can be lost by running again
            st.rerun()


def main() -> None:
    ensure_routed()  # a fresh server's first request, even to "/", would otherwise run this as a legacy page
    talk = bool(st.session_state.get("talk"))
    # talk mode folds the sidebar away (its arrow brings it back, with the switch to leave talk mode)
    st.set_page_config(page_title="Attention Lab", page_icon=":material/monitoring:", layout="wide",
                       initial_sidebar_state="collapsed" if talk else "auto")
    prestart_worker()
    with st.sidebar:
        st.toggle("Talk mode", key="talk", persist_state="session",
                  help="Large type, high contrast, full-width charts, settings folded away.")
        st.caption(f"Measuring on {device_line(env.resolve_device('auto'))}")
    if st.session_state.get("talk"):
        st.html(TALK_CSS)

    st.navigation([
        st.Page("pages/home.py", title="Home", icon=":material/home:", default=True),
        st.Page("pages/learn.py", title="Learn", icon=":material/school:", url_path="learn"),
        st.Page("pages/benchmark.py", title="Benchmark", icon=":material/speed:", url_path="benchmark"),
        st.Page("pages/accuracy.py", title="Accuracy", icon=":material/target:", url_path="accuracy"),
        st.Page("pages/patterns.py", title="Patterns", icon=":material/grid_on:", url_path="patterns"),
        st.Page("pages/theory.py", title="Theory", icon=":material/functions:", url_path="theory"),
        st.Page("pages/compare.py", title="Compare runs", icon=":material/compare_arrows:", url_path="compare"),
    ]).run()


# Pages import this module for ensure_routed; only `streamlit run app.py` (which runs it as __main__) runs the app.
if __name__ == "__main__":
    main()
