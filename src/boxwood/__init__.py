"""boxwood: neural networks that are pytrees, for JAX."""

from . import _tracebacks as _tracebacks  # first: leaves boxwood's frames out
from . import debug as debug
from . import internal as internal
from . import nn as nn
from . import random as random
from ._caches import clear_caches as clear_caches
from ._checkpoint import Checkpointer as Checkpointer
from ._checkpoint import CheckpointError as CheckpointError
from ._checkpoint import LoadReport as LoadReport
from ._checkpoint import SaveHandle as SaveHandle
from ._checkpoint import (
    default_deserialise_filter_spec as default_deserialise_filter_spec,
)
from ._checkpoint import default_serialise_filter_spec as default_serialise_filter_spec
from ._checkpoint import load as load
from ._checkpoint import load_state_dict as load_state_dict
from ._checkpoint import read_metadata as read_metadata
from ._checkpoint import save as save
from ._checkpoint import state_dict as state_dict
from ._checkpoint import tree_deserialise_leaves as tree_deserialise_leaves
from ._checkpoint import tree_serialise_leaves as tree_serialise_leaves
from ._compilation_cache import (
    disable_compilation_cache as disable_compilation_cache,
)
from ._compilation_cache import (
    enable_compilation_cache as enable_compilation_cache,
)
from ._config import config as config
from ._display import Summary as Summary
from ._display import summary as summary
from ._enum import Enumeration as Enumeration
from ._errors import BoxwoodRuntimeError as BoxwoodRuntimeError
from ._errors import EquinoxRuntimeError as EquinoxRuntimeError
from ._errors import branched_error_if as branched_error_if
from ._errors import error_if as error_if
from ._filters import combine as combine
from ._filters import filter as filter
from ._filters import is_array as is_array
from ._filters import is_array_like as is_array_like
from ._filters import is_inexact_array as is_inexact_array
from ._filters import is_inexact_array_like as is_inexact_array_like
from ._filters import partition as partition
from ._info import info as info
from ._jit import CacheInfo as CacheInfo
from ._jit import filter_jit as filter_jit
from ._module import AbstractClassVar as AbstractClassVar
from ._module import AbstractVar as AbstractVar
from ._module import Module as Module
from ._module import field as field
from ._module import static_field as static_field
from ._partial import Partial as Partial
from ._precision import cast_floating as cast_floating
from ._pretty import tree_pformat as tree_pformat
from ._pretty import tree_pprint as tree_pprint
from ._sharding import ShardingPlan as ShardingPlan
from ._sharding import data_parallel as data_parallel
from ._sharding import filter_shard as filter_shard
from ._sharding import fsdp as fsdp
from ._sharding import make_mesh as make_mesh
from ._sharding import named_shardings as named_shardings
from ._sharding import shard as shard
from ._sharding import shard_batch as shard_batch
from ._sharding import sharding_plan as sharding_plan
from ._sharding import tensor_parallel as tensor_parallel
from ._transforms import filter_checkpoint as filter_checkpoint
from ._transforms import filter_closure_convert as filter_closure_convert
from ._transforms import filter_custom_jvp as filter_custom_jvp
from ._transforms import filter_custom_vjp as filter_custom_vjp
from ._transforms import filter_eval_shape as filter_eval_shape
from ._transforms import filter_grad as filter_grad
from ._transforms import filter_hessian as filter_hessian
from ._transforms import filter_jacfwd as filter_jacfwd
from ._transforms import filter_jacrev as filter_jacrev
from ._transforms import filter_jvp as filter_jvp
from ._transforms import filter_make_jaxpr as filter_make_jaxpr
from ._transforms import filter_pmap as filter_pmap
from ._transforms import filter_pure_callback as filter_pure_callback
from ._transforms import filter_scan as filter_scan
from ._transforms import filter_value_and_grad as filter_value_and_grad
from ._transforms import filter_vjp as filter_vjp
from ._transforms import filter_vmap as filter_vmap
from ._transforms import if_array as if_array
from ._tree import apply_updates as apply_updates
from ._tree import tree_at as tree_at
from ._tree import tree_equal as tree_equal
from ._tree_check import tree_check as tree_check
from ._tree_check import tree_flatten_one_level as tree_flatten_one_level
from ._update_wrapper import module_update_wrapper as module_update_wrapper
from ._version import __version__ as __version__
from ._warnings import CapturedValueWarning as CapturedValueWarning
from ._warnings import PerformanceWarning as PerformanceWarning
from ._warnings import RecompileWarning as RecompileWarning
