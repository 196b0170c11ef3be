"""Recall's results as tables and files: the frames the charts read, the provenance and command a results file
keeps, a saved file read back from outside the program, and the reference table shipped beside this file."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from attn_core.api import get
from attn_core.engine.untrusted import clipped, printable
from attn_core.mechanisms import MECHANISMS
from attn_core.studies.recall.training import Result, Setup

SAVED_LIMITS = {"accuracy": (0.0, 1.0), "state_bytes": (0.0, 1e18), "train_s": (0.0, 1e7), "best_lr": (0.0, 1.0)}
SETUP_KEYS = ("vocab", "seq", "pairs", "d_model", "layers", "heads", "steps", "batch", "eval_sequences", "seed")
MAX_SAVED = 64  # results a saved file may hold


def frame(rows: list) -> pd.DataFrame:
    """One row per result (a Result, or its as_dict() as the CLI and the reference file hold it): mechanism (its name
    with parameters), key, label, accuracy, state_bytes, train_s, best_lr, stopped (what the scatter charts read)."""
    rows = [r.as_dict() if isinstance(r, Result) else r for r in rows]
    columns = ["mechanism", "accuracy", "state_bytes", "train_s", "best_lr", "stopped"]
    table = pd.DataFrame([{c: r.get(c) for c in columns} for r in rows], columns=columns)
    for c in ("accuracy", "state_bytes", "train_s", "best_lr"):
        table[c] = pd.to_numeric(table[c], errors="coerce")  # None (no generation form) → NaN
    table.insert(1, "key", table["mechanism"].str.split(":").str[0])
    table.insert(2, "label", [get(k).label if k in MECHANISMS else k for k in table["key"]])
    return table


def curves(points: list) -> pd.DataFrame:
    """One row per recorded step (Points, or dicts of a Point's fields with the mechanism's name and key):
    mechanism, key, lr, step, loss, accuracy, the frame curves_chart reads."""
    columns = ["mechanism", "key", "lr", "step", "loss", "accuracy"]
    return pd.DataFrame([p if isinstance(p, dict) else vars(p) for p in points], columns=columns)


def provenance(results: list[Result], setup: Setup, *, command: str, stamp: dict, note: str = "") -> dict:
    """The reference file's content: the command that made it, the machine and versions (from an environment()
    stamp), the setup, the chance level and each result's as_dict()."""
    machine = (f"{stamp.get('device_name', '?')}, {stamp.get('cpu_count', '?')} cores, {stamp.get('threads', '?')} "
               f"thread(s) used, load average {stamp.get('load_average', '?')} at the end")
    return {"command": command, "machine": machine, "timestamp": stamp.get("timestamp", ""),
            "versions": {"torch": stamp.get("torch", "?"), "python": stamp.get("python", "?")}, "note": note,
            "setup": {"vocab": setup.task.vocab, "seq": setup.task.seq, "pairs": setup.task.pairs,
                      "d_model": setup.d_model, "layers": setup.layers, "heads": setup.heads, "steps": setup.steps,
                      "batch": setup.batch, "lrs": list(setup.lrs), "eval_sequences": setup.eval_sequences,
                      "seed": setup.seed, "chance": setup.task.chance},
            "results": [r.as_dict() for r in results]}


def command_line(names: list[str], setup: Setup) -> str:
    """The `python -m attn_core recall` command that trains `names` (as Result.name writes them) with `setup`: what
    a run made elsewhere (the page) saves as its command, so that it can be made again."""
    flags = {"--mechanisms": ",".join(names), "--seq": setup.task.seq, "--pairs": setup.task.pairs,
             "--vocab": setup.task.vocab, "--d-model": setup.d_model, "--layers": setup.layers,
             "--heads": setup.heads, "--steps": setup.steps, "--batch": setup.batch,
             "--lrs": ",".join(map(str, setup.lrs)), "--eval": setup.eval_sequences, "--seed": setup.seed}
    threads = [] if setup.threads is None else [f"--threads {setup.threads}"]
    return " ".join(["python -m attn_core recall", *(f"{k} {v}" for k, v in flags.items()), *threads,
                     f"--device {setup.device}"])


def read_saved(text: str) -> dict:
    """A results file as `recall --out` writes it (the reference's form; a 'remark' may be added by hand after), from
    outside the program: checked and cleaned (texts cut short, numbers in range, at most MAX_SAVED results).
    ValueError with a sentence otherwise."""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) \
            or not isinstance(data.get("setup"), dict):
        raise ValueError("this is not a recall results file: it must be JSON with 'setup' and 'results', as "
                         "python -m attn_core recall --out writes")
    rows = [_saved_row(i, r) for i, r in enumerate(data["results"][:MAX_SAVED])]
    setup = {}
    for name in SETUP_KEYS:
        value = data["setup"].get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 30:
            raise ValueError(f"the file's setup has {name} = {clipped(repr(value), 40)}, not a whole number from 0 "
                             f"to 2^30; open a file that recall --out wrote")
        setup[name] = value
    setup["chance"] = 1.0 / max(setup["vocab"] - setup["vocab"] // 2, 1)
    versions = data.get("versions") if isinstance(data.get("versions"), dict) else {}
    return {"command": _text(data.get("command", ""), 400), "machine": _text(data.get("machine", ""), 200),
            "note": _text(data.get("note", ""), 600), "remark": _text(data.get("remark", ""), 600),
            "setup": setup, "results": rows,
            "versions": {_text(k, 20): _text(v, 40) for k, v in list(versions.items())[:8]}}


def _text(value: Any, limit: int) -> str:
    """A text from the file as text: control characters and lone surrogates written as escapes, cut to `limit`."""
    return clipped(printable(str(value)), limit)


def _saved_row(i: int, r: Any) -> dict:
    if not isinstance(r, dict) or not isinstance(r.get("mechanism"), str):
        raise ValueError(f"result {i + 1} of the file names no mechanism; open a file that recall --out wrote")
    row = {"mechanism": _text(r["mechanism"], 80)}
    for name, (low, high) in SAVED_LIMITS.items():
        value = r.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not low <= value <= high):
            raise ValueError(f"result {i + 1} of the file has {name} = {clipped(repr(value), 40)}, outside {low:g} to "
                             f"{high:g}; open a file that recall --out wrote")
        row[name] = None if value is None else float(value)
    return row


def reference() -> dict:
    """The reference table shipped with the package (reference.json beside this file): {'command', 'machine',
    'versions', 'note', 'setup', 'results': [Result.as_dict(), ...]}, computed with the CLI on a larger budget."""
    return read_saved((Path(__file__).parent / "reference.json").read_text("utf-8"))
