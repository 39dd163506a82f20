"""Model configs: dataclasses read from (and written back to) Hugging Face's
`config.json`, refusing every option they do not understand, and keeping those
that do not change the computation (bookkeeping, `use_cache`) to write them back."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

_C = TypeVar("_C", bound="ModelConfig")


class ConfigError(ValueError):
    """A `config.json` boxwood cannot build a model from (an unknown option, an
    unsupported value, a missing file)."""


# Options of every `transformers` config that do not change what a model computes
# (bookkeeping, tokenisation, generation defaults; the options of training,
# dropout rates and `initializer_range`, are fields of each config). They are
# kept in `ModelConfig.extra` and written back, except those that describe the
# file rather than the model (`WRITTEN_ANEW`).
GENERIC_OPTIONS = frozenset(
    {
        "_name_or_path",
        "architectures",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "sep_token_id",
        "decoder_start_token_id",
        "use_cache",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "tokenizer_class",
        "prefix",
        "chunk_size_feed_forward",
        "gradient_checkpointing",
        "id2label",
        "label2id",
    }
)

# Options `save_pretrained` writes for the file it writes (class, dtype), or that
# describe another program's file: not kept in `extra`.
WRITTEN_ANEW = frozenset(
    {"model_type", "architectures", "dtype", "torch_dtype", "transformers_version"}
)

# `ModelConfig`'s fields that are not options of `config.json`
_NOT_OPTIONS = frozenset({"extra", "generation_config"})

# `ModelConfig.REQUIRED` entries: option -> (predicate on its value, what is supported).
Requirement = tuple[Callable[[Any], bool], str]


class IgnoredOptions(Mapping[str, Any]):
    """Options of a `config.json` that boxwood reads but that do not change what a
    model computes (`use_cache`, bookkeeping, ...), kept so
    that `save_pretrained` writes them back: `config.extra`.

    Immutable and hashable, as a config is a static field of its model: each value
    is held as its JSON text, and reading an option gives a fresh copy.
    """

    __slots__ = ("_json", "_pairs")

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        """**Arguments:** `options`: the options by name; values must be JSON
        values (numbers, strings, booleans, `None`, lists and dicts of these)."""
        texts = {}
        for name, value in dict(options or {}).items():
            try:
                texts[str(name)] = json.dumps(value, sort_keys=True)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"`extra`: the option `{name}` = {value!r} is not a JSON value; "
                    "`config.json` can hold only numbers, strings, booleans, null, "
                    "lists and objects."
                ) from None
        self._pairs = tuple(sorted(texts.items()))
        self._json = dict(self._pairs)

    def __getitem__(self, name: str) -> Any:
        return json.loads(self._json[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._json)

    def __len__(self) -> int:
        return len(self._pairs)

    def __hash__(self) -> int:
        return hash(self._pairs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IgnoredOptions):
            return self._pairs == other._pairs
        return isinstance(other, Mapping) and dict(self) == dict(other)

    def __repr__(self) -> str:
        return f"IgnoredOptions({dict(self)!r})"


class _ReadsOptions(type):
    """The metaclass of the configs: a config built with keywords that are no
    fields of its own (`BertConfig(num_labels=3)`, `id2label=`, `use_cache=`, an
    older spelling) reads them as `from_dict` reads a `config.json`, so a config
    takes the same options however it is built."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        config_class: Any = cls  # (a dataclass: the configs are)
        fields = [f for f in dataclasses.fields(config_class) if f.init]
        if set(kwargs) <= {f.name for f in fields}:
            return super().__call__(*args, **kwargs)
        return _read_options(cls, fields, args, kwargs)


def _read_options(cls: Any, fields: list, args: tuple, kwargs: dict) -> Any:
    """`cls(*args, **kwargs)`, where `kwargs` holds options that are no fields."""
    positional = [f.name for f in fields if not f.kw_only]
    if len(args) > len(positional):
        raise TypeError(
            f"{cls.__name__}() takes at most {len(positional)} positional "
            f"arguments ({len(args)} given)."
        )
    options = dict(zip(positional, args))
    for name, value in kwargs.items():
        if name in options:
            raise TypeError(f"{cls.__name__}() got multiple values for `{name}`.")
        options[name] = value
    kept = {n: options.pop(n) for n in _NOT_OPTIONS if n in options}
    for name in options:
        if name not in cls.option_names() and name not in cls._option_fields():
            raise unknown_option(cls, name, cls.__name__)
    given = ", ".join(f"{name}=" for name in kwargs)
    config = cls.from_dict(options, f"{cls.__name__}({given})")
    if not kept:
        return config
    extra = {**config.extra, **dict(kept.get("extra") or {})}
    return dataclasses.replace(config, **{**kept, "extra": extra})


