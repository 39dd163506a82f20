"""`AbstractVar` and `AbstractClassVar`: attributes a concrete subclass must provide."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, get_origin

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


def _is_class_var(annotation: Any) -> bool:
    if isinstance(annotation, str):
        return bool(re.match(r"^\s*(?:[\w.]+\.)?ClassVar\b", annotation))
    return annotation is ClassVar or get_origin(annotation) is ClassVar


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


def own_abstract(cls_name: str, namespace: dict[str, Any]) -> dict[str, str]:
    """The abstract annotations of a class body, `{name: kind}`, removed from its
    `__annotations__` (so that they make no dataclass field). Refuses a bare
    `AbstractVar` and an abstract attribute given a value in the same body."""
    annotations = namespace.get("__annotations__", {})
    own = {}
    for name, annotation in list(annotations.items()):
        if annotation in (AbstractVar, AbstractClassVar):
            raise TypeError(
                f"`{cls_name}.{name}`: cannot use unsubscripted "
                f"`{annotation.__name__}`; write `{annotation.__name__}[SomeType]`."
            )
        kind = abstract_kind(annotation)
        if kind is None:
            continue
        if name in namespace:
            raise TypeError(
                f"`{cls_name}.{name}` is annotated `{kind}[...]`, so it cannot have "
                "value in the same class body: drop the value, or the annotation."
            )
        own[name] = kind
        del annotations[name]
    return own


def unresolved(cls: type) -> tuple[frozenset, frozenset]:
    """`(abstract attributes, abstract class attributes)` that `cls` leaves
    undefined, from base to subclass along its MRO: an abstract annotation declares
    one, a plain annotation (a field, a `ClassVar`) or any class attribute (a value
    set in the body or by a base's `__init_subclass__`, a property, a method)
    resolves it. An `AbstractClassVar` redeclared as `AbstractVar` stays a class
    attribute."""
    variables: set[str] = set()
    class_variables: set[str] = set()
    for kls in reversed(cls.__mro__):
        own = kls.__dict__.get("__boxwood_own_abstract__", {})
        for name, kind in own.items():
            if kind == "AbstractClassVar":
                variables.discard(name)
                class_variables.add(name)
            elif name not in class_variables:
                variables.add(name)
        for name, annotation in kls.__dict__.get("__annotations__", {}).items():
            if name not in own:
                class_variables.discard(name)
                if not _is_class_var(annotation):
                    variables.discard(name)
        for name in kls.__dict__:
            if name not in own:
                variables.discard(name)
                class_variables.discard(name)
    return frozenset(variables), frozenset(class_variables)
