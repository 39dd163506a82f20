"""Checkpoints: safetensors files, validated loading, crash-safe and background saves.

See README.md in this folder for how the parts fit together.
"""

from ._api import load as load
from ._api import read_metadata as read_metadata
from ._api import save as save
from ._assemble import LoadReport as LoadReport
from ._background import SaveHandle as SaveHandle
from ._checkpointer import Checkpointer as Checkpointer
from ._equinox import default_deserialise_filter_spec as default_deserialise_filter_spec
from ._equinox import default_serialise_filter_spec as default_serialise_filter_spec
from ._equinox import tree_deserialise_leaves as tree_deserialise_leaves
from ._equinox import tree_serialise_leaves as tree_serialise_leaves
from ._error import CheckpointError as CheckpointError
from ._state_dict import load_state_dict as load_state_dict
from ._state_dict import state_dict as state_dict
