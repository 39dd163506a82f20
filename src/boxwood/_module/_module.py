"""`Module`: a frozen dataclass that is a pytree, with construction-time checks."""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import types
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

from .._tracebacks import hide_own_frames
from . import _flat_form, _reload
from ._abstract import own_abstract, unresolved
from ._checks import MSG_FROZEN, MSG_METHOD, MSG_POST_INIT
from ._construct import INITIALISING, InitGuard, construct, is_abstract, rebuild
from ._field import converter_of, field, is_static, static_field
from ._field_descriptors import install_fields
from ._register import REBUILD_NAME, register
from ._slots import Instance, instance_dict, set_dict
from ._static_key import StaticKey
from ._user_dict import FieldsDict, replace_fields

try:  # Python >= 3.11
    from typing import dataclass_transform
except ImportError:  # pragma: no cover - Python 3.10
    from typing_extensions import dataclass_transform

# Module classes that keep a field in `__slots__`: JAX's rebuild sets their fields
# one by one (`_construct.rebuild`).
SLOTTED: set[type] = set()
_new = object.__new__

# Equinox's internal names for these, which libraries that construct modules
# themselves import from `equinox._module._module` (quax's fast construction path).
_currently_initialising = InitGuard()
is_abstract_module = is_abstract


# Type checkers see each subclass as a dataclass: its fields, and the `__init__`
# they make unless the class defines its own.
@dataclass_transform(field_specifiers=(dataclasses.field, field, static_field))
class _ModuleMeta(abc.ABCMeta):
    def __new__(
        mcs, name, bases, namespace, *, strict=False, is_abstract=False, **kwargs
    ):
        # Equinox's class keywords: `strict` is accepted and ignored (Equinox 0.13
        # ignores it too, except that `strict=None` meant abstract), `is_abstract=True`
        # forbids instantiating this class itself (not its subclasses).
        is_abstract = bool(is_abstract) or strict is None
        own = own_abstract(name, namespace)
        cls: Any = super().__new__(mcs, name, bases, namespace, **kwargs)
        dataclass_init = _has_dataclass_init(cls)
        cls._boxwood_dataclass_init = dataclass_init
        if not dataclass_init and hasattr(cls, "__post_init__"):
            warnings.warn(MSG_POST_INIT.format(cls=cls), UserWarning, stacklevel=2)
        init_doc = cls.__init__.__doc__ if bases else None
        cls.__boxwood_own_abstract__ = own
        cls.__abstractvars__, cls.__abstractclassvars__ = unresolved(cls)
        cls.__boxwood_abstract__ = cls.__abstractvars__ | cls.__abstractclassvars__
        cls._boxwood_is_abstract = is_abstract
        dataclasses.dataclass(cls, init=dataclass_init, repr=False, eq=False)
        fields = dataclasses.fields(cls)
        _check_field_names(name, fields)
        if dataclass_init:
            cls.__init__.__doc__ = init_doc  # as inherited, not the dataclass's None
            _converter_annotations(cls.__init__, fields)
        _record_fields(cls, fields)
        register(
            cls,
            data_fields=list(cls._boxwood_data),
            meta_fields=list(cls._boxwood_static),
        )
        install_fields(cls, fields)
        # What the class holds now, after `__init_subclass__` and the base
        # metaclasses: a hook's replacement of a method stays (the class body's
        # function is not installed again over it).
        _install_methods(cls)
        if cls._boxwood_slots:
            SLOTTED.add(cls)
        type.__setattr__(cls, "_boxwood_built", cls)
        _reload.install(_Method)  # `%autoreload`'s rule for Module classes, once loaded
        return cls

    def __setattr__(cls, name: str, value: Any) -> None:
        # A function set on a finished class (a decorator, a later patch, a
        # metaclass hook after `__new__`) binds as the class body's functions
        # do: a `BoundMethod`. During `__new__` (`__init_subclass__`), the class
        # is left as Python leaves it; `_install_methods` runs after.
        if cls.__dict__.get("_boxwood_built") is cls and _is_method(cls, name, value):
            value = _Method(value)
        type.__setattr__(cls, name, value)

    def __call__(cls, /, *args, **kwargs):  # (a field may be named `cls`)
        if args or kwargs.get(REBUILD_NAME).__class__ is not StaticKey:
            return construct(cls, args, kwargs)
        return _rebuilt(cls, kwargs)

    def __init_subclass__(mcs, **kwargs: Any) -> None:
        # A metaclass built on this one (a library's) may define its own
        # `__call__`: it runs for its users' calls, while JAX's rebuild, which also
        # calls the class, still gets the instance dict it expects.
        super().__init_subclass__(**kwargs)
        own = mcs.__dict__.get("__call__")
        if own is not None and not hasattr(own, "_boxwood_rebuilds"):
            type.__setattr__(mcs, "__call__", _rebuilding(own))

    # `inspect.signature(cls)` would otherwise show `__call__`'s `(*args, **kwargs)`
    @property
    def __signature__(cls) -> inspect.Signature:
        signature = inspect.signature(cls.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])