def unknown_option(config_class: Any, name: str, caller: str) -> TypeError:
    """The error of a keyword argument that is no option of `config_class`."""
    fields = sorted(config_class._option_fields() | config_class.READ_OPTIONS)
    return TypeError(
        f"{caller}() got an unexpected keyword argument `{name}`: it is "
        f"neither an argument of {caller} nor an option of the config, "
        f"boxwood.models.{config_class.__name__}. The options it sets: the "
        f"fields of {config_class.__name__} ({', '.join(fields)}) and the "
        "options every `config.json` may hold (`id2label`, `use_cache`, "
        "...)."
    )


@dataclasses.dataclass(frozen=True)
class ModelConfig(metaclass=_ReadsOptions):
    """Shared reading and writing of `config.json`; one subclass per architecture.

    A subclass lists the options it understands as dataclass fields (with
    `transformers`' defaults), `IGNORED` for options that do not matter in inference
    (bookkeeping), `REQUIRED` for options whose other values it cannot compute, and
    `ALIASES` for older spellings of an option.

    The ignored options of a `config.json` (and the accepted values of `REQUIRED`
    ones) are kept in `extra`, an `IgnoredOptions` mapping, and written back by
    `to_dict`; nothing boxwood computes reads them.
    """

    # Token ids are kept (and written back) for the tokenizer and `transformers`'
    # generation defaults; boxwood's computation does not use them.
    bos_token_id: int | None = dataclasses.field(default=None, kw_only=True)
    eos_token_id: int | tuple[int, ...] | None = dataclasses.field(
        default=None, kw_only=True
    )
    pad_token_id: int | None = dataclasses.field(default=None, kw_only=True)
    # a mapping is accepted too; kept as `IgnoredOptions`
    extra: IgnoredOptions | Mapping[str, Any] = dataclasses.field(
        default=IgnoredOptions(), kw_only=True
    )
    # `generation_config.json` beside `config.json`, where there was one (kept as
    # `IgnoredOptions`): `generate`'s default end and pad tokens, written back.
    # Not compared: it changes no computation, so models that differ only in it
    # have one structure and share compiled code.
    generation_config: IgnoredOptions | Mapping[str, Any] | None = dataclasses.field(
        default=None, kw_only=True, compare=False
    )

    model_type: ClassVar[str] = ""
    architecture: ClassVar[str] = ""
    IGNORED: ClassVar[frozenset[str]] = frozenset()
    REQUIRED: ClassVar[Mapping[str, Requirement]] = {}
    ALIASES: ClassVar[Mapping[str, str]] = {}
    OTHER_TYPES: ClassVar[tuple[str, ...]] = ()
    # options a subclass's `from_dict` reads into its fields itself (`num_labels`)
    READ_OPTIONS: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_dict(cls: type[_C], options: Mapping[str, Any], source: str = "") -> _C:
        """The config from the options of a `config.json`.

        **Arguments:**

        - `options`: the parsed JSON object.
        - `source`: where it came from, for error messages.

        **Raises:** `ConfigError` naming the first option that boxwood does not
        understand or whose value it does not support.
        """
        where = f"{source}: " if source else ""
        model_type = options.get("model_type", cls.model_type)
        if model_type not in (cls.model_type, *cls.OTHER_TYPES):
            raise ConfigError(
                f"{where}`model_type` is {model_type!r}, but "
                f"boxwood.models.{cls.architecture} reads {cls.model_type!r}. "
                "`boxwood.models.from_pretrained(path)` picks the class itself."
            )
        fields = cls._option_fields()
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for name, value in options.items():
            name = cls.ALIASES.get(name, name)
            if name in cls.REQUIRED:
                _require(cls, name, value, where)
                if name not in fields:  # (a field is written back as it is)
                    extra[name] = value
            elif name in fields:
                kwargs[name] = tuple(value) if isinstance(value, list) else value
            elif name in WRITTEN_ANEW:
                continue
            elif name in GENERIC_OPTIONS or name in cls.IGNORED:
                extra[name] = value
            else:
                raise ConfigError(
                    f"{where}the option `{name}` (= {value!r}) is not supported by "
                    f"boxwood.models.{cls.architecture}; boxwood reads only the "
                    "options it implements rather than ignoring one that changes "
                    "the model. Supported options: "
                    f"{', '.join(sorted(fields | set(cls.REQUIRED)))}."
                )
        config = cls(**kwargs, extra=IgnoredOptions(extra))
        try:
            config.validate(where)  # its own messages first (a rate's range, ...)
        except TypeError:  # arithmetic on a value of the wrong type: name it
            _check_types(config, where)
            raise
        _check_types(config, where)
        return config

    @classmethod
    def from_file(cls: type[_C], path: str | os.PathLike) -> _C:
        """The config in the `config.json` file at `path`, read as `from_dict`
        reads its options (a model's directory, or a config written by
        `transformers`' `PretrainedConfig.save_pretrained`).

        **Arguments:**

        - `path`: the `config.json` file.

        **Raises:** `ConfigError` naming the file and the first option that boxwood
        does not understand or whose value it does not support.

        ```python
        config = bm.GPT2Config.from_file("path/to/gpt2/config.json")
        model = bm.GPT2LMHeadModel(config, key=jax.random.key(0))  # drawn anew
        ```
        """
        return cls.from_dict(read_json(path), os.fspath(path))

    @classmethod
    def option_names(cls) -> frozenset[str]:
        """Every option of `config.json` that `from_dict` reads (the fields, their
        older spellings, the required and kept options), less those that describe
        the file (`WRITTEN_ANEW`)."""
        names = cls._option_fields() | set(cls.REQUIRED) | set(cls.ALIASES)
        names |= GENERIC_OPTIONS | cls.IGNORED | cls.READ_OPTIONS
        return frozenset(names - WRITTEN_ANEW)

    @classmethod
    def _option_fields(cls) -> set[str]:
        """The options read into fields of their own."""
        return {f.name for f in dataclasses.fields(cls)} - _NOT_OPTIONS

    def __post_init__(self) -> None:
        extra = self.extra
        if not isinstance(extra, IgnoredOptions):
            extra = IgnoredOptions(extra)
            object.__setattr__(self, "extra", extra)
        generation = self.generation_config
        if generation is not None and not isinstance(generation, IgnoredOptions):
            generation = IgnoredOptions(generation)
            object.__setattr__(self, "generation_config", generation)
        for name in extra:
            self._check_ignorable(name, extra[name])

    def _check_ignorable(self, name: str, value: Any) -> None:
        """`extra` may hold only options that change nothing boxwood computes."""
        cls = type(self)
        if name in cls.REQUIRED:
            _require(cls, name, value, "`extra`: ")
        elif name in self._option_fields():
            raise ConfigError(
                f"`extra` holds the option `{name}`, a field of {cls.__name__}: "
                f"pass it as `{cls.__name__}({name}=...)` instead."
            )
        elif name in WRITTEN_ANEW:
            raise ConfigError(
                f"`extra` holds the option `{name}`, which `save_pretrained` writes "
                "for each file itself; leave it out."
            )
        elif name not in GENERIC_OPTIONS and name not in cls.IGNORED:
            raise ConfigError(
                f"`extra` holds the option `{name}`, which "
                f"boxwood.models.{cls.architecture} does not know; `extra` keeps only "
                "options that do not change the model (`use_cache`, "
                "bookkeeping, ...)."
            )

    def validate(self, where: str) -> None:
        """Checks between options; raises `ConfigError`."""

    def to_dict(self) -> dict[str, Any]:
        """The options as `transformers` writes them in `config.json`: the
        fields, then the kept options of `extra` that no field overrides."""
        out = dataclasses.asdict(self)
        for name in _NOT_OPTIONS:
            del out[name]
        out = {**dict(self.extra), **out}
        out["model_type"] = self.model_type
        out["architectures"] = [self.architecture]
        return out


