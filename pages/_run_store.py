"""The Compare page's history: the runs the local store keeps (attn_core.engine.store), filtered, opened together, renamed,
annotated, exported, imported, deleted or pruned (each deletion confirmed), and an interrupted run's missing points
measured."""
from __future__ import annotations

import streamlit as st

from attn_core.engine import store, untrusted
from attn_core.engine import env
from attn_core.engine.job import Job
from attn_core.engine.measure import format_bytes
from attn_core.engine.results import RunFileError, load_run
from pages import _shared as shared

S = st.session_state
SHOWN = ["id", "created", "name", "machine", "mechanisms", "sizes", "status", "points", "note"]
# Widths (px) that keep the history within the page at 1280 px: a long name, machine, mechanism list or note ends in
# its cell (the whole text on hover), and the grid never scrolls sideways.
WIDTHS = {"id": 40, "created": 125, "name": 100, "machine": 120, "mechanisms": 150, "sizes": 95, "status": 85,
          "points": 50, "note": 45}


def _title(entry: dict) -> str:
    return f"#{entry['id']} {entry['name'] or entry['mechanisms']} ({entry['created'][:10]})"


def _act(action, *args) -> None:
    """Run one change on the store (a writer open for it alone); its refusal is said on the next run."""
    try:
        with store.Store() as kept:
            action(kept, *args)
    except (store.StoreError, RunFileError, OSError) as e:
        S["cmp_store_error"] = str(e)


def history_panel() -> dict:
    """The history table with its controls; the runs asked to be opened, by display name."""
    st.subheader("Kept runs")
    if error := S.pop("cmp_store_error", None):
        st.error(untrusted.literal(error), icon=":material/block:")
    try:
        with store.Store(readonly=True) as kept:
            history, size, path = kept.history(), kept.size_bytes(), kept.path
    except store.StoreError as e:
        st.error(untrusted.literal(e), icon=":material/block:")
        return {}
    st.caption(f"Every sweep measured here is kept as it runs, in {untrusted.literal(path)} "
               f"({format_bytes(size)}, {len(history):,} runs).")
    if history.empty:
        st.caption("No run kept yet: runs measured on the Benchmark page or with `python -m attn_core sweep` appear "
                   "here.")
        _import_panel()
        return {}
    words = st.text_input("Filter", placeholder="a mechanism, machine, status, name or note", max_chars=200,
                          key="cmp_filter").strip().lower()
    shown = history[history[SHOWN].astype(str).agg(" ".join, axis=1).str.lower().str.contains(words, regex=False)]
    table = shown[SHOWN].assign(created=shown["created"].astype(str).str[:16].str.replace("T", " "))
    st.dataframe(table, hide_index=True, key="cmp_history",
                 column_config={c: st.column_config.Column(width=w) for c, w in WIDTHS.items()})
    entries = {int(e["id"]): e for e in history.to_dict("records")}
    opened = st.multiselect("Open together", list(shown["id"]), format_func=lambda i: _title(entries[i]),
                            key="cmp_open")
    runs = {}
    for run_id in opened:
        try:
            with store.Store(readonly=True) as kept:
                runs[_title(entries[run_id])] = kept.run(run_id)
        except (store.StoreError, OSError) as e:
            st.error(f"Run #{run_id} cannot be opened: {untrusted.literal(e)}", icon=":material/block:")
    _manage(entries, list(shown["id"]))
    _import_panel()
    _prune_panel(len(history))
    return runs


