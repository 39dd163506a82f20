"""`Module`: a frozen dataclass that is a pytree, with construction-time checks."""

from __future__ import annotations

import abc
import dataclasses
import functools
import types
from collections.abc import Callable
from typing import Any, ClassVar

from . import _static_key
from ._abstract import own_abstract, unresolved
from ._checks import MSG_ABSTRACT, MSG_FROZEN, MSG_UNSET, check_static_value, plural
from ._field import converter_of, field, is_static, static_field
from ._register import REBUILD, REBUILD_NAME, register

try:  # Python >= 3.11
    from typing import dataclass_transform
except ImportError:  # pragma: no cover - Python 3.10
    from typing_extensions import dataclass_transform

FLAT = "_boxwood_flat"

# ids of the instances whose `__init__` is running; `__setattr__` only works for those.
# (Set insertions and removals are atomic under the GIL, so this is thread-safe.)
_INITIALISING: set[int] = set()
# Every Module class (registered with JAX, so never freed anyway): `type(x) in
# MODULE_TYPES` is a much cheaper test than `isinstance(x, Module)` (an ABC check).
MODULE_TYPES: set[type] = set()
# Called with every new Module class once its `__init__` is in place: the C
# extension's rebuild slot is installed this way (`boxwood/_jit/_native.py`), so that
# this package imports nothing from `_jit`.
CLASS_HOOKS: list[Callable[[type], None]] = []


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
        custom_init = "__init__" in namespace or getattr(
            cls, "_boxwood_custom_init", False
        )
        cls._boxwood_custom_init = custom_init
        cls.__boxwood_own_abstract__ = own
        cls.__abstractvars__, cls.__abstractclassvars__ = unresolved(cls)
        cls.__boxwood_abstract__ = cls.__abstractvars__ | cls.__abstractclassvars__
        cls._boxwood_is_abstract = is_abstract
        dataclasses.dataclass(cls, init=not custom_init, repr=False, eq=False)
        fields = dataclasses.fields(cls)
        _check_field_names(name, fields)
        cls._boxwood_fields = fields
        cls._boxwood_field_names = frozenset(f.name for f in fields)
        cls._boxwood_static = tuple(f.name for f in fields if is_static(f))
        cls._boxwood_data = tuple(f.name for f in fields if not is_static(f))
        cls._boxwood_converters = tuple(
            (f.name, converter_of(f)) for f in fields if converter_of(f) is not None
        )
        cls._boxwood_check_inits = tuple(
            k.__dict__["__check_init__"]
            for k in reversed(cls.__mro__)
            if "__check_init__" in k.__dict__
        )
        register(
            cls,
            data_fields=list(cls._boxwood_data),
            meta_fields=list(cls._boxwood_static),
        )
        _wrap_init(cls)
        _install_lazy_fields(cls, fields)
        _install_methods(cls, namespace)
        MODULE_TYPES.add(cls)
        return cls


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


_NOT_GIVEN = object()  # default of the generated `__init__`'s field parameters


