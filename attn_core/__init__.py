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
from .engine.analysis import crossovers, fit_slopes, summary, theory_curves
from .engine.env import available_devices, device_info, environment, matmul_gflops, resolve_device, supported_dtypes
from .engine.results import Run, RunFileError, load_run, save_run, to_csv_bytes, to_json_bytes
from .engine.config import DEFAULT_SWEEP, SweepConfig, log_spaced
from .engine.job import Job, Progress, run_sweep
from .engine.measurement import Measurement
from .engine.problem import Problem, Settings

__all__ += ["DEFAULT_SWEEP", "Job", "Measurement", "Problem", "Progress", "Run", "RunFileError", "SweepConfig",
            "available_devices", "crossovers",
            "device_info", "environment", "fit_slopes", "load_run", "log_spaced", "matmul_gflops", "resolve_device",
            "run_sweep", "save_run", "Settings", "summary", "supported_dtypes", "theory_curves", "to_csv_bytes", "to_json_bytes",
            "worker"]