def _manage(entries: dict, ids: list[int]) -> None:
    with st.expander("One run: name, note, export, delete, measure what is missing", icon=":material/edit_note:"):
        if not ids:
            st.caption("No run matches the filter.")
            return
        run_id = st.selectbox("Run", ids, format_func=lambda i: _title(entries[i]), key="cmp_pick")
        entry = entries[run_id]
        name = st.text_input("Name", entry["name"], max_chars=200, key=f"cmp_name_{run_id}")
        note = st.text_area("Note", entry["note"], max_chars=2000, key=f"cmp_note_{run_id}")
        if (name, note) != (entry["name"], entry["note"]):
            st.button("Save name and note", key="cmp_save", on_click=_act,
                      args=(lambda kept: (kept.rename(run_id, name), kept.set_note(run_id, note)),))
        left, mid, right = st.columns(3)
        right.button("Delete…", key="cmp_delete", on_click=S.__setitem__, args=("cmp_confirm", ("delete", run_id)))
        try:
            with store.Store(readonly=True) as kept:
                run = kept.run(run_id)
        except (store.StoreError, OSError) as e:  # changed or damaged since it was listed, or busy: said, not raised
            st.error(f"Run #{run_id} cannot be opened: {untrusted.literal(e)}", icon=":material/block:")
            return
        for column, kind, mime in ((left, "json", "application/json"), (mid, "csv", "text/csv")):
            try:  # no larger than an upload takes back: what is exported here can be kept here again
                data = store.export_bytes(run, f".{kind}", f"Run #{run_id}")
            except store.StoreError as e:
                column.caption(untrusted.literal(e))
                continue
            column.download_button(kind.upper(), data, f"run-{run_id}.{kind}", mime, key=f"cmp_export_{kind}",
                                   on_click="ignore")
        if entry["status"] in ("interrupted", "failed"):
            _resume(run_id)


def _resume(run_id: int) -> None:
    try:
        with store.Store(readonly=True) as kept:
            first = store.resumable(kept, run_id)[0]
            here = env.environment(env.resolve_device(str(first.get("device", "auto"))),
                                   str(first.get("dtype", "float32")), None)
            plan = store.resume_plan(kept, run_id, here)
    except (store.StoreError, ValueError) as e:
        st.caption(untrusted.literal(e))
        return
    for note in plan.notes:
        st.warning(untrusted.literal(note), icon=":material/difference:")
    if plan.missing:
        st.button(f"Measure the {plan.missing} missing points", key="cmp_resume", on_click=_start_resume,
                  args=(run_id, plan.sweeps))


def _start_resume(run_id: int, sweeps: tuple) -> None:
    """Queue the missing points on the server's stage, into the same run, and show them on the Benchmark page."""
    state = shared.bench_state()
    try:
        job = Job.measure(f"run #{run_id}, what is missing", sweeps, stage=shared.sweeps(),
                          watcher=shared.session_id(), resume=run_id)
    except ValueError as e:
        job = Job.refused(f"run #{run_id}", str(e))
    state.preset, state.focus, state.source = None, "time_median_s", f"Measuring what run #{run_id} lacks."
    state.job, state.own = job, True
    S["cmp_go_benchmark"] = True


def _import_panel() -> None:
    with st.expander("Keep run files in the store", icon=":material/upload:"):
        files = st.file_uploader("Run files (JSON or CSV)", type=["json", "csv"], accept_multiple_files=True,
                                 key="cmp_import")
        if files:
            st.button("Keep them", key="cmp_import_keep", on_click=_import, args=(files,))


def _import(files) -> None:
    def keep(kept: store.Store) -> None:
        for f in files:
            kept.import_run(load_run(f.getvalue(), name=f.name), f.name)

    _act(keep)


def _prune_panel(count: int) -> None:
    with st.expander("Prune old runs", icon=":material/delete_sweep:"):
        keep = st.number_input("Keep the newest", 0, max(count, 1), min(count, 50), key="cmp_prune_keep")
        st.button(f"Delete all but the newest {keep}…", key="cmp_prune", disabled=keep >= count,
                  on_click=S.__setitem__, args=("cmp_confirm", ("prune", int(keep))))


def confirmations() -> None:
    """A deletion asked for waits here for its confirmation."""
    if S.pop("cmp_go_benchmark", False):
        st.switch_page("pages/benchmark.py")
    asked = S.get("cmp_confirm")
    if not asked:
        return
    what, value = asked
    text = (f"Delete run #{value} and its points? This cannot be undone." if what == "delete" else
            f"Delete every run but the newest {value}? This cannot be undone.")
    st.warning(text, icon=":material/warning:")
    yes, no = st.columns(2)
    action = (lambda kept: kept.delete([value])) if what == "delete" else (lambda kept: kept.prune(keep=value))
    yes.button("Delete", key="cmp_confirm_yes", type="primary", on_click=_confirmed, args=(action,))
    no.button("Keep", key="cmp_confirm_no", on_click=S.pop, args=("cmp_confirm", None))


def _confirmed(action) -> None:
    S.pop("cmp_confirm", None)
    _act(action)
