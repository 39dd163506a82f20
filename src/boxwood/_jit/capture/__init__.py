"""What a `filter_jit` function reads from its closure and globals, treated as
input (see README.md)."""

from .arguments import warn_argument_methods
from .layer import (
    CallState,
    Layer,
    plain_parameters,
    watch_callable,
    watch_plain,
    wrap,
)
from .reads import Reads, unwrap_jitted
from .rebuild import Capture
from .traced import Traced, captured_path, describe_captures, traced_for
from .values import (
    CapturedValueWarning,
    global_label,
    has_arrays,
    split_callable,
    value_key,
)

__all__ = [
    "CallState", "Capture", "CapturedValueWarning", "Layer", "Reads", "Traced",
    "captured_path", "describe_captures", "global_label", "has_arrays",
    "plain_parameters", "split_callable", "traced_for", "unwrap_jitted",
    "value_key", "warn_argument_methods", "watch_callable", "watch_plain", "wrap",
]  # fmt: skip
