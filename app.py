"""Attention Lab: the frame and router of the dashboard (`streamlit run app.py`)."""
import streamlit as st

from attn_core.engine import env, server
from pages._shared import ensure_routed, keep_watching

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


@st.cache_data(ttl=30, show_spinner=False)
def device_line(device: str) -> str:
    info = env.device_info(device)
    return f"{info['name']} · {info['total_memory_bytes'] / 2**30:.0f} GiB · {info['threads']} threads"


PAGE_ICON = "📈"  # chart increasing (U+1F4C8)
ensure_routed()  # a fresh server's first request, even to "/", would otherwise run this as a legacy page
talk = bool(st.session_state.get("talk"))
# talk mode folds the sidebar away (its arrow brings it back, with the switch to leave talk mode). The icon is an
# emoji: Streamlit draws it into a data: URL, while a ":material/…:" favicon is fetched from fonts.gstatic.com,
# which fails offline (the navigation's material icons come from the font Streamlit ships, not the network).
st.set_page_config(page_title="Attention Lab", page_icon=PAGE_ICON, layout="wide",
                   initial_sidebar_state="collapsed" if talk else "auto")
server.prestart()  # the measuring worker and the C++ kernels, once per server, without waiting for them
with st.sidebar:
    st.toggle("Talk mode", key="talk", persist_state="session",
              help="Large type, high contrast, full-width charts, settings folded away.")
    st.caption(f"Measuring on {device_line(env.resolve_device('auto'))}")
    keep_watching()  # a sweep this session shows is kept while any page of it is open (draws nothing)
if st.session_state.get("talk"):
    st.html(TALK_CSS)

st.navigation([
    st.Page("pages/home.py", title="Home", icon=":material/home:", default=True),
    st.Page("pages/learn.py", title="Learn", icon=":material/school:", url_path="learn"),
    st.Page("pages/benchmark.py", title="Benchmark", icon=":material/speed:", url_path="benchmark"),
    st.Page("pages/accuracy.py", title="Accuracy", icon=":material/target:", url_path="accuracy"),
    st.Page("pages/patterns.py", title="Patterns", icon=":material/grid_on:", url_path="patterns"),
    st.Page("pages/theory.py", title="Theory", icon=":material/functions:", url_path="theory"),
    st.Page("pages/planner.py", title="Plan a model", icon=":material/stacks:", url_path="planner"),
    st.Page("pages/recall.py", title="Associative recall", icon=":material/psychology:", url_path="recall"),
    st.Page("pages/compare.py", title="Compare runs", icon=":material/compare_arrows:", url_path="compare"),
]).run()
