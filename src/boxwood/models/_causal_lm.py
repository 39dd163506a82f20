"""`CausalLM`: what GPT-2 and the Llama family share as causal language models:
logits, cached decoding with left padding, hidden states, and copies with another
attention implementation or rematerialisation."""

from __future__ import annotations

from typing import Any, ClassVar, cast

import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, PRNGKeyArray

from .._jit import filter_jit
from .._tree import tree_at
from ..nn import State
from ._attend import Implementation, Step, check_implementation, segment_ids
from ._blocks import with_every_layer, with_fields
from ._id_ranges import ids_known_in_range
from ._inputs import check_attention_mask, check_input_ids
from ._pretrained import Pretrained
from ._training import dropout_key, stream_key

# how a causal LM is called with a dropout key (named by the missing-key error)
_CALL = "model(input_ids, key=key)"


class CausalLM(Pretrained):
    """A causal language model. A subclass has the field `attention_implementation`
    and gives its body (`body()`: a module called as `body(ids, step, state) ->
    (hidden, state, every)`, `every` the hidden states of every layer where
    `step.every_layer`, else `None`), where its blocks sit (`blocks(model)`),
    its output matrix (`output_embedding()`) and its number of positions
    (`max_positions`).

    Its dropout layers (`boxwood.nn.Dropout`, rates from the config) are in
    training mode in a model built from a config, as in `transformers` and
    Equinox, and in inference mode in one from `from_pretrained`; switch with
    `boxwood.nn.inference_mode(model, value)`. In training mode with a nonzero
    rate, every call takes `key=`."""

    GENERATES: ClassVar[bool] = True

    def __call__(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Any = None,
        *,
        key: PRNGKeyArray | None = None,
        output_hidden_states: bool = False,
    ) -> Any:
        """**Arguments:**

        - `input_ids`: token ids, shape `(seq,)` (an array or a list of ints).
        - `attention_mask`: optional, `(seq,)`: 1 for real tokens, 0 for padding
          (left or right). Real tokens attend to real tokens only; positions
          count from the first column, as in `transformers`' forward. The logits
          at padding positions are not meaningful.
        - `key`: a `jax.random` key for dropout; needed in training mode when
          the config has a nonzero dropout rate. (Keyword only.)
        - `output_hidden_states`: also return every layer's hidden states, as
          `transformers` returns them (keyword only; default `False`).

        **Returns:** the next-token logits at every position, `(seq, vocab_size)`;
        with `output_hidden_states`, `(logits, hidden_states)`, where
        `hidden_states` is `(num_layers + 1, seq, hidden_size)`: the embeddings
        (after dropout), then each block's output, the last one normalised by
        the final norm (`transformers`' `hidden_states[i]` is
        `hidden_states[i]`, and its last entry is the final hidden state).

        Concrete ids (not traced) are checked here and the forward pass runs as
        one compiled program, which holds no host callback for the id check, so
        JAX's persistent compilation cache can keep it; traced ids (under the
        caller's `jit`, `vmap`, ...) are checked inside the caller's program.
        """
        every = bool(output_hidden_states)
        if isinstance(input_ids, jax.core.Tracer) or isinstance(
            attention_mask, jax.core.Tracer
        ):
            return self._outputs(input_ids, attention_mask, key, every)
        model: Any = self
        name = type(self).__name__
        input_ids = check_input_ids(
            name, input_ids, model.max_positions, model.config.vocab_size
        )
        if attention_mask is not None:
            attention_mask = jnp.asarray(
                check_attention_mask(name, attention_mask, jnp.shape(input_ids))
            )
        key = dropout_key(self, key, _CALL)
        with ids_known_in_range():
            return _logits_of_checked_ids(
                self, jnp.asarray(input_ids), attention_mask, key, every
            )

    def _outputs(
        self, input_ids: Any, attention_mask: Any, key: Any, every_layer: bool
    ) -> Any:
        """The logits, with every layer's hidden states where `every_layer`."""
        hidden, _, every = self._hidden(
            input_ids, None, 0, None, None, attention_mask, key, every_layer
        )
        model: Any = self  # a subclass: `output_embedding` is its own
        logits = hidden @ model.output_embedding().T
        return with_every_layer(logits, every)

    def decode(
        self,
        input_ids: Int[Array, " seq"],
        state: State | None,
        start: Any,
        pad: Any = None,
        extent: Any = None,
        *,
        attention_mask: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Float[Array, "seq vocab_size"], State | None]:
        """Logits for `input_ids` at cache slots `start, start+1, ...`, reading and
        updating the key/value cache in `state` (from `init_cache`; `None`: no
        cache, `start` 0).

        `pad` (`None`, or an int32 scalar, which may be traced): the number of
        leading cache slots that hold left padding. Those keys are masked for
        every query, and the token at slot `s` is at position `s - pad` (its
        position embedding or RoPE angle; pad slots at position 0), so a
        left-padded row's logits for its real tokens are the unpadded sequence's.
        `jax.vmap` over rows with a per-row `pad` works.

        `extent` (`None`, or an int32 scalar, which may be traced): read only with
        `dynamic` RoPE scaling, whose frequencies follow the call's sequence
        length: one more than the largest real position (`generate` gives the
        longest row's). `None`: this call's largest position + 1.

        `attention_mask` (keyword only): as in `__call__`, for a call without a
        cache (`state=None`); over a cache, left padding is `pad`. `key`
        (keyword only): the dropout key, as in `__call__`.
        """
        hidden, state, _ = self._hidden(
            input_ids, state, start, pad, extent, attention_mask, key
        )
        model: Any = self  # a subclass: `output_embedding` is its own
        return hidden @ model.output_embedding().T, state

    def hidden_states(
        self,
        input_ids: Int[Array, " seq"],
        attention_mask: Any = None,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Float[Array, "seq hidden_size"]:
        """The final (normalised) hidden states, before the output projection:
        `model(ids) == model.hidden_states(ids) @ model.output_embedding().T`.
        `attention_mask` and `key` as in `__call__`."""
        return self._hidden(input_ids, None, 0, None, None, attention_mask, key)[0]

    def with_attention_implementation(self, implementation: Implementation) -> Any:
        """A copy whose attention uses `implementation`: `None` (boxwood's choice:
        splash attention on a TPU, cuDNN's on a GPU, where they apply; XLA's
        otherwise), `"xla"`, `"cudnn"` (the fused cuDNN kernel on an NVIDIA GPU)
        or `"splash"` (the Pallas splash attention kernel; off a TPU in interpret
        mode, slowly, for tests); see docs/models.md."""
        check_implementation(type(self).__name__, implementation)
        return with_fields(self, attention_implementation=implementation)

    def with_remat(self, remat: Any) -> Any:
        """A copy whose blocks are rematerialised on the backward pass: `remat` is
        `False`/`None`, `True`/`"full"`, or a `jax.checkpoint_policies` name (see
        [`boxwood.nn.Stacked`][])."""
        blocks = cast(Any, self).blocks
        return tree_at(blocks, self, blocks(self).with_remat(remat))

    def with_unroll(self, unroll: int | bool) -> Any:
        """A copy whose blocks are looped over as `unroll` says: `1` (the default)
        scans them one at a time, so compile time is flat in depth; an int `n`
        unrolls `n` blocks per iteration of the scan; `True` applies them one
        after the other with no scan (compile time grows with depth; see
        [`boxwood.nn.Stacked`][] and docs/models.md). The arrays and checkpoints
        are unchanged; a one-token decode step runs unrolled either way."""
        blocks = cast(Any, self).blocks
        return tree_at(blocks, self, blocks(self).with_unroll(unroll))

    def _hidden(
        self,
        input_ids: Any,
        state: Any,
        start: Any,
        pad: Any,
        extent: Any = None,
        attention_mask: Any = None,
        key: Any = None,
        every_layer: bool = False,
    ) -> tuple:
        """`(hidden, state, every)`: the final hidden states, the state, and
        every layer's hidden states where `every_layer` (else `None`)."""
        model: Any = self  # a subclass's fields and hooks
        name = type(self).__name__
        input_ids = check_input_ids(
            name, input_ids, model.max_positions, model.config.vocab_size
        )
        segments = None
        if attention_mask is not None:
            if state is not None:
                raise ValueError(
                    f"{name}.decode: `attention_mask` applies to a call without a "
                    "cache (`state=None`); over a cache, give the left padding of "
                    "a row as `pad` (the number of its leading pad slots)."
                )
            mask = check_attention_mask(name, attention_mask, jnp.shape(input_ids))
            segments = segment_ids(mask)
        # one key conversion per call, before the layers derive theirs from it
        key = stream_key(dropout_key(self, key, _CALL))
        implementation = model.attention_implementation
        step = Step(
            start,
            pad,
            state is not None,
            implementation,
            extent,
            segments,
            key,
            every_layer,
        )
        return model.body()(input_ids, step, state)


@filter_jit
def _logits_of_checked_ids(
    model: CausalLM,
    input_ids: Array,
    attention_mask: Any,
    key: Any,
    every: bool = False,
) -> Any:
    """`model(input_ids, attention_mask, key=key, output_hidden_states=every)`
    for inputs already checked: always traced within `ids_known_in_range` (by
    `CausalLM.__call__`), so it attaches no check."""
    return model._outputs(input_ids, attention_mask, key, every)
