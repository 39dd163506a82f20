"""What a `filter_jit` function reads from its closure and globals, treated as
input (see README.md)."""

from ._arguments import warn_argument_methods
from ._per_call import (
    CallState,
    Layer,
    plain_parameters,
    watch_callable,
    watch_plain,
    wrap,
)
from ._reads import Reads, unwrap_jitted
from ._rebuild import Capture
from ._traced import Traced, captured_path, describe_captures, traced_for
from ._values import (
    global_label,
    has_arrays,
    split_callable,
    value_key,
)

__all__ = [
    "CallState", "Capture", "Layer", "Reads", "Traced",
    "captured_path", "describe_captures", "global_label", "has_arrays",
    "plain_parameters", "split_callable", "traced_for", "unwrap_jitted",
    "value_key", "warn_argument_methods", "watch_callable", "watch_plain", "wrap",
]  # fmt: skip
