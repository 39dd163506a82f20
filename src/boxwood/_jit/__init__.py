"""`filter_jit` and its parts: see README.md in this folder for how a call flows."""

from ._aot import AotCall as AotCall
from ._aot import Lowered as Lowered
from ._filter_jit import filter_jit as filter_jit
from ._wrapper import CacheInfo as CacheInfo
