"""Benchmark: pick mechanisms and sizes, press Run, watch time and memory grow against the theoretical curves."""
import functools
import math
import time

import streamlit as st
from streamlit.errors import StreamlitAPIException

import app
from attn_core import MECHANISMS, untrusted
from attn_core.engine import analysis, env, jobs, presets, results, stage, worker
from attn_core.charts import export, scaling
from attn_core.engine.config import DEFAULT_SWEEP, SweepConfig, log_spaced

app.ensure_routed()
S = st.session_state
NS = [2**k for k in range(4, 18)]
DEVICES = env.available_devices()
REDRAW_S = 2.0  # at most this often the charts are redrawn while a sweep measures (the browser's share of the CPU)
TICK_S, FIRST_TICK_S = 2.0, 0.25  # the progress bar's pace; faster until the first points are on the charts
# No animation while points are timed: a browser easing a progress bar draws for the whole transition.
STILL_CSS = "<style>[data-testid='stProgress'] * { transition: none !important; animation: none !important; }</style>"
# Each chart's box: as tall as the screen allows (the chart fills it, title included). In talk mode a chart and its
# title fill the window below Streamlit's header bar, at 1280×720 as at 1920×1080.
CHART_CSS = "".join(f".st-key-bench_chart_{m} {{ flex: 0 0 auto !important; height: auto !important; }} "
                    f".st-key-bench_chart_{m} * {{ height: auto; }} "
                    f".st-key-bench_chart_{m} [data-testid='stVegaLiteChart'] {{ height: HEIGHT !important; }} "
                    for m in scaling.METRICS)
CHART_HEIGHT = {False: "clamp(380px, calc(100vh - 12rem), 1000px)", True: "max(420px, calc(100vh - 4.5rem))"}
# The columns a speaker talks about; the rest of the summary is one click away.
TALK_COLUMNS = ["Mechanism", "time ∝ n^k: k", "memory ∝ n^k: k", "speed-up vs softmax (×)",
                "memory saving vs softmax (×)", "at n (vs softmax)"]
# The number widgets' ranges (low, high); the link check reads them too
NUMBERS = {"bench_steps": (1, 16), "bench_d_model": (1, 16384), "bench_heads": (1, 256), "bench_batch": (1, 1024),
           "bench_speed": (0.5, 20.0)}
MODES, AXES, BASELINES = ["forward", "forward+backward"], ["log-log", "linear"], ["softmax", "sdpa"]
SHOWN_PRESETS = {**presets.PRESETS, presets.QUICK_DEMO.name: presets.QUICK_DEMO}
CURVES = {"spec": "each mechanism's own", "n²": "O(n²)", "n": "O(n)", "roofline": "hardware limit (matmul)"}
talk = bool(S.get("talk"))
keyed = functools.partial(app.keyed, link=True)  # every setting lives in the URL: a link reproduces a setup


def show_settings(config: SweepConfig) -> list[str]:
    """Set every control to `config`, so the panel says what the charts show (a preset, the quick demo, a saved
    run); returns what the panel cannot hold (n goes to the slider's nearest powers of two)."""
    keys = list(dict.fromkeys(k for k, _ in config.mechanisms))
    near = [min(NS, key=lambda x: abs(math.log2(x / n))) for n in (config.ns[0], config.ns[-1])]
    p = config.problem
    numbers = {"bench_steps": len(config.ns), "bench_d_model": p.d_model, "bench_heads": p.heads,
               "bench_batch": p.batch}
    left = [f"{key.removeprefix('bench_')} {value:,}" for key, value in numbers.items()
            if not NUMBERS[key][0] <= value <= NUMBERS[key][1]]
    S.update({key: min(max(value, NUMBERS[key][0]), NUMBERS[key][1]) for key, value in numbers.items()})
    S.update({"bench_exact": [k for k in keys if MECHANISMS[k].exact],
              "bench_approx": [k for k in keys if not MECHANISMS[k].exact], "bench_n": tuple(near),
              "bench_causal": p.causal, "bench_mode": p.mode})
    if log_spaced(*near, len(config.ns)) != tuple(config.ns):
        left.append(f"n = {', '.join(f'{n:,}' for n in config.ns)}")
    if p.device in DEVICES:
        S["bench_device"] = p.device
        if p.dtype in env.supported_dtypes(p.device):
            S["bench_dtype"] = p.dtype
        else:
            left.append(f"dtype {p.dtype}")
    else:
        left.append(f"device {p.device}")
    for key, params in config.mechanisms:
        for p in MECHANISMS[key].params:
            value = params.get(p.name, p.default)
            try:
                p.check(value)
            except ValueError:  # a file's value the widget cannot hold: its default, and the panel says so
                left.append(f"{p.name} {value}")
                value = p.default
            S[f"bench_p_{key}_{p.name}"] = value
    return left


