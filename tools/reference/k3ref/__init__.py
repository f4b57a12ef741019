"""k3ref: an independent float64 PyTorch reference of the Kimi K3 text forward pass.

Written from ``shared/docs/K3-MODEL.md`` only (section numbers in comments refer to it).
It is an oracle for ktier's tests, not an engine: everything is float64, nothing is fused,
clarity wins over speed. It must never import ktier code or the ``safetensors`` package,
so that agreement between the two is evidence rather than a shared bug.
"""

from .config import ConfigError, K3Config, load_config, parse_config  # noqa: F401
from .mxfp4 import E2M1_VALUES, dequant_mxfp4  # noqa: F401
from .safetensors_io import Checkpoint, SafeTensorsError, SafeTensorsFile  # noqa: F401
from .model import Model, ModelWeights, SeqState, load_model  # noqa: F401

__all__ = ["ConfigError", "K3Config", "load_config", "parse_config", "E2M1_VALUES", "dequant_mxfp4",
           "Checkpoint", "SafeTensorsError", "SafeTensorsFile", "Model", "ModelWeights", "SeqState",
           "load_model"]