def _rebuilt(cls: Any, values: dict) -> Any:
    """JAX's rebuild (`_register.py`): the keywords, a fresh dict, become the
    instance dict."""
    if SLOTTED and cls in SLOTTED:
        return rebuild(cls, values)
    obj = _new(cls)
    set_dict(obj, values)
    return obj


def _rebuilding(call: Callable) -> Callable:
    """A metaclass's own `__call__`, which JAX's rebuilds bypass."""

    @functools.wraps(call)
    def __call__(cls, /, *args, **kwargs):
        if args or kwargs.get(REBUILD_NAME).__class__ is not StaticKey:
            return call(cls, *args, **kwargs)
        return _rebuilt(cls, kwargs)

    __call__._boxwood_rebuilds = True  # pyright: ignore[reportAttributeAccessIssue]
    return __call__


def _has_dataclass_init(cls: Any) -> bool:
    """Whether `cls` gets a dataclass `__init__`: neither it nor a base (a Module
    or any other class before the first Module along the MRO) defines one."""
    if "__init__" in cls.__dict__:
        return False
    for kls in cls.__mro__[1:-1]:
        if "_boxwood_dataclass_init" in kls.__dict__:
            return kls._boxwood_dataclass_init
        if kls.__init__ is not object.__init__:
            return False
    return True  # `Module` itself


def _converter_annotations(init: Any, fields: tuple) -> None:
    """A converted field's `__init__` parameter takes what its converter takes."""
    annotations = init.__annotations__
    for f in fields:
        converter = converter_of(f)
        if converter is None or f.name not in annotations:
            continue
        try:
            parameters = list(inspect.signature(converter).parameters.values())
        except (TypeError, ValueError):  # no signature (`str`, some builtins)
            parameters = []
        first = parameters[0].annotation if parameters else inspect.Parameter.empty
        annotations[f.name] = Any if first is inspect.Parameter.empty else first


def _record_fields(cls: Any, fields: tuple) -> None:
    cls._boxwood_fields = fields
    cls._boxwood_field_names = frozenset(f.name for f in fields)
    cls._boxwood_static = tuple(f.name for f in fields if is_static(f))
    cls._boxwood_data = tuple(f.name for f in fields if not is_static(f))
    cls._boxwood_converters = tuple(
        (f.name, converter_of(f)) for f in fields if converter_of(f) is not None
    )
    # Equinox's order: along the MRO, the subclass's check first
    cls._boxwood_check_inits = tuple(
        k.__dict__["__check_init__"]
        for k in cls.__mro__
        if "__check_init__" in k.__dict__
    )
    cls._boxwood_slots = any(
        isinstance(k.__dict__.get(f.name), types.MemberDescriptorType)
        for f in fields
        for k in cls.__mro__
    )


RESERVED_PREFIX = "_boxwood_"


