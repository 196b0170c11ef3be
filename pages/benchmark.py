"""Benchmark: pick mechanisms and sizes, press Run, watch time and memory grow against the theoretical curves."""
import functools

import streamlit as st

from attn_core import untrusted
from attn_core.engine import env, jobs, presets, stage
from attn_core.engine.config import SweepConfig
from pages import _bench_form as form, _bench_view as view
from pages._shared import ensure_routed, label, session_id, submit, sweeps

ensure_routed()
S = st.session_state


def apply_preset(preset: presets.Preset) -> None:
    """Set every control from the preset's first sweep, then queue its sweeps."""
    device = S.get("bench_device") or env.resolve_device("auto")
    configs = preset.for_device(device, S.get("bench_dtype"))
    form.show_settings(configs[0])
    S.update({"bench_axes": "log-log" if preset.log else "linear", "bench_focus": preset.metric,
              "bench_preset": preset.name, "bench_source": None})
    S["bench_job"] = submit(preset.name, functools.partial(jobs.SweepSequence, configs), points(configs))


def points(configs) -> int:
    return sum(len(c.mechanisms) * len(c.ns) for c in configs)


def start(config: SweepConfig) -> None:
    S.update({"bench_preset": None, "bench_focus": "time_median_s", "bench_source": None})
    S["bench_job"] = submit(", ".join(label(k) for k, _ in config.mechanisms),
                                functools.partial(jobs.SweepSequence, (config,)), points((config,)))


def stop() -> None:
    S["bench_job"].cancel()


def adopt() -> None:
    """A session showing nothing (a reload, a second tab) finds the sweep the server is measuring and watches it."""
    desk = sweeps()
    entry = desk.running()
    if S.get("bench_job") is None and entry is not None:
        desk.watch(session_id(), entry)
        S["bench_job"] = stage.Ticket(desk, entry, entry.job.progress()["total"], own=False)
        if getattr(entry.job, "configs", None):
            form.show_settings(entry.job.configs[0])
        S["bench_source"] = (f"“{untrusted.literal(entry.name)}” was started before this page opened (a reload or "
                             "another tab): it is shown here, and Stop stops it for every page showing it.")


notes = form.link_notes()
if (asked := S.pop("bench_start_preset", None)) in form.SHOWN_PRESETS:  # from Home or Learn: panel set, sweep queued
    apply_preset(form.SHOWN_PRESETS[asked])
if "bench_loaded" in S:
    view.load_saved()
adopt()
job = S.get("bench_job")
running = job is not None and not job.done  # the job shown: its progress ticks, Stop stops it
busy = running and getattr(job, "own", True)  # this session's own: no second Run, preset or replay meanwhile
talk = form.talk()
view.style()
st.title("Benchmark")
for note in notes:
    st.warning(note, icon=":material/link_off:")
picked = S.get("bench_preset")
if picked or talk:
    st.markdown(f"**{picked}**: {form.SHOWN_PRESETS[picked].look_for}" if picked else
                "**Presets**: one click sets everything and runs.")
per_row = 2 if talk else 4  # talk mode's large type: two to a row, no name cut short
slots = [column for _ in range(0, len(presets.PRESETS), per_row) for column in st.columns(per_row)]
for column, (name, preset) in zip(slots, presets.PRESETS.items()):
    column.button(name, key=f"bench_preset_{name.lower().replace(' ', '_')}", on_click=apply_preset, args=(preset,),
                  disabled=busy, width="stretch")
config, problems = form.settings()
for problem in problems:
    st.warning(problem, icon=":material/edit:")
run_col, stop_col, _ = st.columns([1, 1, 2 if talk else 6])
run_col.button("Run", key="bench_run", type="primary", icon=":material/play_arrow:", on_click=start, args=(config,),
               disabled=bool(problems) or busy, width="stretch")
stop_col.button("Stop", key="bench_stop", icon=":material/stop:", on_click=stop, disabled=not running,
                width="stretch")
view.live(job) if running else view.results_view(job)
if job is not None and job.done and not job.frame().empty:
    view.export_panel(job)
view.replay_panel(busy)
