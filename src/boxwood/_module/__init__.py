"""The Module core: see README.md in this folder for the design."""

from ._abstract import AbstractClassVar as AbstractClassVar
from ._abstract import AbstractVar as AbstractVar
from ._bound import as_pytree_function as as_pytree_function
from ._field import field as field
from ._field import static_field as static_field
from ._field_descriptors import set_fields as set_fields
from ._module import BoundMethod as BoundMethod
from ._module import Module as Module
from ._module import bind_method as bind_method