def _check_field_names(cls_name: str, fields: tuple) -> None:
    """Reject field names that boxwood uses itself (`_boxwood_flat`, ...)."""
    for f in fields:
        if f.name.startswith(RESERVED_PREFIX):
            raise TypeError(
                f"`{cls_name}.{f.name}`: field names starting with "
                f"{RESERVED_PREFIX!r} are reserved for boxwood's own bookkeeping. "
                "Rename the field."
            )


class _Method:
    """A method of a module class. Read on an instance it gives a `BoundMethod`
    (below, `bind_method`): a module whose child is the instance, so `model.method` is a
    pytree with the model's leaves (as in Equinox). Read on the class it gives the
    plain function. A non-data descriptor: an instance dict entry of the same name
    wins. Called directly (`cls.__dict__["f"](self, x)`, as a hook that wraps
    what the class holds may do), it is the function."""

    def __init__(self, func: Callable) -> None:
        self.func = func
        # the function's own, not `_Method`'s (`doctest` and `inspect` read them)
        for name in ("__module__", "__doc__"):
            setattr(self, name, getattr(func, name, None))
        self.__wrapped__ = func

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.func
        return bind_method(self.func, obj)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # `__name__`, `__isabstractmethod__`, ...
        # Only once `func` is set: a copy made without `__init__` (`copy`,
        # `pickle`, IPython's autoreload) looks up attributes before that.
        try:
            func = self.__dict__["func"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(func, name)


def _is_magic(name: str) -> bool:
    # IPython's display hooks (`_repr_html_`, ...) too: a front end such as
    # treescope takes only a real bound method for one
    hook = name.startswith(("_repr_", "_ipython_")) and name.endswith("_")
    return hook or (name.startswith("__") and name.endswith("__"))


def _is_method(cls: Any, name: str, value: Any) -> bool:
    """Whether `value`, held by `cls` as `name`, binds as a `BoundMethod`: a plain
    function under `__call__` or a name that is not a dunder, and not a field's
    default."""
    return (
        isinstance(value, types.FunctionType)
        and (name == "__call__" or not _is_magic(name))
        and name not in cls._boxwood_field_names
    )


def _install_methods(cls: Any) -> None:
    """Make the plain functions the class holds (`__call__` and every method
    whose name is not a dunder) `_Method`s, so that bound methods are pytrees."""
    if cls.__dict__.get("_boxwood_plain_methods"):
        return
    for name, value in list(cls.__dict__.items()):
        if _is_method(cls, name, value):
            type.__setattr__(cls, name, _Method(value))


class Module(Instance, metaclass=_ModuleMeta):
    """Base class for models: a frozen dataclass registered as a JAX pytree.

    Fields are pytree children (dynamic) unless declared with
    `boxwood.field(static=True)`, in which case they live in the treedef. Subclasses
    may define `__init__`, assigning `self.name = value` for every field; after
    `__init__` the instance is immutable (use [`boxwood.tree_at`][] to make modified
    copies). `__check_init__`, if defined, runs after `__init__` and the converters.

    ```python
    class Linear(boxwood.Module):
        weight: jax.Array
        bias: jax.Array
        activation: Callable = boxwood.field(static=True)

        def __call__(self, x):
            return self.activation(self.weight @ x + self.bias)
    ```
    """

    _boxwood_fields: ClassVar[tuple]
    _boxwood_field_names: ClassVar[frozenset]
    _boxwood_dict_fields: ClassVar[frozenset]
    _boxwood_static: ClassVar[tuple[str, ...]]
    _boxwood_data: ClassVar[tuple[str, ...]]
    # The flat form `(token, leaves)` that `filter_jit` may keep in an instance's
    # dict (see `boxwood/_module/_flat_form.py`); this class attribute is the default.
    _boxwood_flat = None

    # `vars(module)`: a copy of the fields whose writes reach the module
    # (`_user_dict.py`); boxwood's own code reads the instance dict through
    # `instance_dict`
    __dict__ = property(  # pyright: ignore[reportGeneralTypeIssues, reportAssignmentType]
        FieldsDict, replace_fields
    )

    def __getstate__(self) -> dict:
        # pickle and copy: the flat form is a cache, not state
        return _flat_form.state(self)

    def __setstate__(self, state: dict) -> None:
        # unpickling and copying (otherwise they would write to `__dict__`)
        instance_dict(self).update(state)

    def __setattr__(self, name: str, value: Any) -> None:
        if id(self) not in INITIALISING:
            if name == "__orig_class__":  # `SomeModule[int]()` sets it (typing)
                object.__setattr__(self, name, value)
                return
            raise dataclasses.FrozenInstanceError(
                MSG_FROZEN.format(cls=type(self).__name__, name=name)
            )
        if name not in type(self)._boxwood_field_names:
            raise AttributeError(
                f"Cannot set `{type(self).__name__}.{name}`: it is not a field. Declare "
                f"it in the class body (`{name}: SomeType`) so that it becomes part of "
                "the pytree."
            )
        if callable(value) and getattr(value, "__self__", None) is self:
            raise ValueError(MSG_METHOD.format(cls=type(self).__name__, name=name))
        if name in type(self)._boxwood_dict_fields:  # (its `_Field` would do this)
            instance_dict(self)[name] = value
        else:  # a slot, a property's setter
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(
            MSG_FROZEN.format(cls=type(self).__name__, name=name)
        )

    def __eq__(self, other: object):
        from .._tree import tree_equal

        return tree_equal(self, other)

    def __hash__(self) -> int:
        import jax

        leaves, treedef = jax.tree_util.tree_flatten(self)
        try:
            return hash((treedef, tuple(leaves)))
        except TypeError:
            # Arrays can't be hashed by value. Hashing by identity keeps the
            # contract (equal objects hash equally) for the only object that can be
            # compared equal cheaply, itself, and lets `jax.jit(model)` cache on it.
            return object.__hash__(self)

    def __repr__(self) -> str:
        from .._pretty import tree_pformat

        return tree_pformat(self)

    def _repr_html_(self) -> str:
        """What a notebook shows for a module that ends a cell: a collapsible tree
        (treescope's rendering once treescope is IPython's default renderer)."""
        from .._display import notebook_html

        return notebook_html(self)

    def __treescope_repr__(self, path: Any, subtree_renderer: Any) -> Any:
        """The module as its constructor in treescope (an optional extra)."""
        from .._display import treescope_repr

        return treescope_repr(self, path, subtree_renderer)


class BoundMethod(Module):
    """`instance.func` as a pytree: `instance` is a child, `func` is static.

    Reading a method on a module instance (`model.__call__`, `model.encode`) gives
    one (see `_Method`): its leaves are the module's, so it can be passed to
    `jax.jit`, `filter_jit`, `tree_leaves`, ... as the module itself can, and the
    bound methods of two modules with the same structure share compiled code. It is
    defined here, beside `Module`, because `Module`'s methods make it."""

    _boxwood_plain_methods = True  # its own `__call__` stays a plain function

    func: Callable = field(static=True)
    instance: Any

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.func(self.instance, *args, **kwargs)
        except Exception as error:  # this frame hidden, as JAX hides its own
            hide_own_frames(error)
            raise

    @property
    def __self__(self) -> Any:
        return self.instance

    @property
    def __func__(self) -> Callable:
        return self.func

    @property
    def __wrapped__(self) -> Callable:
        return self.func.__get__(self.instance, type(self.instance))

    @property
    def __name__(self) -> str:
        return getattr(self.func, "__name__", type(self.func).__name__)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.__wrapped__)


_BOUND_KEY = StaticKey((BoundMethod, None))  # `_static_key.key` of any bound function


def bind_method(func: Callable, obj: Any) -> BoundMethod:
    """`obj.func` as a `BoundMethod`, built directly (no `__init__`, no checks)."""
    bound = _new(BoundMethod)
    set_dict(bound, {"func": func, "instance": obj, REBUILD_NAME: _BOUND_KEY})
    return bound
