"""`CausalLM`: what GPT-2 and the Llama family share as causal language models:
logits, cached decoding with left padding, hidden states, and copies with another
attention implementation or rematerialisation."""

from __future__ import annotations

from typing import Any, cast

import jax
import jax.core
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from .._jit import filter_jit
from .._tree import tree_at
from ..nn import State
from ._id_ranges import ids_known_in_range
from ._layers import (
    Implementation,
    Step,
    check_implementation,
    check_input_ids,
    with_fields,
)
from ._pretrained import Pretrained


class CausalLM(Pretrained):
    """A causal language model. A subclass has the field `attention_implementation`
    and gives its body (`body()`: a module called as `body(ids, step, state) ->
    (hidden, state)`), where its blocks sit (`blocks(model)`), its output matrix
    (`output_embedding()`) and its number of positions (`max_positions`)."""

    def __call__(self, input_ids: Int[Array, " seq"]) -> Float[Array, "seq vocab_size"]:
        """**Arguments:** `input_ids`: token ids, shape `(seq,)`.

        **Returns:** the next-token logits at every position, `(seq, vocab_size)`.

        Concrete ids (not traced) are checked here and the forward pass runs as
        one compiled program, which holds no host callback for the id check, so
        JAX's persistent compilation cache can keep it; traced ids (under the
        caller's `jit`, `vmap`, ...) are checked inside the caller's program.
        """
        if isinstance(input_ids, jax.core.Tracer):
            return self.decode(input_ids, None, 0)[0]
        model: Any = self
        input_ids = check_input_ids(
            type(self).__name__, input_ids, model.max_positions, model.config.vocab_size
        )
        with ids_known_in_range():
            return _logits_of_checked_ids(self, jnp.asarray(input_ids))

    def decode(
        self,
        input_ids: Int[Array, " seq"],
        state: State | None,
        start: Any,
        pad: Any = None,
        extent: Any = None,
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
        """
        hidden, state = self._hidden(input_ids, state, start, pad, extent)
        model: Any = self  # a subclass: `output_embedding` is its own
        return hidden @ model.output_embedding().T, state

    def hidden_states(
        self, input_ids: Int[Array, " seq"]
    ) -> Float[Array, "seq hidden_size"]:
        """The final (normalised) hidden states, before the output projection:
        `model(ids) == model.hidden_states(ids) @ model.output_embedding().T`."""
        return self._hidden(input_ids, None, 0, None)[0]

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

    def _hidden(
        self, input_ids: Any, state: Any, start: Any, pad: Any, extent: Any = None
    ) -> tuple:
        model: Any = self  # a subclass's fields and hooks
        input_ids = check_input_ids(
            type(self).__name__, input_ids, model.max_positions, model.config.vocab_size
        )
        implementation = model.attention_implementation
        step = Step(start, pad, state is not None, implementation, extent)
        return model.body()(input_ids, step, state)


@filter_jit
def _logits_of_checked_ids(model: CausalLM, input_ids: Array) -> Array:
    """`model(input_ids)` for ids already checked: always traced within
    `ids_known_in_range` (by `CausalLM.__call__`), so it attaches no check."""
    return model.decode(input_ids, None, 0)[0]
