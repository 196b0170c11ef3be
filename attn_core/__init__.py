"""attn_core: attention mechanisms with one signature, their specs, and honest measurements of their cost."""
from attn_core.nn import generation
from attn_core import masks
from .api import attention, get, make_state
from attn_core.nn.layers import MultiHeadAttention
from attn_core.nn.latent import MultiLatentAttention, LatentCache
from attn_core import positional
from attn_core.positions import rope
from .mechanisms import MEASURED, MECHANISMS
from .mechanisms.sdpa import sdpa_backend
from .spec import MechanismSpec, Param, Shape

__all__ = ["MEASURED", "MECHANISMS", "MechanismSpec", "MultiHeadAttention", "Param", "Shape", "attention", "generation",
           "get", "make_state", "masks", "sdpa_backend"]
__all__ += ["LatentCache", "MultiLatentAttention", "positional", "rope"]

# engine
from .engine import worker
from .engine.env import available_devices, device_info, environment, matmul_gflops, resolve_device, supported_dtypes
from .engine.config import DEFAULT_SWEEP, SweepConfig, log_spaced
from .engine.measurement import Measurement
from .engine.problem import Problem, Settings

# The engine's names that bring pandas, imported at their first use (PEP 562): a process that only measures (the
# measuring worker, spawned for every sweep) or only computes starts without pandas, half a second of each start.
_LAZY = {**dict.fromkeys(("crossovers", "fit_slopes", "summary", "theory_curves"), "analysis"),
         **dict.fromkeys(("Run", "RunFileError", "load_run", "save_run", "to_csv_bytes", "to_json_bytes"), "results"),
         **dict.fromkeys(("Job", "Progress", "run_sweep"), "job")}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'attn_core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"attn_core.engine.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

__all__ += ["DEFAULT_SWEEP", "Job", "Measurement", "Problem", "Progress", "Run", "RunFileError", "SweepConfig",
            "available_devices", "crossovers",
            "device_info", "environment", "fit_slopes", "load_run", "log_spaced", "matmul_gflops", "resolve_device",
            "run_sweep", "save_run", "Settings", "summary", "supported_dtypes", "theory_curves", "to_csv_bytes", "to_json_bytes",
            "worker"]
