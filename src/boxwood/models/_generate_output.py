"""`GenerateOutput`: what `generate(..., output_scores=True)` returns."""

from __future__ import annotations

from typing import NamedTuple

from jaxtyping import Array, Float, Int


class GenerateOutput(NamedTuple):
    """The tokens of [`boxwood.models.generate`][] with their scores, returned
    with `output_scores=True` (a named tuple: `sequences, scores, log_probs,
    sequence_scores = generate(...)` works too). Shapes are those of one prompt;
    a batch (or `num_return_sequences` above 1) adds a leading axis of rows.

    **Fields:**

    - `sequences`: the tokens `generate` returns without `output_scores`.
    - `scores`: greedy decoding and sampling: the scores each step chose from,
      float32 `(steps, vocab)`, as `transformers`' `generate(output_scores=True,
      return_dict_in_generate=True).scores` stacks them: the logits after the
      rules (`repetition_penalty`, `no_repeat_ngram_size`, `min_new_tokens`) and,
      when sampling, after `temperature`, `top_k` and `top_p` (`-inf` for the
      tokens they drop). `steps` is the number of steps run: `max_new_tokens`, or
      fewer where every row stopped early. Beam search: `None`.
    - `log_probs`: greedy decoding and sampling: the log-probability of each new
      token under the distribution it was chosen from (the softmax of its
      `scores`), float32 `(max_new_tokens,)`; `0` where a row had stopped (its
      padding), so a row's sum is its sequence's log-probability. This is
      `transformers`' `compute_transition_scores(..., normalize_logits=True)`.
      Beam search: `None`.
    - `sequence_scores`: beam search: each returned sequence's score, float32
      `(num_return_sequences,)` (the summed log-probabilities of its new tokens
      over `new_tokens ** length_penalty`), `transformers`' `sequences_scores`.
      Otherwise `None`.
    """

    sequences: Int[Array, "*rows total"]
    scores: Float[Array, "*rows steps vocab"] | None
    log_probs: Float[Array, "*rows new"] | None
    sequence_scores: Float[Array, "*rows"] | None
