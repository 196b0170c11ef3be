"""`attn_core.positional`: positions under one name: the encodings and score biases (positions.encodings:
sinusoidal, learned, relative, RoPE, ALiBi), RoPE scaling as a config's `rope_scaling` dict asks for it
(positions.scaling: `rope_inv_freq(head_dim, base, scaling)` for linear, dynamic, yarn and llama3, and
partial_rotary_factor) and Llama 4's query temperature (positions.temperature). A superset of positions.encodings,
which `attn_core` also binds to this name: code written against either reads the same functions."""
from attn_core.positions.encodings import alibi_bias, alibi_slopes, learned, relative_bias, rope, sinusoidal
from attn_core.positions.scaling import (TYPES, apply_partial, rope_inv_freq, rope_scaling_problem, rotary_dim,
                                         scaled_angles, scores_by_offset, trained_length)
from attn_core.positions.temperature import query_scale, temper_queries

__all__ = ["TYPES", "alibi_bias", "alibi_slopes", "apply_partial", "learned", "query_scale", "relative_bias", "rope",
           "rope_inv_freq", "rope_scaling_problem", "rotary_dim", "scaled_angles", "scores_by_offset", "sinusoidal",
           "temper_queries", "trained_length"]
