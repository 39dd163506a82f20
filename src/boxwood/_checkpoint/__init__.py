"""Checkpoints: safetensors files, validated loading, crash-safe and background saves.

See README.md in this folder for how the parts fit together.

The names imported here are this package's whole interface; other code imports
only them, never a submodule (tests/house/test_architecture.py checks it). Most are
public (re-exported by `boxwood`); eight serve the rest of boxwood
(`boxwood.models`) and are not re-exported: `assemble`, `Tensor` and `Part`
(validated loading from named tensors, a leaf stored as per-layer tensors read
in the same pass, the copies in one region of host memory), `read_tensors` and
`write_file` (a safetensors file read lazily, its aligned tensors mapped rather
than copied, written crash-safely), `atomic_write`, `stored_names` (the
checkpoint names of a tree's array leaves), and `ArrayTensor` (an in-memory
array read as a checkpoint tensor).
"""

from ._assemble import LoadReport as LoadReport
from ._assemble import Tensor as Tensor
from ._assemble import assemble as assemble
from ._atomic import atomic_write as atomic_write
from ._background import SaveHandle as SaveHandle
from ._checkpointer import Checkpointer as Checkpointer
from ._equinox import default_deserialise_filter_spec as default_deserialise_filter_spec
from ._equinox import default_serialise_filter_spec as default_serialise_filter_spec
from ._equinox import tree_deserialise_leaves as tree_deserialise_leaves
from ._equinox import tree_serialise_leaves as tree_serialise_leaves
from ._error import CheckpointError as CheckpointError
from ._leaves import stored_names as stored_names
from ._load import load as load
from ._load import read_metadata as read_metadata
from ._parts import Part as Part
from ._safetensors import read_tensors as read_tensors
from ._safetensors import write_file as write_file
from ._save import save as save
from ._state_dict import ArrayTensor as ArrayTensor
from ._state_dict import load_state_dict as load_state_dict
from ._state_dict import state_dict as state_dict
