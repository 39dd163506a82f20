"""`boxwood.models`: pretrained `transformers` architectures as boxwood modules,
loaded from local `save_pretrained` directories; see README.md and docs/models.md."""

from ._bert import BertConfig as BertConfig
from ._bert import BertModel as BertModel
from ._bert_heads import BertForMaskedLM as BertForMaskedLM
from ._bert_heads import (
    BertForSequenceClassification as BertForSequenceClassification,
)
from ._bert_heads import BertForTokenClassification as BertForTokenClassification
from ._bert_pretraining import BertForPreTraining as BertForPreTraining
from ._bert_task_heads import BertForMultipleChoice as BertForMultipleChoice
from ._bert_task_heads import BertForQuestionAnswering as BertForQuestionAnswering
from ._from_pretrained import from_pretrained as from_pretrained
from ._generate import generate as generate
from ._generate_output import GenerateOutput as GenerateOutput
from ._gpt2 import GPT2Config as GPT2Config
from ._gpt2 import GPT2LMHeadModel as GPT2LMHeadModel
from ._llama import LlamaConfig as LlamaConfig
from ._llama import LlamaForCausalLM as LlamaForCausalLM
from ._llama_variants import GemmaConfig as GemmaConfig
from ._llama_variants import GemmaForCausalLM as GemmaForCausalLM
from ._llama_variants import MistralConfig as MistralConfig
from ._llama_variants import MistralForCausalLM as MistralForCausalLM
from ._llama_variants import Qwen2Config as Qwen2Config
from ._llama_variants import Qwen2ForCausalLM as Qwen2ForCausalLM
from ._loss import causal_lm_loss as causal_lm_loss
from ._model_config import ConfigError as ConfigError
from ._model_config import IgnoredOptions as IgnoredOptions
from ._pretrained import save_pretrained as save_pretrained
from ._remat_choice import RematChoice as RematChoice
from ._remat_choice import RematRow as RematRow
from ._remat_choice import choose_remat as choose_remat
from ._sequence_heads import (
    GPT2ForSequenceClassification as GPT2ForSequenceClassification,
)
from ._sequence_heads import (
    LlamaForSequenceClassification as LlamaForSequenceClassification,
)
from ._sharding_rules import sharding_rules as sharding_rules
from ._vit import ViTConfig as ViTConfig
from ._vit import ViTForImageClassification as ViTForImageClassification
