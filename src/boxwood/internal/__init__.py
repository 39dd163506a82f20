"""Equinox-compatible internals (`equinox.internal`), for libraries built on it
(lineax, optimistix, diffrax) and for code that reaches for them.

This namespace tracks Equinox's *internal* API name for name (`equinox.internal`),
an API that Equinox itself gives no stability guarantee for and may change from
one release to the next. boxwood follows it on a best-effort basis, and names here
are not covered by boxwood's own stability promise. Prefer the public names
(`boxwood.error_if`, `boxwood.Enumeration`, ...) where they exist.
"""

from .._announce import announce_jaxpr_p as announce_jaxpr_p
from .._enum import Enumeration as Enumeration
from .._errors import branched_error_if as branched_error_if
from .._errors import error_if as error_if
from .._module import AbstractClassVar as AbstractClassVar
from .._module import AbstractVar as AbstractVar
from .._unvmap import unvmap_all as unvmap_all
from .._unvmap import unvmap_any as unvmap_any
from .._unvmap import unvmap_max as unvmap_max
from ..debug import announce_transform as announce_transform
from ..debug import backward_nan as debug_backward_nan  # noqa: F401
from ..debug import breakpoint_if as breakpoint_if
from ..debug import inspect_dce as inspect_dce
from ..debug import store_dce as store_dce
from ._buffers import MaybeBuffer as MaybeBuffer
from ._buffers import buffer_at_set as buffer_at_set
from ._buffers import maybe_set_p as maybe_set_p
from ._buffers import select_if_vmap_p as select_if_vmap_p
from ._closure import closure_to_pytree as closure_to_pytree
from ._doc import doc_remove_args as doc_remove_args
from ._doc import doc_repr as doc_repr
from ._export import TreeWLCustom as TreeWLCustom
from ._export import to_onnx as to_onnx
from ._finalise import finalise_eval_jaxpr as finalise_eval_jaxpr
from ._finalise import finalise_fn as finalise_fn
from ._finalise import finalise_jaxpr as finalise_jaxpr
from ._finalise import finalise_jaxpr_as_fn as finalise_jaxpr_as_fn
from ._finalise import finalise_make_jaxpr as finalise_make_jaxpr
from ._finalise import primitive_finalisations as primitive_finalisations
from ._finalise import register_impl_finalisation as register_impl_finalisation
from ._getkey import GetKey as GetKey
from ._loops import scan as scan
from ._loops import while_loop as while_loop
from ._misc import ContainerMeta as ContainerMeta
from ._misc import assert_dce as assert_dce
from ._misc import cached_filter_eval_shape as cached_filter_eval_shape
from ._misc import eval_empty as eval_empty
from ._misc import eval_full as eval_full
from ._misc import eval_zero as eval_zero
from ._misc import hashable_combine as hashable_combine
from ._misc import hashable_partition as hashable_partition
from ._misc import left_broadcast_to as left_broadcast_to
from ._misc import nextafter as nextafter
from ._misc import prevbefore as prevbefore
from ._misc import scan_trick as scan_trick
from ._misc import str2jax as str2jax
from ._noinline import noinline as noinline
from ._noinline import noinline_p as noinline_p
from ._nondiff import nondifferentiable as nondifferentiable
from ._nondiff import nondifferentiable_backward as nondifferentiable_backward
from ._nondiff import nondifferentiable_backward_p as nondifferentiable_backward_p
from ._nontraceable import nonbatchable as nonbatchable
from ._nontraceable import nonbatchable_p as nonbatchable_p
from ._nontraceable import nontraceable as nontraceable
from ._nontraceable import nontraceable_p as nontraceable_p
from ._omega import ω as ω
from ._primitive import filter_primitive_batching as filter_primitive_batching
from ._primitive import filter_primitive_bind as filter_primitive_bind
from ._primitive import filter_primitive_def as filter_primitive_def
from ._primitive import filter_primitive_jvp as filter_primitive_jvp
from ._primitive import filter_primitive_transpose as filter_primitive_transpose
from ._primitive import materialise_zeros as materialise_zeros
from ._progress import AbstractProgressMeter as AbstractProgressMeter
from ._progress import NoProgressMeter as NoProgressMeter
from ._progress import TextProgressMeter as TextProgressMeter
from ._progress import TqdmProgressMeter as TqdmProgressMeter
from ._static import Static as Static
from ._unvmap_prims import unvmap_all_p as unvmap_all_p
from ._unvmap_prims import unvmap_any_p as unvmap_any_p
from ._unvmap_prims import unvmap_max_p as unvmap_max_p
from ._vprim import create_vprim as create_vprim
