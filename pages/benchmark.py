"""Benchmark: pick mechanisms and sizes, press Run, watch time and memory grow against the theoretical curves."""
import streamlit as st

from attn_core.engine import presets
from pages import _bench_form as form, _bench_view as view
from pages._shared import bench_state, ensure_routed

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
st.title("Benchmark")
for note in notes:
    st.warning(note, icon=":material/link_off:")
if state.preset or talk:
    st.markdown(f"**{state.preset}**: {form.SHOWN_PRESETS[state.preset].look_for}" if state.preset else
                "**Presets**: one click sets everything and runs.")
per_row = 2 if talk else 4  # talk mode's large type: two to a row, no name cut short
slots = [column for _ in range(0, len(presets.PRESETS), per_row) for column in st.columns(per_row)]
for column, (name, preset) in zip(slots, presets.PRESETS.items()):
    column.button(name, key=f"bench_preset_{name.lower().replace(' ', '_')}", on_click=form.apply_preset,
                  args=(preset,), disabled=busy, width="stretch")
config, problems = form.settings()
for problem in problems:
    st.warning(problem, icon=":material/edit:")
run_col, stop_col, _ = st.columns([1, 1, 2 if talk else 6])
run_col.button("Run", key="bench_run", type="primary", icon=":material/play_arrow:", on_click=form.start,
               args=(config,), disabled=bool(problems) or busy, width="stretch")
stop_col.button("Stop", key="bench_stop", icon=":material/stop:", on_click=form.stop, disabled=not running,
                width="stretch")
if running:  # a bare `a if c else b` line would be written on the page by Streamlit's magic: a stray "None"
    view.live(job)
else:
    view.results_view(job)
if job is not None and job.done and not job.frame().empty:
    view.export_panel(job)
view.replay_panel(busy)