def apply_preset(preset: presets.Preset) -> None:
    """Set every control from the preset's first sweep, then queue its sweeps."""
    device = S.get("bench_device") or env.resolve_device("auto")
    configs = preset.for_device(device, S.get("bench_dtype"))
    show_settings(configs[0])
    S.update({"bench_axes": "log-log" if preset.log else "linear", "bench_focus": preset.metric,
              "bench_preset": preset.name, "bench_source": None})
    S["bench_job"] = app.submit(preset.name, functools.partial(jobs.SweepSequence, configs), points(configs))


def points(configs) -> int:
    return sum(len(c.mechanisms) * len(c.ns) for c in configs)


def start(config: SweepConfig) -> None:
    S.update({"bench_preset": None, "bench_focus": "time_median_s", "bench_source": None})
    S["bench_job"] = app.submit(", ".join(app.label(k) for k, _ in config.mechanisms),
                                functools.partial(jobs.SweepSequence, (config,)), points((config,)))


def stop() -> None:
    S["bench_job"].cancel()


def adopt() -> None:
    """A session showing nothing (a reload, a second tab) finds the sweep the server is measuring and watches it."""
    desk = app.sweeps()
    entry = desk.running()
    if S.get("bench_job") is None and entry is not None:
        desk.watch(app.session_id(), entry)
        S["bench_job"] = stage.Ticket(desk, entry, entry.job.progress()["total"], own=False)
        if getattr(entry.job, "configs", None):
            show_settings(entry.job.configs[0])
        S["bench_source"] = (f"“{untrusted.literal(entry.name)}” was started before this page opened (a reload or "
                             "another tab): it is shown here, and Stop stops it for every page showing it.")


def settings() -> tuple[SweepConfig, list[str]]:
    """The form; returns the sweep it describes and the sentences saying what to change."""
    d = DEFAULT_SWEEP
    with st.expander("Settings" + (" (folded away in talk mode)" if talk else ""), expanded=not talk,
                     icon=":material/tune:"):
        # talk mode's large type: two columns to a row
        what, sizes, shape, where = st.columns(2) + st.columns(2) if talk else st.columns([3, 2, 2, 2])
        exact = what.multiselect("Exact mechanisms", [k for k, s in MECHANISMS.items() if s.exact],
                                 [k for k, _ in d.mechanisms if MECHANISMS[k].exact], format_func=app.label,
                                 **keyed("bench_exact"))
        approx = what.multiselect("Approximate mechanisms", [k for k, s in MECHANISMS.items() if not s.exact],
                                  [k for k, _ in d.mechanisms if not MECHANISMS[k].exact], format_func=app.label,
                                  **keyed("bench_approx"))
        knobs = [p.name for key in exact + approx for p in MECHANISMS[key].params]
        names = ", ".join(dict.fromkeys(knobs))
        with what.popover(("Parameters: " + names if len(names) <= 24 else f"Parameters ({len(knobs)})") if knobs
                          else "No parameters to set", help=names or None, icon=":material/settings:",
                          width="stretch", disabled=not knobs, key="bench_params"):
            mechanisms = tuple((key, mechanism_params(key)) for key in exact + approx)
        n_min, n_max = sizes.select_slider("Sequence lengths n", NS, (d.ns[0], d.ns[-1]), format_func="{:,}".format,
                                           **keyed("bench_n"))
        steps = sizes.number_input("Steps, log-spaced", *NUMBERS["bench_steps"], len(d.ns), **keyed("bench_steps"))
        d_model = shape.number_input("d_model", *NUMBERS["bench_d_model"], d.problem.d_model, step=64, **keyed("bench_d_model"))
        heads = shape.number_input("Heads", *NUMBERS["bench_heads"], d.problem.heads, **keyed("bench_heads"))
        batch = shape.number_input("Batch", *NUMBERS["bench_batch"], d.problem.batch, **keyed("bench_batch"))
        device = where.selectbox("Device", DEVICES, DEVICES.index(env.resolve_device(d.problem.device)),
                                 **keyed("bench_device"))
        dtypes = env.supported_dtypes(device)
        if S.get("bench_dtype", dtypes[0]) not in dtypes:
            S["bench_dtype"] = dtypes[0]  # the device changed under a dtype it lacks
        dtype = where.selectbox("dtype", dtypes, **keyed("bench_dtype"))
        causal = where.toggle("Causal mask", d.problem.causal, **keyed("bench_causal"))
        mode = where.radio("Mode", MODES, **keyed("bench_mode"),
                           help="forward+backward counts 3× the forward FLOPs")
    config = d.replaced(mechanisms=mechanisms, ns=log_spaced(n_min, n_max, steps), batch=batch, heads=heads,
                        d_model=d_model, dtype=dtype, device=device, mode=mode, causal=causal)
    return config, config.problems()


