"""Fast, bit-identical initialisation: one compiled kernel per (distribution,
dtype) instead of one per parameter shape, host-side key splitting, and
`nn.init`. See README.md."""

from ._apply import init as init
from ._const import full as full
from ._const import ones as ones
from ._const import scalar as scalar
from ._const import zeros as zeros
from ._draw import draw as draw
from ._draw import normal as normal
from ._draw import truncated_normal as truncated_normal
from ._draw import uniform as uniform
from ._keys import split_keys as split_keys
from ._layer import Initializer as Initializer
from ._layer import check_initializer as check_initializer
from ._layer import init_param as init_param
from ._stack import build_stacked as build_stacked
