"""Debugging tools, with Equinox's `equinox.debug` names: trace counting,
conditional breakpoints, transform announcements, NaN cotangents, dead-code checks."""

from ._announce_transform import announce_transform as announce_transform
from ._backward_nan import backward_nan as backward_nan
from ._breakpoint_if import breakpoint_if as breakpoint_if
from ._dce import inspect_dce as inspect_dce
from ._dce import store_dce as store_dce
from ._max_traces import assert_max_traces as assert_max_traces
from ._max_traces import get_num_traces as get_num_traces