def mechanism_params(key: str) -> dict:
    """Widgets for one mechanism's own parameters, generated from its spec."""
    spec = MECHANISMS[key]
    if not spec.params:
        return {}
    st.markdown(f"**{spec.label}**: {spec.description}")
    return {p.name: st.number_input(p.name, p.low, p.high, p.default, step=1 if p.kind is int else None,
                                    help=p.help, **keyed(f"bench_p_{key}_{p.name}")) for p in spec.params}


def link_choices() -> dict[str, tuple[list[str], bool]]:
    """What a link may say for each choice setting (the text its widget shows, Streamlit's form in a URL) and
    whether it takes several values at once."""
    dtypes = list(dict.fromkeys(t for device in DEVICES for t in env.supported_dtypes(device)))
    return {"bench_exact": ([app.label(k) for k, s in MECHANISMS.items() if s.exact], True),
            "bench_approx": ([app.label(k) for k, s in MECHANISMS.items() if not s.exact], True),
            "bench_n": ([f"{n:,}" for n in NS], False), "bench_device": (DEVICES, False),
            "bench_dtype": (dtypes, False), "bench_causal": (["true", "false"], False), "bench_mode": (MODES, False),
            "bench_axes": (AXES, False), "bench_curves": (list(CURVES.values()), True),
            "bench_baseline": ([app.label(k) for k in BASELINES], False)}


def link_notes() -> list[str]:
    """Settings in the link that their widget cannot take are taken out of the URL before any widget reads it, and
    the page runs again without them; returns, once, the sentences saying which values were ignored. Numbers out of
    range or unreadable (1e309 raised OverflowError inside Streamlit) and choices a widget does not offer (which
    Streamlit drops without a word) are refused; n written plainly (1024 for 1,024) and TRUE for true are taken."""
    limits = {key: (low, high, isinstance(low, int)) for key, (low, high) in NUMBERS.items()}
    limits.update({f"bench_p_{key}_{p.name}": (p.low, p.high, p.kind is int) for key, spec in MECHANISMS.items()
                   for p in spec.params})
    notes, kept = {}, {}
    for key in limits.keys() & st.query_params.keys():
        notes[key] = untrusted.link_number(key, st.query_params.get_all(key), *limits[key])
        kept[key] = [] if notes[key] else st.query_params.get_all(key)
    for key, (allowed, several) in link_choices().items():
        if key in st.query_params:
            raw = st.query_params.get_all(key)
            plain = [f"{int(v):,}" if v.isdigit() and key == "bench_n" else v.lower() if key == "bench_causal" else v
                     for v in raw]
            kept[key], notes[key] = untrusted.link_choice(key, plain, allowed, several)
    fix = [key for key in kept if kept[key] != st.query_params.get_all(key)]
    said = [notes[key] for key in sorted(notes) if notes[key]]
    if [key for key in fix if rewritten(key, kept[key])]:  # all of them, before the rerun
        S["bench_link_notes"] = said
        st.rerun()
    return S.pop("bench_link_notes", []) or said


