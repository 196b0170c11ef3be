"""Positions: rotary embedding (rope), the encodings and biases a model adds to its tokens or scores (encodings), RoPE
scaling as configs write it (scaling), Llama 4's query temperature (temperature) and the Learn page's scaling figure
(chart). `attn_core.positional` gathers the encodings, scaling and temperature functions under one name."""
