"""Model configs: dataclasses read from (and written back to) Hugging Face's
`config.json`, refusing every option they do not understand."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

_C = TypeVar("_C", bound="ModelConfig")


class ConfigError(ValueError):
    """A `config.json` boxwood cannot build a model from (an unknown option, an
    unsupported value, a missing file)."""


# Options of every `transformers` config that do not change what a model computes
# in inference: bookkeeping, tokenisation, generation defaults, training-only
# dropout and initialisation. They are read and dropped.
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
        "initializer_range",
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

# `ModelConfig.REQUIRED` entries: option -> (predicate on its value, what is supported).
Requirement = tuple[Callable[[Any], bool], str]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shared reading and writing of `config.json`; one subclass per architecture.

    A subclass lists the options it understands as dataclass fields (with
    `transformers`' defaults), `IGNORED` for options that do not matter in inference
    (dropout rates), `REQUIRED` for options whose other values it cannot compute, and
    `ALIASES` for older spellings of an option.
    """

    # Token ids are kept (and written back) for the tokenizer and `transformers`'
    # generation defaults; boxwood's computation does not use them.
    bos_token_id: int | None = dataclasses.field(default=None, kw_only=True)
    eos_token_id: int | tuple[int, ...] | None = dataclasses.field(
        default=None, kw_only=True
    )
    pad_token_id: int | None = dataclasses.field(default=None, kw_only=True)

    model_type: ClassVar[str] = ""
    architecture: ClassVar[str] = ""
    IGNORED: ClassVar[frozenset[str]] = frozenset()
    REQUIRED: ClassVar[Mapping[str, Requirement]] = {}
    ALIASES: ClassVar[Mapping[str, str]] = {}
    OTHER_TYPES: ClassVar[tuple[str, ...]] = ()

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
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {}
        for name, value in options.items():
            name = cls.ALIASES.get(name, name)
            if name in cls.REQUIRED:
                _require(cls, name, value, where)
            elif name in fields:
                kwargs[name] = tuple(value) if isinstance(value, list) else value
            elif name not in GENERIC_OPTIONS and name not in cls.IGNORED:
                raise ConfigError(
                    f"{where}the option `{name}` (= {value!r}) is not supported by "
                    f"boxwood.models.{cls.architecture}; boxwood reads only the "
                    "options it implements rather than ignoring one that changes "
                    "the model. Supported options: "
                    f"{', '.join(sorted(fields | set(cls.REQUIRED)))}."
                )
        config = cls(**kwargs)
        config.validate(where)
        return config

    @classmethod
    def from_file(cls: type[_C], path: str | os.PathLike) -> _C:
        """The config in the `config.json` file at `path`."""
        return cls.from_dict(read_json(path), os.fspath(path))

    def validate(self, where: str) -> None:
        """Checks between options; raises `ConfigError`."""

    def to_dict(self) -> dict[str, Any]:
        """The options as `transformers` writes them in `config.json`."""
        out = dataclasses.asdict(self)
        out["model_type"] = self.model_type
        out["architectures"] = [self.architecture]
        return out


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