def _wrap_init(cls: Any) -> None:
    """Give `cls` an `__init__` that also serves as the pytree rebuild path.

    JAX's C++ unflatten calls `cls(_boxwood_rebuild=<StaticKey>, **fields)`. Checking
    for the key inside `__init__` (rather than in a metaclass `__call__`) keeps the
    rebuild on CPython's fast `type.__call__` path. The `__init__` is generated for
    each class with one keyword parameter per registered field, so that CPython
    binds the fields to parameters (as for a dataclass's own `__init__`) instead of
    collecting them into a `**kwargs` dict; the rebuild then builds the instance
    dict in one literal. A user's call reaches the user's `__init__` with its own
    arguments: keywords that happen to name fields are passed back as keywords.
    """
    user_init = cls.__dict__.get("__init__")
    if user_init is None:  # inherited from a Module base: wrap that base's own
        inherited = cls.__init__
        user_init = getattr(inherited, "__boxwood_user_init__", inherited)
    construct = _constructor(user_init)
    names = [*cls._boxwood_data, *cls._boxwood_static]
    # the generated code's own names start with `__bw_`: a field cannot (a class
    # body mangles `__name` to `_Class__name`), so no field shadows them
    params = "".join(f"{n}=__bw_NOT_GIVEN, " for n in names)
    items = "".join(f"{n!r}: {n}, " for n in names)
    regather = "".join(
        f"    if {n} is not __bw_NOT_GIVEN:\n        __bw_kw[{n!r}] = {n}\n"
        for n in names
    )
    source = (
        f"def __init__(__bw_self, *__bw_args, {params}{REBUILD_NAME}=None, **__bw_kw):\n"
        f"    if {REBUILD_NAME}.__class__ is __bw_Key or {REBUILD_NAME} is __bw_REBUILD:\n"
        f"        __bw_set_dict(__bw_self, {{{items}{REBUILD_NAME!r}: {REBUILD_NAME}}})\n"
        "        return\n"
        f"{regather}"
        "    __bw_construct(__bw_self, __bw_args, __bw_kw)\n"
    )
    set_dict = globals().get("_set_dict") or _set_dict_slowly  # Module itself: slowly
    namespace = {
        "__bw_NOT_GIVEN": _NOT_GIVEN, "__bw_REBUILD": REBUILD,
        "__bw_Key": _static_key.StaticKey,
        "__bw_set_dict": set_dict, "__bw_construct": construct,
    }  # fmt: skip
    exec(
        compile(source, f"<boxwood __init__ of {cls.__qualname__}>", "exec"), namespace
    )
    init: Any = functools.wraps(user_init)(namespace["__init__"])
    init.__boxwood_user_init__ = user_init
    cls.__init__ = init
    for hook in CLASS_HOOKS:
        hook(cls)


class _LazyField:
    """The class attribute of a data field: a non-data descriptor, so that the
    instance dict wins and reading a field costs what it costs on any object.

    It is reached only when the instance dict lacks the field: either a default
    read on the class (`Cls.field`), a field not set yet during `__init__`, or a
    module built by `filter_jit` with its flat form only (`_rebuild.py`: a training
    step's outputs usually go straight into the next step, so their nested modules
    are only built when something reads them). Then the fields are rebuilt from the
    flat form, once.
    """

    __slots__ = ("name", "default")

    def __init__(self, name: str, default: Any) -> None:
        self.name = name
        self.default = default

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:  # `Cls.field`: the default, as on a dataclass
            if self.default is dataclasses.MISSING:
                raise AttributeError(
                    f"type object {owner.__name__!r} has no attribute {self.name!r}"
                )
            return self.default
        values = obj.__dict__
        record = values.get(FLAT)
        if record is None:
            raise AttributeError(
                f"{type(obj).__name__!r} object has no attribute {self.name!r}",
                name=self.name,
                obj=obj,
            )
        materialise(obj)
        return values[self.name]


def materialise(obj: Any) -> None:
    """Fill in the fields of a module built from its flat form alone (see
    `_LazyField`); a no-op for any other module."""
    values = obj.__dict__
    record = values.get(FLAT)
    if record is None or all(n in values for n in type(obj)._boxwood_data):
        return
    token, leaves = record
    full = token.unflatten(leaves)
    for name, value in full.__dict__.items():
        values.setdefault(name, value)  # another thread may have been first


def _install_lazy_fields(cls: Any, fields: tuple) -> None:
    for f in fields:
        if is_static(f):
            continue
        current = cls.__dict__.get(f.name, dataclasses.MISSING)
        if current is dataclasses.MISSING or current is f.default:
            type.__setattr__(cls, f.name, _LazyField(f.name, f.default))


class _Method:
    """A method of a module class. Read on an instance it gives a `BoundMethod`
    (`_bound.py`): a module whose child is the instance, so `model.method` is a
    pytree with the model's leaves (as in Equinox). Read on the class it gives the
    plain function. A non-data descriptor: an instance dict entry of the same name
    wins."""

    __slots__ = ("func",)

    def __init__(self, func: Callable) -> None:
        self.func = func

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self.func
        return bind_method(self.func, obj)

    def __getattr__(self, name: str) -> Any:  # `__doc__`, `__isabstractmethod__`, ...
        return getattr(self.func, name)


def bind_method(func: Callable, obj: Any) -> Any:
    """`obj.func` as a `BoundMethod` module (replaced when `_bound.py` is imported)."""
    return types.MethodType(func, obj)