def rewritten(key: str, values: list[str]) -> bool:
    """Set `key` in the URL to `values` (none: remove it). True where the page must run again for its widget to read
    the change. False where the widget is bound in this session: Back or Forward brought the value back, and
    Streamlit seeds the widget from its own copy of the URL. It filters choices itself; a refused number is cleared
    from that copy here, as Streamlit clears a value it cannot parse (1e309 in a whole-number widget raises
    OverflowError inside Streamlit 1.67, which clears only ValueError and TypeError)."""
    try:
        if values:
            st.query_params[key] = values
        else:
            del st.query_params[key]
    except StreamlitAPIException:
        if not values:
            from streamlit.runtime.state.session_state_proxy import get_session_state  # no public route to it

            with get_session_state().query_params() as params:
                params._initial_query_params.pop(key, None)
                params.remove_param(key)
        return False
    return True


def chart_options(metric: str) -> dict:
    """How a chart is drawn: the current axes, theory curves, baseline, theme and titles."""
    return {"log": S.get("bench_axes") != "linear", "baseline": S.get("bench_baseline") or "softmax",
            "curves": tuple(S.get("bench_curves", ["spec"])), "talk": talk,
            "title": S.get(f"bench_title_{metric}") or None, "subtitle": S.get("bench_subtitle") or None}


def metrics() -> list[str]:
    """The chart metrics, the one the preset focuses on first."""
    first = S.get("bench_focus", "time_median_s")
    return sorted(scaling.METRICS, key=lambda metric: metric != first)


def ticker() -> None:
    """A fragment rerun every TICK_S while a job measures: it advances the job and redraws only the progress bar.
    When points have arrived it asks for a full run, which draws them, at most every REDRAW_S and never more than a
    quarter of the time (3 × the last full run's cost must pass). Every tick and full run holds the worker: no timed
    sample starts until it is over and the browser has drawn what it was sent (worker.hold)."""
    inside = S.get("bench_drawing")  # run inside a full run, which holds the worker from its start to its end
    if not inside:
        worker.hold(True)
    job = S["bench_job"]
    replay = isinstance(job, jobs.Replay)
    if replay:  # points are taken only by the full run that draws them: the count is what the charts show
        if not inside and job.due > job.shown:
            st.rerun()
    else:
        job.poll()
    if job.done:
        st.rerun()  # Run comes back, the table and the exports appear
    p = job.progress()
    eta = f" · about {p['eta_s']:.0f} s left" if p["eta_s"] is not None else ""
    st.progress(min(p["done"] / max(p["total"], 1), 1.0),
                text=f"{p['done']} of {p['total']} points · now {untrusted.literal(p['current'])}{eta}")
    drawn = S.get("bench_drawn", {})
    if (not replay and (drawn.get("job") != id(job) or p["done"] > drawn["points"])
            and time.monotonic() >= drawn.get("ready_at", 0)):
        st.rerun()  # held until the full run has drawn
    if not inside:
        worker.hold(False)