# A field annotated with one of these takes values of these types (a JSON number
# for a float may be written as an integer; `bool` is an `int`, but not a size).
_SIMPLE = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_types(config: Any, where: str) -> None:
    """Each field annotated as a plain `int`, `float`, `bool` or `str` holds one,
    so that a wrong type in a file is named here, not met as an arithmetic error."""
    for f in dataclasses.fields(config):
        allowed = _SIMPLE.get(f.type) if isinstance(f.type, str) else None
        value = getattr(config, f.name)
        if allowed is None or (
            isinstance(value, allowed)
            and not (isinstance(value, bool) and bool not in allowed)
        ):
            continue
        raise ConfigError(
            f"{where}the option `{f.name}` = {value!r} must be of type {f.type} "
            f"(got {type(value).__name__})."
        )


def check_rates(
    config: Any, names: tuple[str, ...], where: str, unset: tuple[str, ...] = ()
) -> None:
    """Each option of `names` (dropout rates) must be a number in `[0, 1]`; those
    of `unset` may also be `None` (a rate that falls back on another)."""
    for name in names:
        value = getattr(config, name)
        if value is None and name in unset:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            ok = False
        else:
            ok = 0 <= value <= 1
        if not ok:
            raise ConfigError(
                f"{where}the option `{name}` = {value!r} is a dropout probability: "
                "it must be a number in [0, 1]."
            )


