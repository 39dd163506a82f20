"""`AbstractVar` and `AbstractClassVar`: attributes a concrete subclass must provide."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

_T = TypeVar("_T")

if TYPE_CHECKING:
    # For type checkers an abstract variable is just the variable.
    from typing import Annotated as _Annotated

    AbstractVar = _Annotated[_T, "AbstractVar"]
    AbstractClassVar = ClassVar
else:

    class _AbstractMarker:
        """Result of `AbstractVar[T]`: an annotation that is not a dataclass field."""

        __slots__ = ("kind", "type")

        def __init__(self, kind: str, type_: Any):
            self.kind = kind
            self.type = type_

        def __repr__(self) -> str:
            return f"{self.kind}[{getattr(self.type, '__name__', self.type)}]"

    class AbstractVar(Generic[_T]):
        """Annotates an attribute that concrete subclasses must define.

        A subclass resolves it with a field of the same name, a class attribute, or a
        property. Instantiating a class that leaves one unresolved raises `TypeError`.

        ```python
        class AbstractLayer(boxwood.Module):
            in_features: boxwood.AbstractVar[int]

        class Layer(AbstractLayer):
            in_features: int = boxwood.field(static=True)
        ```
        """

        def __class_getitem__(cls, item: Any) -> _AbstractMarker:
            return _AbstractMarker("AbstractVar", item)

    class AbstractClassVar(Generic[_T]):
        """Like `AbstractVar`, for a class-level attribute (`ClassVar`)."""

        def __class_getitem__(cls, item: Any) -> _AbstractMarker:
            return _AbstractMarker("AbstractClassVar", item)


_STRING_FORM = re.compile(r"^\s*(?:[\w.]+\.)?(AbstractVar|AbstractClassVar)\s*\[")


def abstract_kind(annotation: Any) -> str | None:
    """Return "AbstractVar"/"AbstractClassVar" for an abstract annotation, else None.

    Handles annotations written as strings (`from __future__ import annotations`).
    """
    if isinstance(annotation, str):
        match = _STRING_FORM.match(annotation)
        return match.group(1) if match else None
    kind = getattr(annotation, "kind", None)
    if kind in ("AbstractVar", "AbstractClassVar") and hasattr(annotation, "type"):
        return kind
    return None
