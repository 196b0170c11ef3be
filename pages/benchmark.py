"""Benchmark: pick mechanisms and sizes, press Run, watch time and memory grow against the theoretical curves."""
import streamlit as st

from attn_core.engine import presets
from pages import _bench_form as form, _bench_view as view
from pages._shared import bench_chart_into_view, bench_state, ensure_routed

ensure_routed()
state = bench_state()
notes = form.link_notes()
asked, state.start_preset = state.start_preset, None
if asked in form.SHOWN_PRESETS:  # from Home or Learn: panel set, sweep queued
    form.apply_preset(form.SHOWN_PRESETS[asked])
if state.loaded:
    form.load_saved()
form.adopt()
job = state.job
running, busy = state.running, state.busy  # the job shown ticks and Stop stops it; this session's own blocks a second
talk = form.talk()
view.style()
bench_chart_into_view(job)  # the chart of a run or preset whole in the window
st.title("Benchmark")
for note in notes:
    st.warning(note, icon=":material/link_off:")
shown = job is not None  # a run shown: its chart comes first, the presets and settings after it, folded
setup, controls, charts = (st.container(), st.container(), st.container())
if shown:
    controls, charts, setup = setup, controls, charts
with setup:
    if shown:
        st.subheader("Set up another run")
    if state.preset and not shown:
        st.markdown(f"**{state.preset}**: {form.SHOWN_PRESETS[state.preset].look_for}")
    elif talk:
        st.markdown("**Presets**: one click sets everything and runs.")
    per_row = 2 if talk else 3  # no name cut short at 1280 px with the sidebar open; two in talk mode's large type
    slots = [column for _ in range(0, len(presets.PRESETS), per_row) for column in st.columns(per_row)]
    for column, (name, preset) in zip(slots, presets.PRESETS.items()):
        column.button(name, key=f"bench_preset_{name.lower().replace(' ', '_')}", on_click=form.apply_preset,
                      args=(preset,), disabled=busy, width="stretch")
    config, problems = form.settings(folded=shown)
    for problem in problems:
        st.warning(problem, icon=":material/edit:")
with controls:
    if shown and state.preset:
        st.markdown(f"**{state.preset}**: {form.SHOWN_PRESETS[state.preset].look_for}")
    run_col, stop_col, options_col, _ = st.columns([1, 1, 2, 0.1 if talk else 4])
    run_col.button("Run", key="bench_run", type="primary", icon=":material/play_arrow:", on_click=form.start,
                   args=(config,), disabled=bool(problems) or busy, width="stretch")
    stop_col.button("Stop", key="bench_stop", icon=":material/stop:", on_click=form.stop, disabled=not running,
                    width="stretch")
with charts:
    if running:  # a bare `a if c else b` line would be written on the page by Streamlit's magic: a stray "None"
        view.live(job, options_col)
    else:
        view.results_view(job, options_col)
    if job is not None and job.done and not job.frame().empty:
        view.export_panel(job)
view.replay_panel(busy)