def check_initializer_range(config: Any, where: str) -> None:
    """`initializer_range`, a standard deviation, must be a number >= 0."""
    value = config.initializer_range
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(
            f"{where}the option `initializer_range` = {value!r} is the standard "
            "deviation of the initial weights: it must be a number >= 0."
        )


def false_or_unset(value: Any) -> bool:
    """A `REQUIRED` check: the option is `false`, `null` or absent."""
    return value is False or value is None


def _require(cls: type, name: str, value: Any, where: str) -> None:
    accept, supported = cls.REQUIRED[name]
    if not accept(value):
        raise ConfigError(
            f"{where}the option `{name}` = {value!r} is not supported by "
            f"boxwood.models.{cls.architecture}: it supports {supported}."
        )


def config_from(
    config_class: Any,
    options: Mapping[str, Any],
    overrides: Mapping[str, Any],
    source: str,
    caller: str,
) -> Any:
    """The config of `options` (a `config.json`'s, read from `source`) with
    `overrides` (`caller`'s keyword arguments, e.g. `num_labels=5`) in place of
    the file's values, as `transformers`' `from_pretrained` takes them.

    **Raises:** `TypeError` naming an override that is no option of
    `config_class`; `ConfigError` for an unsupported value, as for the file's.
    """
    if not overrides:
        return config_class.from_dict(options, source)
    known = config_class.option_names()
    for name in overrides:
        if name not in known:
            raise unknown_option(config_class, name, caller)
    options = dict(options)
    # an override of the labels, or of their number, replaces the file's (the
    # file's names kept for the same number; both overridden and disagreeing is
    # an error of `read_labels`)
    if "id2label" in overrides and "num_labels" not in overrides:
        options.pop("num_labels", None)
    if "num_labels" in overrides and "id2label" not in overrides:
        options.pop("num_labels", None)
        names = options.get("id2label")
        if not isinstance(names, Mapping) or len(names) != overrides["num_labels"]:
            options.pop("id2label", None)
            options.pop("label2id", None)
    given = ", ".join(f"{name}=" for name in overrides)
    return config_class.from_dict(
        {**options, **overrides}, f"{source} with {caller}({given})"
    )


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from a file, with errors naming the file."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file.") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}.")
    return data


def generation_options(config: Any, generates: bool) -> dict[str, Any] | None:
    """What `save_pretrained` writes as `generation_config.json`: the one the
    model was loaded with, else, for a class that generates, the config's token
    ids, as `transformers`' `GenerationConfig.from_model_config` takes them (and
    marks them: `_from_model_config`); `None` (no file) for one that does not
    generate, as `transformers` writes none for BERT or a classifier."""
    if config.generation_config is not None:
        return dict(config.generation_config)
    if not generates:
        return None
    options: dict[str, Any] = {"_from_model_config": True}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(config, name)
        if value is not None:
            options[name] = list(value) if isinstance(value, tuple) else value
    return options
