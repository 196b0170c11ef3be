"""attn_core: attention mechanisms with one signature, their specs, and honest measurements of their cost."""
from . import masks
from .api import attention, get, make_state
from .layers import MultiHeadAttention
from .mechanisms import MECHANISMS
from .mechanisms.sdpa import sdpa_backend
from .spec import MechanismSpec, Param, Shape

__all__ = ["MECHANISMS", "MechanismSpec", "MultiHeadAttention", "Param", "Shape", "attention", "get", "make_state",
           "masks", "sdpa_backend"]
