"""Multi-query associative recall (MQAR), trained live: what a mechanism can still learn, beside what it costs
(Zoology, Arora et al. 2023, 'Zoology: Measuring and Improving Recall in Efficient Language Models', arXiv 2312.04927).

A sequence holds `pairs` key–value pairs, then queries of earlier keys; a tiny causal model of any mechanism of the
catalogue must output each queried key's value. Softmax attention recalls at any length; a fixed-size state or a
window recalls only what it holds.

The study's public names, from where they live: task.py (the task and its sequences), model.py (the tiny model),
training.py (settings, memory guard, training), results.py (tables, files, the reference)."""
from attn_core.studies.recall.model import Block, RecallModel
from attn_core.studies.recall.results import (MAX_SAVED, SAVED_LIMITS, SETUP_KEYS, command_line, curves, frame,
                                              provenance, read_saved, reference)
from attn_core.studies.recall.task import BOUNDS, IGNORE, MAX_DRAW_SEED, MAX_SEQUENCES, Task, mqar
from attn_core.studies.recall.training import (DEFAULT_MECHANISMS, EVAL_ROWS, EVAL_SEED_OFFSET, MEMORY_ADVICE,
                                               MEMORY_MARGIN, Point, Result, Setup, accuracy, check_mechanism,
                                               eval_rows, held_out_count, memory_problem, peak_bytes, required_bytes,
                                               state_bytes, train, with_setup)

__all__ = ["Block", "RecallModel", "MAX_SAVED", "SAVED_LIMITS", "SETUP_KEYS", "command_line", "curves", "frame",
           "provenance", "read_saved", "reference", "BOUNDS", "IGNORE", "MAX_DRAW_SEED", "MAX_SEQUENCES", "Task",
           "mqar", "DEFAULT_MECHANISMS", "EVAL_ROWS", "EVAL_SEED_OFFSET", "MEMORY_ADVICE", "MEMORY_MARGIN",
           "Point", "Result", "Setup", "accuracy", "check_mechanism", "eval_rows", "held_out_count", "memory_problem",
           "peak_bytes", "required_bytes", "state_bytes", "train", "with_setup"]
