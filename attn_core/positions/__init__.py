"""Positions: rotary embedding (RoPE) and the encodings and biases a model adds to its tokens or scores."""
