"""`from_pretrained` for any supported directory: the class is chosen from
`config.json`'s `architectures`, else its `model_type`. Its own module, so that the model files import
`_pretrained` (their base class) and nothing imports them back."""

from __future__ import annotations

import os
from typing import Any

from ._bert import BertModel
from ._bert_heads import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from ._bert_pretraining import BertForPreTraining
from ._bert_task_heads import BertForMultipleChoice, BertForQuestionAnswering
from ._checkpoint_files import config_path
from ._gpt2 import GPT2LMHeadModel
from ._llama import LlamaForCausalLM
from ._llama_variants import GemmaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
from ._model_config import ConfigError, config_from, read_json
from ._sequence_heads import (
    GPT2ForSequenceClassification,
    LlamaForSequenceClassification,
)
from ._vit import ViTForImageClassification

# Further classes of a `model_type`, chosen by the file's `architectures`.
_HEADS = (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertForQuestionAnswering,
    BertForMultipleChoice,
    BertForPreTraining,
    GPT2ForSequenceClassification,
    LlamaForSequenceClassification,
)


def pretrained_classes() -> dict[str, type]:
    """The model class of each `model_type` (used where the file's
    `architectures` names none of `architecture_classes`)."""
    classes = (
        GPT2LMHeadModel,
        LlamaForCausalLM,
        MistralForCausalLM,
        Qwen2ForCausalLM,
        GemmaForCausalLM,
        BertModel,
        ViTForImageClassification,
    )
    return {c.config_class.model_type: c for c in classes}


def architecture_classes() -> dict[str, type]:
    """The classes chosen by name from `config.json`'s `architectures`."""
    return {c.__name__: c for c in (*pretrained_classes().values(), *_HEADS)}


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: Any = None,
    mesh: Any = None,
    rules: Any = None,
    key: Any = None,
    ignore_mismatched_sizes: bool = False,
    **config_overrides: Any,
) -> Any:
    """Load the model in a local `save_pretrained` directory, choosing the class
    from `config.json`'s `architectures` (`BertForMaskedLM`,
    `BertForSequenceClassification`, `BertForTokenClassification`,
    `BertForQuestionAnswering`, `BertForMultipleChoice`,
    `GPT2ForSequenceClassification`, `LlamaForSequenceClassification`), else from
    its `model_type` (`BertModel` for other BERT files).

    Reads files only; never uses the network. See `GPT2LMHeadModel.from_pretrained`
    for the arguments (config overrides such as `num_labels=5` included); the
    supported `model_type`s are `gpt2`, `llama`, `mistral`, `qwen2`, `gemma`,
    `bert` and `vit`.

    **Raises:** `boxwood.models.ConfigError` naming the file when there is no
    `config.json` or its `model_type` is not supported (listing those that are).
    """
    directory = os.fspath(path)
    cfg_file = config_path(directory)
    options = read_json(cfg_file)
    classes = pretrained_classes()
    model_type = options.get("model_type")
    if model_type not in classes:
        raise ConfigError(
            f"{cfg_file}: `model_type` = {model_type!r} is not one boxwood has; "
            f"supported: {', '.join(sorted(classes))}."
        )
    cls = classes[model_type]
    named = architecture_classes()
    for architecture in options.get("architectures") or ():
        chosen = named.get(architecture)
        if chosen is not None and chosen.config_class is cls.config_class:
            cls = chosen
            break
    config = config_from(
        cls.config_class, options, config_overrides, cfg_file, "from_pretrained"
    )
    return cls._load(
        directory, config, dtype, mesh, rules, key, ignore_mismatched_sizes
    )
