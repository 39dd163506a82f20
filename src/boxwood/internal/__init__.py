"""Equinox-compatible internals (`equinox.internal`), for libraries built on it
(diffrax, optimistix, lineax) and for code that reaches for them.

This namespace follows Equinox's *internal* API, which Equinox may change from one
release to the next; boxwood follows it on a best-effort basis, and names here are
not covered by boxwood's own stability promise. Prefer the public names
(`boxwood.error_if`, `boxwood.Enumeration`, ...) where they exist.
"""

from .._enum import Enumeration as Enumeration
from .._errors import branched_error_if as branched_error_if
from .._errors import error_if as error_if
from .._module import AbstractClassVar as AbstractClassVar
from .._module import AbstractVar as AbstractVar
from .._unvmap import unvmap_all as unvmap_all
from .._unvmap import unvmap_any as unvmap_any
from .._unvmap import unvmap_max as unvmap_max
from ..debug._backward_nan import debug_backward_nan as debug_backward_nan
from ._closure import closure_to_pytree as closure_to_pytree
from ._getkey import GetKey as GetKey
from ._loops import scan as scan
from ._loops import while_loop as while_loop
from ._nondiff import nondifferentiable as nondifferentiable
from ._nondiff import nondifferentiable_backward as nondifferentiable_backward
from ._omega import ω as ω
from ._static import Static as Static
