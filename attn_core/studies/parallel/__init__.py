"""Sequence parallelism: ring attention, Ulysses and state passing over processes, and their cost model.

task.py: what one run computes (Task) and gives back (Result); schemes.py: the three schemes, one rank's side;
cost.py: the bytes sent and memory held, predicted; launch.py: the processes started, guarded, stopped and collected;
rank.py: one rank's process."""
from attn_core.studies.parallel.cost import (LINKS, attention_shape, bytes_predicted, measured_beside_model,
                                             memory_guard, memory_predicted, overlap_block, required_bytes,
                                             schemes_table)
from attn_core.studies.parallel.launch import (DEFAULT_TIMEOUT_S, LAUNCH_OPTIONS, Cancelled, DistributedError,
                                               check_launch, default_device, free_port, run, run_tasks)
from attn_core.studies.parallel.schemes import (Link, deltanet_state_passing, linear_state_passing,
                                                mamba2_state_passing, ring_attention, ulysses)
from attn_core.studies.parallel.task import (SCHEMES, STATE_MECHANISMS, Result, Task, inputs, mechanism_state,
                                             positions, small_case)

__all__ = ["LINKS", "attention_shape", "bytes_predicted", "measured_beside_model", "memory_guard", "memory_predicted",
           "overlap_block", "required_bytes", "schemes_table", "DEFAULT_TIMEOUT_S", "LAUNCH_OPTIONS", "Cancelled",
           "DistributedError", "check_launch", "default_device", "free_port", "run", "run_tasks", "Link",
           "deltanet_state_passing", "linear_state_passing", "mamba2_state_passing", "ring_attention", "ulysses",
           "SCHEMES", "STATE_MECHANISMS", "Result", "Task", "inputs", "mechanism_state", "positions", "small_case"]
