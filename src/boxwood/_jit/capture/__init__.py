"""What a `filter_jit` function reads from its closure and globals, treated as
input (see README.md)."""

from .arguments import warn_argument_methods
from .layer import CallState, Layer, plain_parameters, wrap
from .reads import Reads, unwrap_jitted
from .rebuild import Capture
from .traced import Traced, captured_path, describe_captures, traced_for
from .values import (
    MSG_CHANGED,
    MSG_UNFOLLOWED,
    CapturedValueWarning,
    global_label,
    has_arrays,
    is_input,
    split_callable,
)

__all__ = [
    "MSG_CHANGED", "MSG_UNFOLLOWED", "CallState", "Capture", "CapturedValueWarning",
    "Layer", "Reads", "Traced", "captured_path", "describe_captures", "global_label",
    "has_arrays", "is_input", "plain_parameters", "split_callable", "traced_for",
    "unwrap_jitted", "warn_argument_methods", "wrap",
]  # fmt: skip
