"""The filtered transformations: see README.md in this folder."""

from ._callback import filter_pure_callback as filter_pure_callback
from ._checkpoint import filter_checkpoint as filter_checkpoint
from ._closure_convert import filter_closure_convert as filter_closure_convert
from ._custom_ad import filter_custom_jvp as filter_custom_jvp
from ._custom_ad import filter_custom_vjp as filter_custom_vjp
from ._eval_shape import filter_eval_shape as filter_eval_shape
from ._grad import filter_grad as filter_grad
from ._grad import filter_value_and_grad as filter_value_and_grad
from ._jacobian import filter_hessian as filter_hessian
from ._jacobian import filter_jacfwd as filter_jacfwd
from ._jacobian import filter_jacrev as filter_jacrev
from ._jvp import filter_jvp as filter_jvp
from ._make_jaxpr import filter_make_jaxpr as filter_make_jaxpr
from ._pmap import filter_pmap as filter_pmap
from ._scan import filter_scan as filter_scan
from ._scan import unrolled_scan as unrolled_scan
from ._split import Slots as Slots
from ._vjp import filter_vjp as filter_vjp
from ._vmap import filter_vmap as filter_vmap
from ._vmap import if_array as if_array
from ._wrapped import follow_wrapped_annotations as follow_wrapped_annotations
from ._wrapped import wrapped_qualname as wrapped_qualname