def _is_magic(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _install_methods(cls: Any, namespace: dict) -> None:
    """Make the plain functions of a class body (`__call__` and every method whose
    name is not a dunder) `_Method`s, so that bound methods are pytrees."""
    if namespace.get("_boxwood_plain_methods"):
        return
    for name, value in namespace.items():
        if (
            isinstance(value, types.FunctionType)
            and (name == "__call__" or not _is_magic(name))
            and name not in cls._boxwood_field_names
        ):
            type.__setattr__(cls, name, _Method(value))


def _set_dict_slowly(obj: Any, values: dict) -> None:
    object.__setattr__(obj, "__dict__", values)


def _constructor(user_init: Any) -> Any:
    """A user's construction of a module: run `user_init`, then the defaults,
    converters and checks (`_finish_init`)."""

    def construct(self: Any, args: tuple, kwargs: dict) -> None:
        key = id(self)
        if key in _INITIALISING:  # `super().__init__(...)` inside a user `__init__`
            user_init(self, *args, **kwargs)
            return
        cls = type(self)
        if cls.__dict__.get("_boxwood_is_abstract"):
            raise TypeError(
                f"`{cls.__name__}` was declared with `is_abstract=True`; instantiate a "
                "concrete subclass of it instead."
            )
        if cls.__boxwood_abstract__:
            raise _abstract_error(cls)
        self.__dict__[REBUILD_NAME] = cls._boxwood_rebuild  # see _register.py
        _INITIALISING.add(key)
        try:
            user_init(self, *args, **kwargs)
        finally:
            _INITIALISING.discard(key)
        _finish_init(cls, self)
        self.__dict__[REBUILD_NAME] = _static_key.key(cls, self.__dict__)

    return construct


def _abstract_error(cls: Any) -> TypeError:
    parts = []
    for kind, names in (
        ("class attributes", cls.__abstractclassvars__),
        ("attributes", cls.__abstractvars__),
    ):
        if names:
            parts.append(f"abstract {kind} {plural(sorted(names))['names']}")
    many = len(cls.__boxwood_abstract__) > 1
    return TypeError(
        MSG_ABSTRACT.format(
            cls=cls.__name__, what=" and ".join(parts), them="them" if many else "it"
        )
    )


def _finish_init(cls: Any, self: Any) -> None:
    values = self.__dict__
    missing = []
    for f in cls._boxwood_fields:
        if f.name in values:
            continue
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
        else:
            missing.append(f.name)
    if missing:
        raise TypeError(MSG_UNSET.format(cls=cls.__name__, **plural(missing)))
    for name, converter in cls._boxwood_converters:
        values[name] = converter(values[name])
    for name in cls._boxwood_static:
        check_static_value(cls, name, values[name])
    for check in cls._boxwood_check_inits:
        check(self)


class Module(metaclass=_ModuleMeta):
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
    _boxwood_static: ClassVar[tuple[str, ...]]
    _boxwood_data: ClassVar[tuple[str, ...]]
    # The flat form `(token, leaves)` that `filter_jit` may keep in an instance's
    # dict (see `boxwood/_flat_cache.py`); this class attribute is the default.
    _boxwood_flat = None

    def __getstate__(self) -> dict:
        # pickle and copy: the flat form is a cache, not state
        state: dict = vars(self)
        if FLAT in state:
            materialise(self)
            state = dict(state)
            del state[FLAT]
        return state

    def __setattr__(self, name: str, value: Any) -> None:
        if id(self) not in _INITIALISING:
            raise dataclasses.FrozenInstanceError(
                MSG_FROZEN.format(cls=type(self).__name__, name=name)
            )
        if name not in type(self)._boxwood_field_names:
            raise AttributeError(
                f"Cannot set `{type(self).__name__}.{name}`: it is not a field. Declare "
                f"it in the class body (`{name}: SomeType`) so that it becomes part of "
                "the pytree."
            )
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
        # Notebooks show this: a collapsible tree (`boxwood/_display.py`).
        from .._display import module_html

        return module_html(self)

    def __treescope_repr__(self, path, subtree_renderer):
        # treescope (an optional extra) calls this; see `boxwood/_display.py`.
        from .._display import treescope_repr

        return treescope_repr(self, path, subtree_renderer)


# The `__dict__` slot's setter, bypassing `Module.__setattr__`: `_set_dict(obj, d)`
# makes `d` the instance dict in one step (the cheapest rebuild measured).
_set_dict = Module.__dict__["__dict__"].__set__
