"""The Benchmark page's settings: the panel a SweepConfig is read from and written to, the URL that carries it (every
setting lives in the link, so a link reproduces a setup; values a widget cannot take are refused first), and what a
click asks for (a sweep, a preset, a saved run), the panel set to match."""
import functools
import math

import streamlit as st
from streamlit.errors import StreamlitAPIException

from attn_core import MEASURED
from attn_core.engine import untrusted
from attn_core.engine import env, positions, presets
from attn_core.engine.config import DEFAULT_SWEEP, SweepConfig, log_spaced
from attn_core.engine.problem import sharing
from attn_core.mechanisms.flex import IMPLEMENTATIONS
from pages import _shared as shared
from pages._shared import ALL_HEADS, KV_HELP, bench_state, kv_choices, kv_text, label

S = st.session_state
NS = [2**k for k in range(4, 18)]
DEVICES = env.available_devices()
# The number widgets' ranges (low, high); the link check reads them too
NUMBERS = {"bench_steps": (1, 16), "bench_d_model": (1, 16384), "bench_heads": (1, 256), "bench_batch": (1, 1024),
           "bench_speed": (0.5, 20.0)}
MODES, AXES = ["forward", "forward+backward", "generate"], ["log-log", "linear"]
BASELINES = ["softmax", "sdpa", "mla_naive"]  # the last: where absorbed MLA overtakes the naive form of the same layer
POSITIONS_HELP = ("Added to every mechanism, its cost measured in the same call: RoPE turns q and k inside it; ALiBi "
                  "passes its bias to mechanisms that take a score bias. " + positions.METHOD)
MODE_HELP = ("forward+backward counts 3× the forward FLOPs. generate: one new token's step against the cache of n "
             "tokens (time per token) and the bytes that cache holds, as a model generating text; always causal, "
             "and only for mechanisms that can generate token by token")
IMPLEMENTATION_HELP = ("Who runs a mechanism defined by a mask (softmax, sliding window, block-local, sparse, "
                       "Longformer, BigBird): our kernel, PyTorch's compiled FlexAttention, or SDPA with a dense "
                       "boolean mask, all under the same pattern. Flex's compile and block mask are one-time costs, "
                       "kept apart from its time; on CPU it runs forward only")
SHOWN_PRESETS = {**presets.PRESETS, presets.QUICK_DEMO.name: presets.QUICK_DEMO}
CURVES = {"spec": "each mechanism's own", "n²": "O(n²)", "n": "O(n)", "roofline": "hardware limit (matmul)"}
keyed = functools.partial(shared.keyed, link=True)  # every setting lives in the URL: a link reproduces a setup


def talk() -> bool:
    return bool(S.get("talk"))


def start(config: SweepConfig) -> None:
    state = bench_state()
    state.preset, state.focus, state.source = None, "time_median_s", None
    state.job, state.own = shared.submit(", ".join(label(k) for k, _ in config.mechanisms), (config,)), True


def stop() -> None:
    bench_state().job.cancel()


def apply_preset(preset: presets.Preset) -> None:
    """Set every control from the preset's first sweep, then queue its sweeps."""
    device = S.get("bench_device") or env.resolve_device("auto")
    configs = preset.for_device(device, S.get("bench_dtype"))
    show_settings(configs[0])
    S["bench_axes"] = "log-log" if preset.log else "linear"
    state = bench_state()
    state.preset, state.focus, state.source = preset.name, preset.metric, None
    state.job, state.own = shared.submit(preset.name, configs), True


def adopt() -> None:
    """A session showing nothing (a reload, a second tab) finds the sweep the server is measuring and watches it."""
    state = bench_state()
    if state.job is not None or (job := shared.adopt_running()) is None:
        return
    state.job, state.own = job, False
    if job.sweeps:
        show_settings(job.sweeps[0])
    state.source = (f"“{untrusted.literal(job.name)}” was started before this page opened (a reload or "
                    "another tab): it is shown here, and Stop stops it for every page showing it.")


