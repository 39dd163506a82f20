"""Fast, bit-identical initialisation: one compiled kernel per (distribution,
dtype) instead of one per parameter shape, and host-side key splitting; what
`nn.init` (`nn/_init.py`) applies. See README.md."""

from ._const import full as full
from ._const import ones as ones
from ._const import scalar as scalar
from ._const import zeros as zeros
from ._draw import draw as draw
from ._draw import normal as normal
from ._draw import truncated_normal as truncated_normal
from ._draw import uniform as uniform
from ._dropout_bits import LAYER as LAYER
from ._dropout_bits import PART as PART
from ._dropout_bits import ROW as ROW
from ._dropout_bits import derived_key as derived_key
from ._dropout_bits import fold_key as fold_key
from ._dropout_bits import generator_in_thread as generator_in_thread
from ._dropout_bits import keep_mask as keep_mask
from ._dropout_bits import resolved_generator as resolved_generator
from ._dropout_bits import set_default_generator as set_default_generator
from ._dropout_bits import split_keys_of as split_keys_of
from ._dropout_bits import stream_key as stream_key
from ._jax_initializers import fast_call as fast_call
from ._keys import split_keys as split_keys
from ._layer import Initializer as Initializer
from ._layer import check_initializer as check_initializer
from ._layer import init_param as init_param
from ._layout import drawn_shape as drawn_shape
from ._layout import layout_at as layout_at
from ._layout import to_stored as to_stored
from ._stack import build_stacked as build_stacked
