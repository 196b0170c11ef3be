"""Layers over the mechanisms: multi-head and latent attention modules, and generation token by token."""