def results_view(job) -> None:
    """Controls, charts and table of the current job's points."""
    if job is None:
        st.info("Choose settings and press Run, or pick a preset: points appear on the charts as they are measured.")
        return
    if S.get("bench_source"):
        st.info(S["bench_source"], icon=":material/folder_open:")
    if job.error:
        st.error(f"The sweep stopped: {untrusted.literal(job.error)}")
    df = job.frame()
    if df.empty:
        st.caption("Waiting for the first point…")
        return
    if talk:  # large type: the curves' pills get a row of their own, no name cut short
        axes, baseline = st.columns([2, 3])
        curves = st.container()
    else:
        axes, curves, baseline = st.columns([1, 2, 2])
    axes.segmented_control("Axes", AXES, default="log-log", required=True, **keyed("bench_axes"))
    curves.pills("Theory curves (dashed)", list(CURVES), default=["spec"], selection_mode="multi",
                 format_func=CURVES.get, **keyed("bench_curves"))
    baseline.segmented_control("Crossover n* against", BASELINES, default="softmax", required=True,
                               format_func=app.label, **keyed("bench_baseline"))
    busy = analysis.contention_summary(df)
    if busy:
        (st.warning if df["disturbed"].any() else st.caption)(busy)
    if job.done and (missing := analysis.baseline_note(df, S.get("bench_baseline") or "softmax")):
        st.info(missing, icon=":material/info:")
    for metric in metrics():
        options = chart_options(metric)
        with st.container(key=f"bench_chart_{metric}"):  # sized to the screen by CHART_CSS; the chart fills it
            st.vega_lite_chart(live_spec(metric).update(df, metric, fit=True, **options), theme=None,
                               width="stretch", height="stretch")
        if note := scaling.chart_note(df, metric, log=options["log"], curves=options["curves"]):
            st.caption(untrusted.literal(note))  # it quotes labels and reasons, from a file when replayed
    if job.done:
        if stopped := analysis.stopped_note(df):
            st.info(stopped, icon=":material/stop_circle:")
        if busy_matmul := analysis.matmul_note(job.result().env):
            st.warning(busy_matmul)
        table = summary(job)
        if talk:  # large type: an HTML table scales with the page's font, a data grid does not
            short = table[[c for c in TALK_COLUMNS if c in table]].set_index("Mechanism")
            st.table(short.style.format({"at n (vs softmax)": "{:,.0f}"}, precision=2, na_rep="—"),
                     border="horizontal")
            with st.expander("Every column of the summary"):
                st.dataframe(table, hide_index=True)
        else:
            st.dataframe(table, hide_index=True)
        for note in analysis.summary_notes(df):
            st.caption(note)
    else:
        st.caption("The summary table (fitted exponents, speed-ups, GFLOP/s) comes when the sweep ends.")


def live_spec(metric: str) -> scaling.LiveSpec:
    """The session's spec of one chart: rebuilt only when its shape changes, new points swapped in otherwise."""
    return S.setdefault("bench_live_specs", {m: scaling.LiveSpec() for m in scaling.METRICS})[metric]


def summary(job):
    """The summary table of a finished job, made once (from all its rows: it may have finished a moment ago)."""
    if S.get("bench_summary", (None,))[0] is not job:
        S["bench_summary"] = (job, scaling.summary_table(job.frame()))
    return S["bench_summary"][1]


def export_panel(job) -> None:
    record = job.result()
    with st.expander("Export", icon=":material/download:"):
        shown = {metric: scaling.figure(record.frame, metric, **chart_options(metric)) for metric in metrics()}
        cols = st.columns(len(shown) + 1)
        for metric, column in zip(shown, cols):
            column.text_input(f"Title of the {scaling.METRICS[metric][3].lower()} chart",
                              placeholder=scaling.default_title(record.frame, metric), **keyed(f"bench_title_{metric}"))
        cols[-1].text_input("Subtitle of both", placeholder=scaling.default_subtitle(record.frame),
                            **keyed("bench_subtitle"))
        for metric, chart in shown.items():
            name = "time" if metric == "time_median_s" else "memory"
            row = st.columns(4)
            row[0].markdown(f"**{scaling.METRICS[metric][3]}** chart")
            for column, (fmt, make, mime) in zip(row[1:], (("PNG", export.chart_png, "image/png"),
                                                           ("SVG", export.chart_svg, "image/svg+xml"),
                                                           ("HTML", export.chart_html, "text/html"))):
                column.download_button(fmt, functools.partial(make, chart), f"attention-{name}.{fmt.lower()}", mime,
                                       key=f"bench_dl_{name}_{fmt.lower()}", on_click="ignore",
                                       icon=":material/download:")
        row = st.columns(4)
        row[0].markdown("**Data, with the environment stamp**")
        row[1].download_button("CSV", functools.partial(results.to_csv_bytes, record), "attention-run.csv",
                               "text/csv", key="bench_dl_csv", on_click="ignore", icon=":material/download:")
        row[2].download_button("JSON", functools.partial(results.to_json_bytes, record), "attention-run.json",
                               "application/json", key="bench_dl_json", on_click="ignore",
                               icon=":material/download:")


def replay_panel() -> None:
    with st.expander("Replay or show a saved run", icon=":material/replay:", expanded=talk and not busy):
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
        S["bench_loaded"] = (run, upload.name, show)  # the panel is drawn: the next run sets it (load_saved)
        st.rerun()