def load_saved() -> None:
    """A saved run asked for by Show it or Replay: the panel set to the settings it was measured with, and a line
    saying the charts show that file, what the panel cannot hold, and what Run would do."""
    state = bench_state()
    (run, name, show), state.loaded = state.loaded, None
    config, left = presets.config_of(run.frame) if len(run.frame) else (None, [])
    left = (show_settings(config) if config else []) + left
    state.preset, state.focus = None, "time_median_s"
    state.job, state.own = shared.replay(run, S.get("bench_speed", 3.0), at_once=show), True
    where = " · ".join(str(run.env[k]) for k in ("device_name", "timestamp") if run.env.get(k))
    state.source = (f"Showing the saved run {untrusted.literal(name)}" + (f" ({untrusted.literal(where)})"
                    if where else "") + ". The settings above are the ones it was measured with" +
                    (f", except what the panel cannot hold: {untrusted.literal('; '.join(left))}" if left else "")
                    + ". Run measures them again on this machine.")


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
    kv = p.kv_heads if p.kv_heads != p.heads else None
    S["bench_kv_heads"] = kv if kv in kv_choices(S["bench_heads"]) else ALL_HEADS
    if kv not in (None, S["bench_kv_heads"]):
        left.append(f"key/value heads {kv}")
    own = [f"{label(key)} {sharing(p.heads, params['kv_heads'])}" for key, params in config.mechanisms
           if "kv_heads" in params]
    left += [f"each series' own key/value heads ({', '.join(own)})"] if own else []
    kept = [label(key) + (" · sinks" if params.get("sinks") else "")
            + (f" · keeps first {params['keep_first']}" if params.get("keep_first") else "")
            for key, params in config.mechanisms if params.get("sinks") or params.get("keep_first")]
    left += [f"each series' own sinks and first tokens kept ({', '.join(kept)})"] if kept else []
    S.update({"bench_exact": [k for k in keys if MEASURED[k].exact],
              "bench_approx": [k for k in keys if not MEASURED[k].exact], "bench_n": tuple(near),
              "bench_causal": p.causal, "bench_mode": p.mode, "bench_positions": p.positions})
    S["bench_implementation"] = p.implementation
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
        for p in MEASURED[key].params:
            value = params.get(p.name, p.default)
            try:
                p.check(value)
            except ValueError:  # a file's value the widget cannot hold: its default, and the panel says so
                left.append(f"{p.name} {value}")
                value = p.default
            S[f"bench_p_{key}_{p.name}"] = value
    return left


def settings(folded: bool = False) -> tuple[SweepConfig, list[str]]:
    """The form (`folded`: closed, as in talk mode); returns the sweep it describes and the sentences saying what to
    change."""
    d = DEFAULT_SWEEP
    with st.expander("Settings" + (" (folded away in talk mode)" if talk() else ""), expanded=not (talk() or folded),
                     icon=":material/tune:"):
        # talk mode's large type: two columns to a row
        what, sizes, shape, where = st.columns(2) + st.columns(2) if talk() else st.columns([3, 2, 2, 2])
        exact = what.multiselect("Exact mechanisms", [k for k, s in MEASURED.items() if s.exact],
                                 [k for k, _ in d.mechanisms if MEASURED[k].exact], format_func=label,
                                 **keyed("bench_exact"))
        approx = what.multiselect("Approximate or other scores", [k for k, s in MEASURED.items() if not s.exact],
                                  [k for k, _ in d.mechanisms if not MEASURED[k].exact], format_func=label,
                                  help="Not softmax attention under a mask: an estimate of it, or another score "
                                       "altogether (additive attention); the Accuracy page says which",
                                  **keyed("bench_approx"))
        knobs = [p.name for key in exact + approx for p in MEASURED[key].params]
        names = ", ".join(dict.fromkeys(knobs))
        with what.popover(("Parameters: " + names if len(names) <= 24 else f"Parameters ({len(knobs)})") if knobs
                          else "No parameters to set", help=names or None, icon=":material/settings:",
                          width="stretch", disabled=not knobs, key="bench_params"):
            mechanisms = tuple((key, mechanism_params(key)) for key in exact + approx)
        lengths = "Context lengths n" if S.get("bench_mode") == "generate" else "Sequence lengths n"
        n_min, n_max = sizes.select_slider(lengths, NS, (d.ns[0], d.ns[-1]), format_func="{:,}".format,
                                           **keyed("bench_n"))
        steps = sizes.number_input("Steps, log-spaced", *NUMBERS["bench_steps"], len(d.ns), **keyed("bench_steps"))
        p = d.problem
        d_model = shape.number_input("d_model", *NUMBERS["bench_d_model"], p.d_model, step=64, **keyed("bench_d_model"))
        heads = shape.number_input("Heads", *NUMBERS["bench_heads"], p.heads, **keyed("bench_heads"))
        shares = kv_choices(heads)
        if S.get("bench_kv_heads") not in shares:  # the heads changed under a count that no longer divides them
            if S.get("bench_kv_heads") not in (None, ALL_HEADS):
                st.toast(f"{S['bench_kv_heads']} key/value heads do not divide {heads} heads: back to one for "
                         f"each (MHA). Choose {', '.join(kv_text(g) for g in shares[1:]) or 'none other'} to "
                         "share them.", icon=":material/info:")
            S["bench_kv_heads"] = ALL_HEADS
        kv_heads = shape.selectbox("Key/value heads", shares, format_func=kv_text, help=KV_HELP,
                                   **keyed("bench_kv_heads")) or None
        batch = shape.number_input("Batch", *NUMBERS["bench_batch"], p.batch, **keyed("bench_batch"))
        device = where.selectbox("Device", DEVICES, DEVICES.index(env.resolve_device(p.device)),
                                 **keyed("bench_device"))
        dtypes = env.supported_dtypes(device)
        if S.get("bench_dtype", dtypes[0]) not in dtypes:
            S["bench_dtype"] = dtypes[0]  # the device changed under a dtype it lacks
        dtype = where.selectbox("dtype", dtypes, **keyed("bench_dtype"))
        mode = where.radio("Mode", MODES, **keyed("bench_mode"), help=MODE_HELP)
        causal = where.toggle("Causal mask", p.causal, **keyed("bench_causal"), disabled=mode == "generate",
                              help="generating is causal: a new token has no future" if mode == "generate" else None)
        where_ = where.selectbox("Positions", positions.POSITIONS, format_func=positions.NAMES.get,
                                 help=POSITIONS_HELP, **keyed("bench_positions"))
        for note in filter(None, (positions.note(MEASURED[key], where_) for key in exact + approx)):
            st.caption(note)
        implementation = where.selectbox("Implementation", IMPLEMENTATIONS, help=IMPLEMENTATION_HELP,
                                         **keyed("bench_implementation"))
    config = d.replaced(mechanisms=mechanisms, ns=log_spaced(n_min, n_max, steps), batch=batch, heads=heads,
                        kv_heads=kv_heads, d_model=d_model, dtype=dtype, device=device, mode=mode, causal=causal,
                        positions=where_, implementation=implementation)
    return config, config.problems()


