"""boxwood: neural networks that are pytrees, for JAX."""

from ._config import config as config
from ._filters import combine as combine
from ._filters import filter as filter
from ._filters import is_array as is_array
from ._filters import is_array_like as is_array_like
from ._filters import is_inexact_array as is_inexact_array
from ._filters import is_inexact_array_like as is_inexact_array_like
from ._filters import partition as partition
from ._jit import CacheInfo as CacheInfo
from ._jit import filter_jit as filter_jit
from ._module import AbstractClassVar as AbstractClassVar
from ._module import AbstractVar as AbstractVar
from ._module import Module as Module
from ._module import field as field
from ._pretty import tree_pformat as tree_pformat
from ._pretty import tree_pprint as tree_pprint
from ._tree import apply_updates as apply_updates
from ._tree import tree_at as tree_at
from ._tree import tree_equal as tree_equal
from ._warnings import PerformanceWarning as PerformanceWarning
from ._warnings import RecompileWarning as RecompileWarning

# transformations (other than filter_jit)

__version__ = "0.1.0"
