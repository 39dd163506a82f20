"""The attention kernels and the one chooser among them, shared by `boxwood.nn`'s
attention and `boxwood.models` (see README.md)."""

from ._fused_attention import Implementation as Implementation
from ._fused_attention import fusable as fusable
from ._fused_attention import fused_attention as fused_attention