def mechanism_params(key: str) -> dict:
    """Widgets for one mechanism's own parameters, generated from its spec."""
    spec = MEASURED[key]
    if not spec.params:
        return {}
    st.markdown(f"**{spec.label}**: {spec.description}")
    return {p.name: st.number_input(p.name, p.low, p.high, p.default, step=1 if p.kind is int else None,
                                    help=p.help, **keyed(f"bench_p_{key}_{p.name}")) for p in spec.params}


def link_choices() -> dict[str, tuple[list[str], bool]]:
    """What a link may say for each choice setting (the text its widget shows, Streamlit's form in a URL) and
    whether it takes several values at once."""
    dtypes = list(dict.fromkeys(t for device in DEVICES for t in env.supported_dtypes(device)))
    return {"bench_exact": ([label(k) for k, s in MEASURED.items() if s.exact], True),
            "bench_approx": ([label(k) for k, s in MEASURED.items() if not s.exact], True),
            "bench_n": ([f"{n:,}" for n in NS], False),
            "bench_kv_heads": ([kv_text(g) for g in range(NUMBERS["bench_heads"][1] - 1, -1, -1)], False),
            "bench_device": (DEVICES, False),
            "bench_dtype": (dtypes, False), "bench_causal": (["true", "false"], False), "bench_mode": (MODES, False),
            "bench_positions": ([positions.NAMES[k] for k in positions.POSITIONS], False),
            "bench_axes": (AXES, False), "bench_curves": (list(CURVES.values()), True),
            "bench_baseline": ([label(k) for k in BASELINES], False),
            "bench_implementation": (list(IMPLEMENTATIONS), False)}


def link_notes() -> list[str]:
    """Settings in the link that their widget cannot take are taken out of the URL before any widget reads it, and
    the page runs again without them; returns, once, the sentences saying which values were ignored. Numbers out of
    range or unreadable (1e309 raised OverflowError inside Streamlit) and choices a widget does not offer (which
    Streamlit drops without a word) are refused; n written plainly (1024 for 1,024) and TRUE for true are taken."""
    numbers = {key: (low, high, isinstance(low, int)) for key, (low, high) in NUMBERS.items()}
    numbers.update({f"bench_p_{key}_{p.name}": (p.low, p.high, p.kind is int) for key, spec in MEASURED.items()
                    for p in spec.params})
    query = {key: st.query_params.get_all(key) for key in st.query_params.keys()}
    kept, said = untrusted.link_values(query, numbers, link_choices(), plain)
    fix = [key for key in kept if kept[key] != query[key]]
    state = bench_state()
    if [key for key in fix if rewritten(key, kept[key])]:  # all of them, before the rerun
        state.link_notes = said
        st.rerun()
    noted, state.link_notes = state.link_notes, []
    return noted or said


def plain(key: str, value: str) -> str:
    """A link's value in the form its widget shows: n written plainly (1024) as the slider writes it (1,024), TRUE
    as true."""
    if key == "bench_n" and value.isdigit():
        return f"{int(value):,}"
    return value.lower() if key == "bench_causal" else value


def rewritten(key: str, values: list[str]) -> bool:
    """Set `key` in the URL to `values` (none: remove it). True where the page must run again for its widget to read
    the change. False where the widget is bound in this session: Back or Forward brought the value back, and
    Streamlit seeds the widget from the URL itself. It filters choices itself; a refused number is let go here
    (shared.unbind: the widget drawn unbound once, at its default), where Streamlit would seed it (1e309 in a
    whole-number widget raises OverflowError inside Streamlit 1.67, which clears only ValueError and TypeError)."""
    try:
        if values:
            st.query_params[key] = values
        else:
            del st.query_params[key]
    except StreamlitAPIException:
        if not values and key in (starts := number_starts()):
            shared.unbind(key, starts[key])
        return False
    return True


def number_starts() -> dict[str, int | float]:
    """The value each number widget of the panel starts from: a refused link value gives way to it."""
    p = DEFAULT_SWEEP.problem
    return {"bench_steps": len(DEFAULT_SWEEP.ns), "bench_d_model": p.d_model, "bench_heads": p.heads,
            "bench_batch": p.batch, "bench_speed": 3.0,
            **{f"bench_p_{key}_{q.name}": q.default for key, spec in MEASURED.items() for q in spec.params}}
