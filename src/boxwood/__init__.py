"""boxwood: neural networks that are pytrees, for JAX."""

from . import nn as nn
from ._ad import filter_grad as filter_grad
from ._ad import filter_value_and_grad as filter_value_and_grad
from ._callback import filter_pure_callback as filter_pure_callback
from ._compilation_cache import (
    disable_compilation_cache as disable_compilation_cache,
)
from ._compilation_cache import (
    enable_compilation_cache as enable_compilation_cache,
)
from ._config import config as config
from ._custom_ad import filter_custom_jvp as filter_custom_jvp
from ._custom_ad import filter_custom_vjp as filter_custom_vjp
from ._eval_shape import filter_eval_shape as filter_eval_shape
from ._filters import combine as combine
from ._filters import filter as filter
from ._filters import is_array as is_array
from ._filters import is_array_like as is_array_like
from ._filters import is_inexact_array as is_inexact_array
from ._filters import is_inexact_array_like as is_inexact_array_like
from ._filters import partition as partition
from ._jit import CacheInfo as CacheInfo
from ._jit import filter_jit as filter_jit
from ._make_jaxpr import filter_make_jaxpr as filter_make_jaxpr
from ._module import AbstractClassVar as AbstractClassVar
from ._module import AbstractVar as AbstractVar
from ._module import Module as Module
from ._module import field as field
from ._partial import Partial as Partial
from ._pretty import tree_pformat as tree_pformat
from ._pretty import tree_pprint as tree_pprint
from ._remat import filter_checkpoint as filter_checkpoint
from ._scan import filter_scan as filter_scan
from ._tree import apply_updates as apply_updates
from ._tree import tree_at as tree_at
from ._tree import tree_equal as tree_equal
from ._vmap import filter_vmap as filter_vmap
from ._vmap import if_array as if_array
from ._warnings import PerformanceWarning as PerformanceWarning
from ._warnings import RecompileWarning as RecompileWarning

__version__ = "0.1.0"
