"""`boxwood.nn`: layers. Every layer acts on a single example; batch with `jax.vmap`."""

# --- basic layers: linear, MLP, dropout, normalisation, embedding, activations, modes ---
from ._activations import PReLU as PReLU
from ._dropout import Dropout as Dropout
from ._embedding import Embedding as Embedding
from ._inference import inference_mode as inference_mode
from ._linear import Identity as Identity
from ._linear import Linear as Linear
from ._mlp import MLP as MLP
from ._normalisation import GroupNorm as GroupNorm
from ._normalisation import LayerNorm as LayerNorm
from ._normalisation import RMSNorm as RMSNorm

# --- convolutions and pooling ---

# --- state, sequential, recurrent, attention, wrappers ---
from ._batch_norm import BatchNorm as BatchNorm
from ._sequential import Lambda as Lambda
from ._sequential import Sequential as Sequential
from ._state import State as State
from ._state import StateIndex as StateIndex
from ._state import delete_init_state as delete_init_state
from ._state import make_with_state as make_with_state
from ._stateful import StatefulLayer as StatefulLayer
from ._attention import MultiheadAttention as MultiheadAttention
from ._rnn import GRUCell as GRUCell
from ._rnn import LSTMCell as LSTMCell
from ._rope import RotaryPositionalEmbedding as RotaryPositionalEmbedding
from ._shared import Shared as Shared
from ._spectral_norm import SpectralNorm as SpectralNorm
from ._weight_norm import WeightNorm as WeightNorm