def load_saved() -> None:
    """A saved run asked for by Show it or Replay: the panel set to the settings it was measured with, and a line
    saying the charts show that file, what the panel cannot hold, and what Run would do."""
    run, name, show = S.pop("bench_loaded")
    config, left = presets.config_of(run.frame) if len(run.frame) else (None, [])
    left = (show_settings(config) if config else []) + left
    S.update({"bench_preset": None, "bench_focus": "time_median_s"})
    S["bench_job"] = jobs.Replay(run, S.get("bench_speed", 3.0))
    if show:
        S["bench_job"].shown = len(run.frame)
    where = " · ".join(str(run.env[k]) for k in ("device_name", "timestamp") if run.env.get(k))
    S["bench_source"] = (f"Showing the saved run {untrusted.literal(name)}" + (f" ({untrusted.literal(where)})"
                         if where else "") + ". The settings above are the ones it was measured with" +
                         (f", except what the panel cannot hold: {untrusted.literal('; '.join(left))}" if left else "")
                         + ". Run measures them again on this machine.")


notes = link_notes()
if (asked := S.pop("bench_start_preset", None)) in SHOWN_PRESETS:  # from Home or Learn: panel set, sweep queued
    apply_preset(SHOWN_PRESETS[asked])
if "bench_loaded" in S:
    load_saved()
adopt()
job = S.get("bench_job")
running = job is not None and not job.done  # the job shown: its progress ticks, Stop stops it
busy = running and getattr(job, "own", True)  # this session's own: no second Run, preset or replay meanwhile
st.html(STILL_CSS + f"<style>{CHART_CSS.replace('HEIGHT', CHART_HEIGHT[talk])}</style>")
st.title("Benchmark")
for note in notes:
    st.warning(note, icon=":material/link_off:")
picked = S.get("bench_preset")
if picked or talk:
    st.markdown(f"**{picked}**: {SHOWN_PRESETS[picked].look_for}" if picked else
                "**Presets**: one click sets everything and runs.")
per_row = 2 if talk else len(presets.PRESETS)  # talk mode's large type: two to a row, no name cut short
slots = [column for _ in range(0, len(presets.PRESETS), per_row) for column in st.columns(per_row)]
for column, (name, preset) in zip(slots, presets.PRESETS.items()):
    column.button(name, key=f"bench_preset_{name.lower().replace(' ', '_')}", on_click=apply_preset, args=(preset,),
                  disabled=busy, width="stretch")
config, problems = settings()
for problem in problems:
    st.warning(problem, icon=":material/edit:")
run_col, stop_col, _ = st.columns([1, 1, 2 if talk else 6])
run_col.button("Run", key="bench_run", type="primary", icon=":material/play_arrow:", on_click=start, args=(config,),
               disabled=bool(problems) or busy, width="stretch")
stop_col.button("Stop", key="bench_stop", icon=":material/stop:", on_click=stop, disabled=not running,
                width="stretch")
if running:
    worker.hold(True)  # this run draws: no timed sample competes with it (measure.take_turn waits, 3 s at most)
    S["bench_drawing"] = True
    started = time.monotonic()
    if isinstance(job, jobs.Replay):
        job.poll()  # the points due now, drawn by this run
    # not before this run has drawn them (a tick inside a full run must not ask for another); 5 s at most
    S["bench_drawn"] = {"job": id(job), "points": job.progress()["done"], "ready_at": started + 5}
    pace = (max(1 / job.points_per_s, FIRST_TICK_S) if isinstance(job, jobs.Replay) else
            TICK_S if S["bench_drawn"]["points"] else FIRST_TICK_S)
    st.fragment(ticker, run_every=pace)()
results_view(job)
if running:
    # the next drawing: at once for the first points, then after 3 × this one's cost and at most every REDRAW_S
    wait = max(REDRAW_S, 3 * (time.monotonic() - started)) if S["bench_drawn"]["points"] else 0.0
    S["bench_drawn"]["ready_at"] = time.monotonic() + wait
    S["bench_drawing"] = False
    worker.hold(False)  # the charts are sent; the worker waits for the browser to draw them (a quiet moment)
if job is not None and job.done and not job.frame().empty:
    export_panel(job)
replay_panel()
