"""`Pretrained`: the base of the model classes: loading a `save_pretrained`
directory into an abstractly built model, and exporting one back."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import threading
import warnings
from collections import OrderedDict
from typing import Any, BinaryIO, ClassVar, cast

import jax
import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

from .._caches import register_cache_clear
from .._checkpoint import CheckpointError, assemble, atomic_write
from .._transforms import filter_eval_shape
from .._tree import tree_at
from .._warnings import user_stacklevel
from ..nn import MultiheadAttention, State, StateIndex, inference_mode
from ._attend import check_implementation
from ._blocks import with_fields
from ._checkpoint_files import (
    FileLayout,
    absent_parts,
    checkpoint_tensors,
    config_path,
    floating_dtype,
    renamed_tensors,
    standard_tensors,
    without_tied_copies,
)
from ._model_config import WRITTEN_ANEW, config_from, generation_options, read_json
from ._new_parameters import (
    drawn,
    matching,
    new_parameters_message,
    resized_head,
    resized_message,
)
from ._resize import Vocabulary
from ._save_files import cast_arrays, shard_bytes, write_weights
from ._sharding_rules import Strategy, sharding_rules
from ._stacking import (
    layer_arrays,
    layer_names,
    layer_parts,
    layer_slots,
    with_layer_shardings,
)
from ._torch_habits import habit_error

# `transformers`' generation defaults, beside `config.json`
GENERATION_CONFIG = "generation_config.json"


class Pretrained(Vocabulary):
    """A model whose parameters are named after a `transformers` checkpoint.

    A subclass says how its parameter names differ from the checkpoint's (`RENAMES`,
    `(pattern, replacement)` pairs of `re.sub` from boxwood's name to the file's),
    which of the file's tensors are buffers to skip (`DROPPED`, a pattern over
    `save_pretrained` names), the other layouts published files use (`LAYOUTS`,
    each a `FileLayout` mapping its names to `save_pretrained`'s; the one that fits
    the file's names best is used), and which of its attributes a file may lack
    entirely (`OPTIONAL_PARTS`: the model then loads with that attribute `None`).
    `export_array` gives an array the file's shape where a layer's differs.

    A class with a task head says which of its parameters are the head's own
    (`NEW_ON_LOAD`, a pattern over `save_pretrained` names): a file that lacks
    them (a body's, or another head's) loads with them drawn anew, as a fresh
    build draws them, and a `UserWarning` listing them; any other missing tensor
    is still an error. `OTHER_HEADS` (a pattern too) names the parameters of
    other classes' heads a file may hold: they are dropped, and listed in that
    warning where there is one.
    """

    config_class: ClassVar[type] = type(None)
    RENAMES: ClassVar[tuple[tuple[str, str], ...]] = ()
    DROPPED: ClassVar[str | None] = None
    LAYOUTS: ClassVar[tuple[FileLayout, ...]] = ()
    OPTIONAL_PARTS: ClassVar[tuple[str, ...]] = ()
    NEW_ON_LOAD: ClassVar[str | None] = None
    OTHER_HEADS: ClassVar[str | None] = None
    # `save_pretrained`'s `architectures` entry, where not the config's own
    ARCHITECTURE: ClassVar[str | None] = None
    # whether `save_pretrained` writes generation defaults (a language model's)
    GENERATES: ClassVar[bool] = False

    def __getattr__(self, name: str) -> Any:
        # Only a missed lookup gets here: the fields and methods are found by
        # normal attribute access, at its usual speed.
        raise habit_error(self, name)

    def __check_init__(self) -> None:
        # The key/value cache's indices are named after their places now, so two
        # models built (or loaded) alike have equal structures from the start and
        # share compiled code (`generate`'s included). Building a `State` names
        # the unnamed indices of its model in place, which is all that is wanted
        # here: the state itself is dropped.
        State(self)

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        """The checkpoint's name for boxwood's parameter `name`."""
        for pattern, replacement in cls.RENAMES:
            name = re.sub(pattern, replacement, name)
        return name

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        *,
        dtype: Any = None,
        mesh: Any = None,
        rules: Any = None,
        key: Any = None,
        ignore_mismatched_sizes: bool = False,
        **config_overrides: Any,
    ) -> Any:
        """Load a model from a local directory written by `save_pretrained`, or
        downloaded from the Hub in one of the class's published layouts
        (`LAYOUTS`: e.g. the `gpt2` file without `transformer.`, BERT's `bert.`
        prefix and `LayerNorm.gamma`/`beta` names).

        Reads files only; never uses the network. The model is built abstractly
        (no random initialisation), every name and shape is checked against the
        checkpoint (all problems reported at once, in a `boxwood.CheckpointError`),
        then each tensor is read once, straight into its final dtype and, with
        `mesh`, its final sharding. On the CPU, tensors that the file's layout
        lets it alias are views of the file's memory map; the others are copied
        into one region of host memory, which is given back once the last
        loaded array holding a piece of it is freed.

        **Arguments:**

        - `path`: the directory (`config.json` plus `model.safetensors`, or
          sharded `model-0000N-of-0000M.safetensors` files and their index).
        - `dtype`: the floating-point dtype of the parameters (e.g.
          `jnp.bfloat16`); default: the checkpoint's.
        - `mesh`: a `jax.sharding.Mesh` to place the parameters on, by `rules`
          (see [`boxwood.models.sharding_rules`][]). (Keyword only.)
        - `rules`: sharding rules as [`boxwood.shard`][] takes them, or the name
          of a strategy of [`boxwood.models.sharding_rules`][]
          (`"tensor_parallel"`); default replicated. (Keyword only.)
        - `key`: a `jax.random` key for the parameters of the class's task head
          that the file lacks (loading `BertForSequenceClassification` from a
          `BertModel` or `BertForMaskedLM` file): they are drawn as
          `cls(config, key=key)` draws them (from `initializer_range`), with a
          `UserWarning` listing them. Default `jax.random.key(0)`, so such a
          load is reproducible. Unused where the file holds every parameter.
          (Keyword only.)
        - `ignore_mismatched_sizes`: where the file holds the task head with
          other shapes than the config gives it (another number of labels:
          `num_labels=` below), draw the head anew as for a file without it
          (with `key`, and the warning); default `False`, an error naming each
          such tensor and both shapes. Only the head's parameters: any other
          mismatch stays an error. (Keyword only.)
        - `**config_overrides`: options of the config in place of the file's
          `config.json` values, as `transformers` takes them: any option of the
          class's config (its fields, e.g. `attn_pdrop=0.0`, and `config.json`'s
          `num_labels`, `id2label`). A name that is no option is a `TypeError`;
          an unsupported value a `boxwood.models.ConfigError`.

        **Returns:** the model, in inference mode (its dropout layers off, as
        `transformers`' `from_pretrained` returns a model in `eval()` mode):
        `boxwood.nn.inference_mode(model, False)` switches it to training.
        """
        directory = os.fspath(path)
        cfg_file = config_path(directory)
        config = config_from(
            cls.config_class,
            read_json(cfg_file),
            config_overrides,
            cfg_file,
            f"{cls.__name__}.from_pretrained",
        )
        return cls._load(
            directory, config, dtype, mesh, rules, key, ignore_mismatched_sizes
        )

    @classmethod
    def _load(
        cls,
        directory: str,
        config: Any,
        dtype: Any,
        mesh: Any,
        rules: Any,
        key: Any = None,
        resize: bool = False,
    ) -> Any:
        """The model of `directory`, with `config` (and the directory's
        `generation_config.json`, if any), in inference mode. `resize`: a head
        tensor of another shape than the model's is drawn anew (else an error)."""
        model = cls._load_into(directory, config, dtype, mesh, rules, key, resize)
        generation = os.path.join(directory, GENERATION_CONFIG)
        if os.path.isfile(generation):
            # set on the loaded model: the abstract build, remembered per config,
            # may carry another (configs are compared without it)
            options = read_json(generation)  # less what describes the file
            kept = {k: v for k, v in options.items() if k not in WRITTEN_ANEW}
            config = dataclasses.replace(model.config, generation_config=kept)
            model = with_fields(model, config=config)
        return inference_mode(model, True)

    @classmethod
    def _load_into(
        cls,
        directory: str,
        config: Any,
        dtype: Any,
        mesh: Any,
        rules: Any,
        key: Any,
        resize: bool,
    ) -> Any:
        """The weights of `directory` in the abstractly built model: the files'
        tensors under the model's names (`_checkpoint_files`), the head drawn
        anew where the file lacks it (`_new_parameters`), then all of them
        validated and read in one pass, each stacked leaf from its layers'
        tensors (`boxwood._checkpoint.assemble` with the plan `layer_parts`)."""
        tensors = checkpoint_tensors(directory)
        dtype = jnp.dtype(dtype) if dtype is not None else floating_dtype(tensors)
        abstract = abstract_model(cls, config, dtype)
        names = {cls.checkpoint_name(name): name for name in layer_names(abstract)}
        tensors = standard_tensors(tensors, set(names), cls.LAYOUTS)
        tied = cls.tied_tensors(config)
        tensors = without_tied_copies(tensors, tied, directory, cls.__name__)
        absent = absent_parts(tensors, names, cls.OPTIONAL_PARTS)
        dropped = "|".join(f"(?:{p})" for p in (cls.DROPPED, cls.OTHER_HEADS) if p)
        tensors, left_out = renamed_tensors(tensors, names, dropped or None)
        for part in absent:
            abstract = tree_at(lambda m, p=part: getattr(m, p), abstract, None)
        if isinstance(rules, str):  # `sharding_rules` checks the name itself
            rules = sharding_rules(cls, cast(Strategy, rules))
        if mesh is not None:
            abstract = with_layer_shardings(abstract, mesh, rules or ())
        slots, parts = layer_slots(abstract), layer_parts(abstract)
        names = {cls.checkpoint_name(name): name for name in slots}
        resized = resized_head(cls, slots, tensors, names)
        if resized and not resize:
            raise CheckpointError(resized_message(cls, directory, resized))
        gone = {names[n] for n in resized}  # drawn anew, as if the file lacked them
        tensors = {n: t for n, t in tensors.items() if n not in gone}
        new = matching(cls.NEW_ON_LOAD, [n for n in names if names[n] not in tensors])
        unused = matching(cls.OTHER_HEADS, left_out)
        if new:
            which = (cls, _config_key(config), jnp.dtype(dtype))
            own = [names[n] for n in new]
            tensors.update(drawn(cls, config, dtype, key, slots, own, which))
        # what was drawn and dropped is always listed, once the load succeeded
        message = None
        if new or unused:
            message = new_parameters_message(cls, directory, new, unused, resized)
        model, _ = assemble(
            abstract,
            tensors,
            strict=True,
            cast=dtype,
            squeeze_ok=True,
            parts=parts,  # a stacked leaf read from its layers, in the same pass
            source=f"the checkpoint in {directory}",
            where="the checkpoint",
            progress=True,  # a bar for a large checkpoint, on a terminal only
            # the copies in one region of memory, where the device adopts them
            region=mesh is None and _adopts_host_buffers(),
        )
        if message is not None:
            warnings.warn(message, UserWarning, stacklevel=user_stacklevel())
        return model

    @classmethod
    def tied_tensors(cls, config: Any) -> dict[str, str]:
        """The tensors a file may hold that are copies of another (a tied output
        embedding written out): `{name: name of the tensor it must equal}`, in
        `save_pretrained`'s names."""
        return {}

    def export_array(self, name: str, array: np.ndarray) -> np.ndarray:
        """Boxwood's parameter `name` in the checkpoint's layout."""
        return array

    def with_attention_implementation(self, implementation: Any) -> Any:
        """A copy whose attention layers ([`boxwood.nn.MultiheadAttention`][])
        use `implementation`: `None` (boxwood's choice), `"xla"`, `"cudnn"` or
        `"splash"` (see [`boxwood.nn.MultiheadAttention`][])."""
        check_implementation(type(self).__name__, implementation)
        is_attention = lambda x: isinstance(x, MultiheadAttention)
        return jtu.tree_map(
            lambda x: (
                with_fields(x, implementation=implementation) if is_attention(x) else x
            ),
            self,
            is_leaf=is_attention,
        )

    def save_pretrained(
        self,
        path: str | os.PathLike,
        *,
        max_shard_size: int | str | None = None,
        dtype: Any = None,
    ) -> None:
        """Write the model as `transformers`' `save_pretrained` does: `config.json`
        and `model.safetensors` in the directory `path` (created if needed), so
        that `transformers`' `from_pretrained(path)` loads it, and
        `generation_config.json`: the one the model was loaded with, else, for a
        language model, its config's `bos_token_id`, `eos_token_id` and
        `pad_token_id` (as `transformers` writes it for a model built from a
        config; none for BERT, ViT or a classifier). Each file
        is replaced crash-safely (written aside, then renamed over the old one).

        **Arguments:**

        - `path`: the directory.
        - `max_shard_size`: if given (bytes, or `"5GB"`, `"500MB"`, `"2GiB"`),
          the tensors are written in file order to shards of at most this size
          (`model-00001-of-0000N.safetensors`, a larger tensor alone in its
          shard) with the index `model.safetensors.index.json`, as `transformers`
          writes them; one file when they all fit. (Keyword only.)
        - `dtype`: if given, the floating tensors are written in this dtype (such
          as `jnp.bfloat16`), and `config.json`'s `dtype` says so. (Keyword only.)
        """
        directory = os.fspath(path)
        max_bytes = shard_bytes(max_shard_size)
        os.makedirs(directory, exist_ok=True)
        arrays = [
            (self.checkpoint_name(name), self.export_array(name, array))
            for name, array in layer_arrays(self)
        ]
        arrays = cast_arrays(arrays, dtype)
        # every subclass declares its `config` field
        options = cast(Any, self).config.to_dict()
        if self.ARCHITECTURE is not None:
            options["architectures"] = [self.ARCHITECTURE]
        options["dtype"] = str(np.dtype(arrays[0][1].dtype))
        # each file crash-safely: a save that fails or is killed part way leaves
        # the directory's previous files whole (the weights are written first, so
        # a new config never describes old weights)
        write_weights(directory, arrays, max_bytes)
        _write_json(os.path.join(directory, "config.json"), options)
        generation = generation_options(cast(Any, self).config, self.GENERATES)
        if generation is not None:
            _write_json(os.path.join(directory, GENERATION_CONFIG), generation)


def _write_json(path: str, options: dict[str, Any]) -> None:
    """`options` as the JSON file `path`, replaced crash-safely."""
    text = json.dumps(options, indent=2, sort_keys=True).encode()

    def write(f: BinaryIO) -> None:
        f.write(text)

    atomic_write(path, write)


# The abstract models built by `_load`, by (class, config, dtype), most recently
# used last: a second load of a model traces nothing (the build under
# `filter_eval_shape` is most of a small model's load time).
_ABSTRACT: OrderedDict[Any, Any] = OrderedDict()
_ABSTRACT_KEPT = 16
_ABSTRACT_LOCK = threading.Lock()


def _config_key(config: Any) -> Any:
    """`config` itself where it is hashable (configs are frozen dataclasses), else
    its class and options as canonical JSON."""
    try:
        hash(config)
    except TypeError:
        options = json.dumps(config.to_dict(), sort_keys=True, default=repr)
        return (type(config), options)
    return config


def abstract_model(cls: type, config: Any, dtype: Any) -> Any:
    """The model `cls(config, dtype)` built abstractly (leaves
    `jax.ShapeDtypeStruct`), remembered per class, config and dtype.

    The tree is shared between loads, so it is only read: a module is immutable,
    and every change (`tree_at`, shardings, the loaded arrays) makes a new tree.
    """
    key = (cls, _config_key(config), jnp.dtype(dtype))
    with _ABSTRACT_LOCK:
        abstract = _ABSTRACT.get(key)
        if abstract is not None:
            _ABSTRACT.move_to_end(key)
    if abstract is None:
        abstract = filter_eval_shape(_build, cls, config, dtype)
        with _ABSTRACT_LOCK:
            _ABSTRACT[key] = abstract
            while len(_ABSTRACT) > _ABSTRACT_KEPT:
                _ABSTRACT.popitem(last=False)
    return _own_indices(abstract)


def _adopts_host_buffers() -> bool:
    """Whether an unsharded load lands on a CPU device, which adopts the host
    buffers read (`may_alias`) rather than copying them.

    Only then are a load's copies made in one region of memory: the region is
    given back when the last array holding a piece of it is freed, so where the
    device copies each buffer (an accelerator; a sharded load) the buffers are
    kept apart, each freed as soon as it has been copied."""
    device = getattr(jax.config, "jax_default_device", None)
    if device is None:
        return jax.default_backend() == "cpu"
    return getattr(device, "platform", device) == "cpu"


def _build(cls: type, config: Any, dtype: Any) -> Any:
    # The key is made inside the abstract trace: `jax.random.key(0)` outside it
    # would compile and run a program (about 90 ms of a fresh process's load,
    # most of it JAX's first lowering) for a key whose value is never used.
    return cls(config, dtype, key=jax.random.key(0))


def _own_indices(tree: Any) -> Any:
    """`tree` with a copy of each `StateIndex`: a `State` walk may name (or
    rename) an index's key in place, which must reach neither the remembered
    tree nor another load of it. The copies keep the keys' names."""
    return jtu.tree_map(
        lambda x: copy.deepcopy(x) if isinstance(x, StateIndex) else x,
        tree,
        is_leaf=lambda x: isinstance(x, StateIndex),
    )


@register_cache_clear
def _clear_abstract_models() -> None:
    with _ABSTRACT_LOCK:
        _ABSTRACT.clear()


def save_pretrained(model: Pretrained, path: str | os.PathLike, **options: Any) -> None:
    """Write `model` as `transformers`' `save_pretrained` does (`config.json`,
    `model.safetensors`), so that `transformers`' `from_pretrained(path)` loads it.

    **Arguments:**

    - `model`: a model of `boxwood.models`.
    - `path`: the directory (created if needed).
    - `max_shard_size`, `dtype`: as the model's `save_pretrained` takes them.
    """
    if not isinstance(model, Pretrained):
        raise TypeError(
            "`save_pretrained` takes a model of `boxwood.models`, got "
            f"{type(model).__name__}; save other trees with `boxwood.save`."
        )
    model.save_pretrained(path, **options)
