"""Checkpoints: safetensors files, validated loading, crash-safe and background saves.

See README.md in this folder for how the parts fit together.
"""

from ._api import load as load
from ._api import read_metadata as read_metadata
from ._api import save as save
from ._background import SaveHandle as SaveHandle
from ._error import CheckpointError as CheckpointError
from ._assemble import LoadReport as LoadReport
from ._state_dict import load_state_dict as load_state_dict
from ._state_dict import state_dict as state_dict
from ._checkpointer import Checkpointer as Checkpointer
