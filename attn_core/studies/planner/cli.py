"""`python -m attn_core plan MODEL --context N`: what a model's attention holds and costs at N tokens; MODEL is a
built-in model, a model file (Model.to_json) or a Hugging Face config.json, whose weights are counted too."""
from __future__ import annotations

import argparse
import json
import os
import re
from typing import TextIO

from attn_core.cli.common import EXIT_OK, EXIT_USAGE
from attn_core.engine.files import read_regular
from attn_core.engine.measure import format_bytes
from attn_core.engine.untrusted import printable, terminal
from attn_core.studies.planner import builtin, engines, hf_config, roofline
from attn_core.studies.planner import measure as planner_measure, model as planner
from attn_core.studies.planner.devices import DEVICES, find_device, this_machine
from attn_core.studies.planner.weights import Weights, count_weights

NAME = "plan"
MAX_MODEL_BYTES = 1 << 20  # a model file is a few hundred bytes, a config.json a few KB


def add_parser(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser(NAME, help="a model's attention cache, prefill FLOPs and decode reads at a context length")
    pl.add_argument("model", help=f"a built-in model ({', '.join(m.name for m in planner.MODELS.values())}; any "
                                  "case), a model file (JSON, as Model.to_json writes) or a Hugging Face config.json "
                                  "(its weights counted too)")
    pl.add_argument("--context", type=parse_context, default=131072, metavar="N",
                    help="tokens of context: a number, or with k (× 1,024) or M (× 1,048,576): 128k, 1M "
                         "(default 131072, at most 1M)")
    pl.add_argument("--batch", type=int, default=1, help="sequences held at once (default 1)")
    pl.add_argument("--dtype", default=None, help="the cache's dtype: bf16, fp16, fp32 (default: the model's)")
    pl.add_argument("--gpu", default=None, metavar="NAME",
                    help=f"predict decode tokens/s and prefill time on a device by the roofline: {', '.join(DEVICES)}, "
                         "or 'here' (this machine, measured)")
    pl.add_argument("--cache-dtype", default=None, metavar="D",
                    help=f"the cache as engines store it: {', '.join(engines.CACHE_DTYPES)} (scales included)")
    pl.add_argument("--engine", default=None, choices=list(engines.ENGINES),
                    help="hold the cache as this engine does (pages, sliding layers at their window or full size)")
    pl.add_argument("--page", type=int, default=None, metavar="P",
                    help="tokens a page with --engine (default: the engine's, 16 for vLLM)")
    pl.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    pl.add_argument("--measure", action="store_true",
                    help="time each layer kind here and predict the model's prefill time and decode tokens/s")
    pl.add_argument("--check", action="store_true",
                    help="run a scaled-down stack of the model with an MLP of its shape here and print the roofline's "
                         "predicted ÷ measured, prefill and decode (about --budget seconds)")
    pl.add_argument("--budget", type=float, default=10.0, metavar="S",
                    help="seconds the timing of the kinds may take, about (default 10)")


def parse_context(text: str) -> int:
    """'131072', '128k' (× 1,024) or '1M' (× 1,048,576) → tokens; a sentence for anything else."""
    match = re.fullmatch(r"\s*(\d{1,9})\s*([kKmM]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"context {text[:20]!r} is not a number of tokens; write 131072, 128k or 1M")
    return int(match[1]) * {"": 1, "k": 1024, "m": 1 << 20}[match[2].lower()]


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Print the plan of a built-in model, a model file or a config.json; EXIT_USAGE with a sentence when it cannot
    be made."""
    try:
        model, weights, notes = load_model(args.model)
        made = planner.plan(model, args.context, batch=args.batch, dtype=args.dtype)
        held = _held(model, args)
        line = _roofline(model, weights, args)
        predicted = _measured_plan(made, args.budget, err) if args.measure else None
        checked = _checked(model, args, err) if args.check else None
    except (ValueError, OSError, RuntimeError) as e:
        err.write(f"error: {printable(e)}\n")
        return EXIT_USAGE
    if args.json:
        made_dict = made.as_dict()
        made_dict["notes"] += notes
        out.write(json.dumps({**made_dict, **(weights_dict(weights) if weights else {}),
                              **({"engine_cache": held.as_dict()} if held else {}),
                              **({"roofline": line.as_dict(), **_roofline_keys(line)} if line else {}),
                              **({"predicted": predicted.as_dict()} if predicted else {}),
                              **({"roofline_check": checked.as_dict()} if checked else {})}, indent=2) + "\n")
        return EXIT_OK
    _print_plan(made, weights, notes, out)
    if held:
        _print_held(held, out)
    if line:
        _print_roofline(model, weights, line, args, out)
    if predicted:
        _print_prediction(made, predicted, out)
    if checked:
        _print_check(checked, out)
    return EXIT_OK


def _held(model: planner.Model, args: argparse.Namespace) -> engines.EngineCache | None:
    """The cache as --engine holds it, in --cache-dtype, in pages of --page; None where neither is asked for."""
    if args.engine is None and args.cache_dtype is None and args.page is None:
        return None
    return engines.cache_by_engine(model, args.context, dtype=args.cache_dtype or "bfloat16", page_tokens=args.page,
                                   engine=args.engine or "formula", batch=args.batch)


def _roofline(model: planner.Model, weights: Weights | None, args: argparse.Namespace) -> roofline.Roofline | None:
    """The roofline on --gpu ('here': this machine as measured); None without --gpu."""
    if args.gpu is None:
        return None
    device = this_machine() if args.gpu.strip().lower() == "here" else find_device(args.gpu)
    return roofline.roofline(model, device, args.context, batch=args.batch, weights=weights,
                             cache_dtype=args.cache_dtype or "bfloat16")


def _roofline_keys(line: roofline.Roofline) -> dict:
    """The roofline's headline figures at the top level of --json, as scripts read them."""
    return {key: line.as_dict()[key] for key in ("bandwidth_bytes_per_s", "flops_per_s", "decode_tokens_per_s",
                                                  "prefill_seconds")}


def _print_held(held: engines.EngineCache, out: TextIO) -> None:
    out.write(f"  as {held.engine} holds it ({held.dtype}, pages of {held.page_tokens}): {format_bytes(held.bytes)} "
              f"(keys and values {format_bytes(held.kv_bytes)}, states {format_bytes(held.state_bytes)})\n")
    for note in held.notes:
        out.write(f"note: {printable(note)}\n")


def _print_roofline(model: planner.Model, weights: Weights | None, line: roofline.Roofline,
                    args: argparse.Namespace, out: TextIO) -> None:
    crossover = roofline.crossover_context(model, weights, batch=args.batch, cache_dtype=line.cache_dtype)
    out.write(f"  on {line.device}: decode {line.decode_tokens_per_s:,.1f} tokens/s ({line.decode_bound}), "
              f"prefill of {line.context:,} tokens {line.prefill_seconds:.3g} s ({line.prefill_bound}); the cache "
              f"read passes the weights read "
              f"{f'at {crossover:,} tokens' if crossover else 'at no context up to 1M tokens'}\n")
    out.write(f"note: {roofline.METHOD} Device: {printable(line.device_source)}. Weights: "
              f"{printable(line.weights_source)}\n")
    for note in line.notes:
        out.write(f"note: {printable(note)}\n")


def load_model(name: str) -> tuple[planner.Model, Weights | None, list[str]]:
    """The model `name` names: a built-in one, a model file, or a Hugging Face config.json (a JSON object with a
    `model_type`), read by hf_config, its weights counted by count_weights and the notes of both on what they
    assumed or left out (a built-in model read from a config: its weights and notes too). ValueError or OSError
    with a sentence otherwise."""
    if not (os.path.isfile(name) or name.endswith(".json")):
        model = planner.find(name)
        key = model.name.lower()
        return model, builtin.WEIGHTS.get(key), list(builtin.NOTES.get(key, []))
    text = _read_model(name)
    config = _hf_config(text)
    if config is None:
        return planner.Model.from_json(text), None, []
    model, notes = hf_config.from_hf_config(config)
    weights = count_weights(config)
    return model, weights, list(dict.fromkeys([*notes, *weights.notes]))


def _hf_config(text: str) -> dict | None:
    """The file's JSON object where it is a Hugging Face config (it has a `model_type`), parsed as read_config parses
    one (NaN and Infinity kept as markers); None otherwise, and Model.from_json then says what is wrong."""
    try:
        data = hf_config.parse_config(text)
    except ValueError:
        return None
    return data if "model_type" in data else None


def weights_dict(weights: Weights) -> dict:
    """The weights as --json gives them: parameters and bytes, all and those a token uses, and their dtype."""
    return {"parameters": weights.total, "active_parameters": weights.active,
            "weights_bytes": round(weights.bytes), "active_weights_bytes": round(weights.active_bytes),
            "weights_dtype": weights.dtype}


def _print_plan(made: planner.Plan, weights: Weights | None, notes: list[str], out: TextIO) -> None:
    model = made.model
    out.write(f"{terminal(model.name)} at {made.context:,} tokens, batch {made.batch}, cache in {made.dtype}"
              f"{f' ({terminal(model.source, 1000)})' if model.source else ''}\n")
    for p in made.kinds:
        what = "keys and values" if p.kind == "kv" else "recurrent state"
        out.write(f"  {p.layer.count:4d} × {terminal(p.layer.name, 80):32s} {p.layer.mechanism:15s} {what:16s} "
                  f"{format_bytes(p.bytes_per_layer):>10s} a layer, {format_bytes(p.cache_bytes):>10s} in all\n")
    out.write(f"  KV cache {format_bytes(made.kv_cache_bytes)}, recurrent state {format_bytes(made.state_bytes)}; "
              f"prefill attention {made.prefill_flops:.3g} FLOPs; a new token reads "
              f"{format_bytes(made.decode_bytes)}\n")
    if weights:
        out.write(f"  weights: {weights.total:,} parameters, {format_bytes(weights.bytes)} in {weights.dtype}; "
                  f"active a token: {weights.active:,} parameters, {format_bytes(weights.active_bytes)}\n")
    for note in made.notes:
        out.write(f"note: {printable(note)}\n")
    for note in notes:  # the config's reading: its values quoted, so escaped and cut as text from a file
        out.write(f"note: {terminal(note, 1000)}\n")


def _print_prediction(made: planner.Plan, predicted: planner_measure.Prediction, out: TextIO) -> None:
    out.write(f"  predicted prefill of {made.context:,} tokens: {predicted.prefill_s:.3g} s "
              f"({predicted.prefill_method})\n"
              f"  predicted decode: {predicted.tokens_per_s:.3g} tokens/s, {predicted.decode_s:.3g} s a step "
              f"({predicted.decode_method})\n")
    for kind in predicted.kinds:
        out.write(f"    {terminal(kind.layer.name, 80)}: {kind.prefill_method}; {kind.decode_method}\n")
    for note in predicted.notes:
        out.write(f"note: {printable(note)}\n")


def _checked(model: planner.Model, args: argparse.Namespace, err: TextIO) -> planner_measure.RooflineCheck:
    """The roofline checked on a scaled-down stack with its MLPs, run here (about --budget seconds)."""
    err.write("checking the roofline on a scaled-down stack here\n")
    if os.path.isfile(args.model) or args.model.endswith(".json"):
        config = _hf_config(_read_model(args.model))  # a config.json gives the MLP's shape; a model file has none
    else:
        config = builtin.CONFIG.get(model.name.lower())
    return planner_measure.check_roofline(model, config=config, budget_s=args.budget)


def _print_check(got: planner_measure.RooflineCheck, out: TextIO) -> None:
    out.write(f"  roofline check here: prefill of {got.prefill_n:,} tokens predicted {got.prefill_predicted_s:.3g} s, "
              f"measured {got.prefill_measured_s:.3g} s, predicted ÷ measured {got.prefill_ratio:.2f} "
              f"({got.prefill_bound}); decode step at {got.decode_n:,} predicted {got.decode_predicted_s:.3g} s, "
              f"measured {got.decode_measured_s:.3g} s, predicted ÷ measured {got.decode_ratio:.2f} "
              f"({got.decode_bound})\n")
    for note in got.notes:
        out.write(f"note: {terminal(note, 1000)}\n")


def _measured_plan(made: planner.Plan, budget_s: float, err: TextIO) -> planner_measure.Prediction:
    """Time the plan's layer kinds here (about `budget_s` seconds, progress on `err`) and predict from them."""
    timings = planner_measure.measure_kinds(made.model, budget_s=budget_s,
                                            progress=lambda what: err.write(f"timing {what}\n"))
    return planner_measure.predict(made, timings)


def _read_model(path: str) -> str:
    """A model file's text, at most 1 MiB (a model is a few hundred bytes); a folder, pipe or device is refused
    (read_regular), not waited on."""
    data = read_regular(path, MAX_MODEL_BYTES + 1)  # one past the limit: enough to tell a larger file
    if len(data) > MAX_MODEL_BYTES:
        raise ValueError(f"{path} is larger than 1 MiB: it is not a model file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: it is not a model file") from None
