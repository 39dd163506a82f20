"""The Module core: see README.md in this folder for the design."""

from ._abstract import AbstractClassVar as AbstractClassVar
from ._abstract import AbstractVar as AbstractVar
from ._bound import BoundMethod as BoundMethod
from ._field import field as field
from ._field import static_field as static_field
from ._module import Module as Module
