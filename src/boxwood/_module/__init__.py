"""The Module core: see README.md in this folder for the design.

Besides `Module` and its helpers, this is the flat form's interface for
`filter_jit` (`_jit/`): the warm path's key (`call_key`, `remember_walkable`), the
output builders (`compile_builder`, `merge_leaves`), the flat form a wrapper's
bound method rests on (`rest_on`), the Module classes (`MODULE_TYPES`) and the
static key's strict form of a value (`strict`, `needs_strict`)."""

from ._abstract import AbstractClassVar as AbstractClassVar
from ._abstract import AbstractVar as AbstractVar
from ._bound import as_pytree_function as as_pytree_function
from ._field import field as field
from ._field import static_field as static_field
from ._field_descriptors import set_fields as set_fields
from ._flat_build import compile_builder as compile_builder
from ._flat_form import rest_on as rest_on
from ._flat_key import call_key as call_key
from ._flat_key import merge_leaves as merge_leaves
from ._flat_key import remember_walkable as remember_walkable
from ._module import BoundMethod as BoundMethod
from ._module import Module as Module
from ._module import bind_method as bind_method
from ._register import MODULE_TYPES as MODULE_TYPES
from ._static_key import ValueKey as ValueKey
from ._static_key import needs_strict as needs_strict
from ._static_key import strict as strict
