"""A file given to the planner: the planner's own model file (Model.to_json) or a Hugging Face config.json, told
apart by its fields, read into one model, its weights where the file gives them, and the notes on what was assumed.

    read_upload(open("config.json", "rb").read()).model   # a config.json: from_hf_config, weights counted
"""
from __future__ import annotations

from dataclasses import dataclass, field

from attn_core.engine.untrusted import clipped, printable
from attn_core.studies.planner import hf_config
from attn_core.studies.planner.model import Model
from attn_core.studies.planner.weights import Weights, count_weights

MAX_UPLOAD = 1 << 20  # a model file is a few hundred bytes, a config.json a few KB
HF_MARKS = ("model_type", "num_hidden_layers", "architectures", "text_config")  # fields only a config.json has


@dataclass(frozen=True)
class Upload:
    """What a file gave: its `model`, which `kind` of file it was ('config.json' or 'model file'), the `config` dict
    (a config.json's, for its layer order), the counted `weights` (None when the file gives none) and the `notes`."""

    model: Model
    kind: str
    config: dict | None = None
    weights: Weights | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def is_hf_config(data: object) -> bool:
    """A JSON object with any of the fields a Hugging Face config has and a model file lacks (HF_MARKS)."""
    return isinstance(data, dict) and "layers" not in data and any(k in data for k in HF_MARKS)


def read_upload(raw: bytes) -> Upload:
    """The model of an uploaded file: a config.json through hf_config.from_hf_config (its weights through
    count_weights; a count that fails is a note, not a refusal), else Model.from_json. ValueError with a sentence
    naming what to change otherwise."""
    if len(raw) > MAX_UPLOAD:
        raise ValueError(f"the file is {len(raw):,} bytes, over the {MAX_UPLOAD:,} a model file or a config.json "
                         "needs; choose the model's config.json")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError("the file is not UTF-8 text; choose a config.json or a model file (JSON)") from None
    try:
        data = hf_config.parse_config(text)
    except ValueError:
        data = None
    if not is_hf_config(data):
        return Upload(Model.from_json(text), "model file")
    model, notes = hf_config.from_hf_config(data)
    try:
        weights = count_weights(data)
        notes = [*notes, *weights.notes]
    except ValueError as e:  # the cache can be planned without them: the page asks for the count instead
        weights = None
        notes.append(f"the weights could not be counted: {clipped(printable(e), 200)}")
    return Upload(model, "config.json", data, weights, tuple(dict.fromkeys(notes)))


def describe(upload: Upload) -> str:
    """One line on what the file was read as."""
    return f"read as a {upload.kind}" + (f", {len(upload.notes)} note(s) below" if upload.notes else "")


