"""`boxwood.models.causal_lm_loss`: equal to the loss of the whole logits (value and
gradient), `-100` and `mask` honoured, and no whole-logits array in the jaxpr."""

import functools

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import jax.random as jr
import numpy as np
import pytest

import boxwood as bw
import boxwood.models as bm
from _precision import highest_matmul_precision  # noqa: F401
from boxwood import nn

pytestmark = pytest.mark.usefixtures("highest_matmul_precision")

VOCAB, HIDDEN = 37, 8


class TinyLM(bw.Module):
    """A stand-in causal LM with the interface `causal_lm_loss` reads: each
    position's hidden state mixes the embeddings of the tokens up to it."""

    embed: jax.Array
    proj: nn.Linear

    def __init__(self, key, dtype=jnp.float32):
        k1, k2 = jr.split(key)
        self.embed = jr.normal(k1, (VOCAB, HIDDEN), dtype)
        self.proj = nn.Linear(HIDDEN, HIDDEN, dtype=dtype, key=k2)

    def hidden_states(self, input_ids):
        x = self.embed[input_ids]
        steps = jnp.arange(1, x.shape[0] + 1, dtype=x.dtype)[:, None]
        return jnp.tanh(jax.vmap(self.proj)(jnp.cumsum(x, axis=0) / steps)) * 3

    def output_embedding(self):
        return self.embed

    def __call__(self, input_ids):
        return self.hidden_states(input_ids) @ self.embed.T


def naive_loss(model, input_ids, labels=None, mask=None):
    """The loss from the whole float32 logits, as `transformers` computes it."""
    ids = jnp.atleast_2d(input_ids)
    labels = ids if labels is None else jnp.atleast_2d(labels)
    if mask is not None:
        labels = jnp.where(jnp.atleast_2d(mask).astype(bool), labels, -100)
    logits = jax.vmap(model)(ids).astype(jnp.float32)[:, :-1]
    targets = labels[:, 1:]
    counted = targets != -100
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, jnp.where(counted, targets, 0)[..., None], -1)
    total = -jnp.sum(jnp.where(counted, picked[..., 0], 0.0))
    return total / jnp.sum(counted).astype(jnp.float32)


# `naive_loss` as one compiled program per shape: the reference values, computed
# op by op otherwise (each small operation compiling on its own).
naive_loss_jit = bw.filter_jit(naive_loss)


@pytest.fixture(scope="module")
def model():
    """One model for the module: models are immutable, and every test compares
    with `naive_loss` of the same model, so any key serves."""
    return TinyLM(jr.key(0))


def _ids(seed, shape):
    return jnp.asarray(np.random.RandomState(seed).randint(0, VOCAB, size=shape))


CHUNK_SIZES = (1, 3, 5, 12, 100)


@bw.filter_jit
def _chunked_and_whole(model, ids):
    """`({chunk_size: loss}, naive loss)` of `ids`, every chunk size in one
    compiled program (each size is its own scan; op by op, each of their small
    operations would compile on its own)."""
    chunked = {c: bm.causal_lm_loss(model, ids, chunk_size=c) for c in CHUNK_SIZES}
    return chunked, naive_loss(model, ids)


_LOSSES = {}


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
@pytest.mark.parametrize("shape", [(12,), (3, 12)])
def test_equals_the_whole_logits_loss(model, shape, chunk_size):
    if shape not in _LOSSES:  # computed once per shape, for its five chunk sizes
        _LOSSES[shape] = _chunked_and_whole(model, _ids(0, shape))
    chunked, expected = _LOSSES[shape]
    got = chunked[chunk_size]
    assert got.shape == () and got.dtype == jnp.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5)


@bw.filter_jit
def _label_and_mask_losses(model, ids, labels, moved, relabelled, mask):
    """Every loss `test_labels_ignore_index_and_mask` compares, in one program."""
    loss = bm.causal_lm_loss
    return dict(
        got=loss(model, ids, labels, chunk_size=4),
        expected=naive_loss(model, ids, labels),
        moved=loss(model, ids, moved, chunk_size=4),
        masked=loss(model, ids, labels, mask=mask, chunk_size=3),
        expected_masked=naive_loss(model, ids, labels, mask),
        relabelled=loss(model, ids, relabelled, mask=mask),
        masked_default=loss(model, ids, labels, mask=mask),
        int_mask=loss(model, ids, labels, mask=mask.astype(jnp.int32)),
    )


def test_labels_ignore_index_and_mask(model):
    ids = _ids(1, (3, 12))
    labels = np.array(_ids(2, (3, 12)))
    labels[0, 3:6], labels[1, 9] = -100, -100
    # ignoring one more position
    moved = labels.copy()
    moved[0, 7] = -100
    # a masked position's label changed
    relabelled = labels.copy()
    relabelled[1, 7] = (relabelled[1, 7] + 1) % VOCAB
    mask = np.ones((3, 12), bool)
    mask[1, 6:] = False
    out = _label_and_mask_losses(
        model, ids, *map(jnp.asarray, (labels, moved, relabelled, mask))
    )
    np.testing.assert_allclose(out["got"], out["expected"], rtol=1e-5)
    # ignoring one more position changes the loss (the comparison can fail)
    assert out["moved"] != out["got"]
    np.testing.assert_allclose(out["masked"], out["expected_masked"], rtol=1e-5)
    # a masked position's label is not read
    np.testing.assert_allclose(out["relabelled"], out["masked_default"])
    np.testing.assert_allclose(out["int_mask"], out["expected_masked"], rtol=1e-5)


def test_nothing_to_predict_gives_zero(model):
    ids = _ids(3, (6,))
    loss = bw.filter_jit(bm.causal_lm_loss)
    assert loss(model, ids, jnp.full(6, -100)) == 0
    assert loss(model, ids[:1]) == 0


def test_gradient_equals_the_whole_logits_gradient(model):
    ids = _ids(4, (2, 9))
    labels = ids.at[1, 2].set(-100)
    loss = functools.partial(bm.causal_lm_loss, chunk_size=4)
    got = bw.filter_jit(bw.filter_grad(loss))(model, ids, labels)
    expected = bw.filter_jit(bw.filter_grad(naive_loss))(model, ids, labels)
    for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)


def _tangent(tree, seed):
    """A random tangent of `tree`'s arrays (its other leaves as they are)."""
    arrays, rest = bw.partition(tree, bw.is_array)
    leaves, treedef = jax.tree.flatten(arrays)
    keys = jr.split(jr.key(seed), len(leaves))
    noise = [jr.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)]
    return jax.tree.unflatten(treedef, noise)


def test_forward_mode_and_second_derivatives_equal_the_whole_logits_ones(model):
    ids = _ids(11, (2, 9))
    labels = ids.at[0, 3].set(-100)
    arrays, rest = bw.partition(model, bw.is_array)
    direction = _tangent(model, 1)

    def as_function(loss):
        return lambda a: loss(bw.combine(a, rest), ids, labels)

    chunked = as_function(functools.partial(bm.causal_lm_loss, chunk_size=4))
    whole = as_function(naive_loss)

    @jax.jit
    def derivatives(a, t):
        # forward mode, and the Hessian's product with `t` (forward over reverse)
        jvps = [jax.jvp(f, (a,), (t,))[1] for f in (chunked, whole)]
        hvps = [jax.jvp(jax.grad(f), (a,), (t,))[1] for f in (chunked, whole)]
        return jvps, hvps

    (jvp, expected_jvp), (hvp, expected_hvp) = derivatives(arrays, direction)
    np.testing.assert_allclose(jvp, expected_jvp, rtol=1e-4)
    for g, e in zip(jax.tree.leaves(hvp), jax.tree.leaves(expected_hvp), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-5)


def test_a_gradient_with_respect_to_one_input_forms_only_its_products():
    from boxwood.models._loss_chunks import chunked_nll

    hidden = jr.normal(jr.key(1), (10, HIDDEN))
    weight = jr.normal(jr.key(2), (VOCAB, HIDDEN))
    targets = jnp.asarray(np.random.RandomState(3).randint(0, VOCAB, 10))
    targets = targets.at[4].set(-100)

    def naive(w, h):
        logp = jax.nn.log_softmax(h @ w.T, axis=-1)
        picked = jnp.take_along_axis(logp, jnp.maximum(targets, 0)[:, None], -1)
        return -jnp.sum(jnp.where(targets != -100, picked[:, 0], 0.0))

    def chunked(w, h):
        return chunked_nll(w, 3, h, targets)[0]

    for argnums in (0, 1, (0, 1)):
        got = jax.jit(jax.grad(chunked, argnums))(weight, hidden)
        expected = jax.jit(jax.grad(naive, argnums))(weight, hidden)
        for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
        jaxpr = jax.make_jaxpr(jax.grad(chunked, argnums))(weight, hidden).jaxpr
        products = [
            e
            for e in _eqns(jaxpr)
            if e.primitive.name == "dot_general" and all(v.aval.ndim for v in e.invars)
        ]
        # the logits, and the products of their cotangent that a gradient needs
        assert len(products) == 1 + len(np.atleast_1d(argnums)), argnums

    # a per-example loss under `vmap`, differentiated
    def row_loss(h, t):
        return chunked_nll(weight, 3, h, t)[0]

    rows = jax.jit(jax.vmap(jax.grad(row_loss)))(
        hidden.reshape(2, 5, HIDDEN), targets.reshape(2, 5)
    )
    expected = jax.jit(jax.grad(naive, 1))(weight, hidden)
    np.testing.assert_allclose(rows.reshape(10, HIDDEN), expected, rtol=1e-4, atol=1e-6)


def test_under_jit_and_bfloat16(model):
    ids = _ids(5, (2, 11))
    low = bw.cast_floating(model, jnp.bfloat16)
    got = bw.filter_jit(bm.causal_lm_loss)(low, ids, chunk_size=4)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, naive_loss_jit(low, ids), rtol=1e-3)
    np.testing.assert_allclose(got, naive_loss_jit(model, ids), rtol=3e-2)
    # float32 master, bfloat16 compute: the gradient comes back float32
    grads = bw.filter_jit(
        bw.filter_grad(
            lambda m: bm.causal_lm_loss(bw.cast_floating(m, jnp.bfloat16), ids)
        )
    )(model)
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    # bfloat16 parameters throughout: bfloat16 gradients, a float32 loss
    loss, grads = bw.filter_jit(bw.filter_value_and_grad(bm.causal_lm_loss))(low, ids)
    assert loss.dtype == jnp.float32
    assert {g.dtype for g in jax.tree.leaves(grads)} == {jnp.dtype(jnp.bfloat16)}
    # and as near the float32 model's gradient as bfloat16 allows (the whole
    # logits' loss of the bfloat16 model: within 1% of each leaf's largest entry)
    exact = bw.filter_jit(bw.filter_grad(naive_loss))(model, ids)
    for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(exact), strict=True):
        scale = float(jnp.max(jnp.abs(e)))
        np.testing.assert_allclose(g.astype(jnp.float32), e, atol=2e-2 * scale)


def test_master_float32_matmuls_run_in_bfloat16(model):
    ids = _ids(9, (2, 11))

    def loss(m):
        return bm.causal_lm_loss(bw.cast_floating(m, jnp.bfloat16), ids, chunk_size=4)

    jaxpr = jax.make_jaxpr(bw.filter_value_and_grad(loss))(model).jaxpr
    dots = [e for e in _eqns(jaxpr) if e.primitive.name == "dot_general"]
    # the products of two arrays; the others scale a gradient by the loss's
    # float32 cotangent (a scalar)
    products = [e for e in dots if all(v.aval.ndim for v in e.invars)]
    vocab_dots = [
        e for e in products if VOCAB in {d for v in e.invars for d in v.aval.shape}
    ]
    # the head: the logits and the two products of their cotangent, once each
    # (a checkpointed chunk computes the logits again in the backward pass: 4)
    assert len(vocab_dots) == 3, [
        tuple(v.aval.shape for v in e.invars) for e in vocab_dots
    ]
    dtypes = {v.aval.dtype for e in products for v in e.invars}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    # the log-sum-exp is in float32
    exps = [e for e in _eqns(jaxpr) if e.primitive.name == "exp"]
    assert exps and {e.outvars[0].aval.dtype for e in exps} == {jnp.dtype(jnp.float32)}


def _eqns(jaxpr):
    """The equations of `jaxpr` and of the jaxprs nested in them (the scan bodies
    of the forward and backward passes, checkpoints)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jex.jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def _avals(jaxpr):
    """Every value's abstract array in `jaxpr`, its sub-jaxprs included."""
    for eqn in _eqns(jaxpr):
        yield from (v.aval for v in (*eqn.invars, *eqn.outvars))


def _logit_shapes(model, ids, chunk_size, vocab=VOCAB):
    def loss(m):
        return bm.causal_lm_loss(m, ids, chunk_size=chunk_size)

    jaxpr = jax.make_jaxpr(bw.filter_value_and_grad(loss))(model).jaxpr
    return {
        tuple(a.shape)
        for a in _avals(jaxpr)
        if hasattr(a, "shape") and a.ndim >= 2 and a.shape[-1] == vocab
    }


def test_no_whole_logits(model):
    batch, seq = 3, 12
    ids = _ids(6, (batch, seq))
    whole = {(seq, VOCAB), (batch, seq, VOCAB), (batch * seq, VOCAB)}
    shapes = _logit_shapes(model, ids, chunk_size=4)
    assert shapes and not shapes & whole, shapes
    assert (4, VOCAB) in shapes
    # the walk does find whole logits where they exist (the test can fail)
    assert (batch * seq, VOCAB) in _logit_shapes(model, ids, chunk_size=batch * seq)
    naive = jax.make_jaxpr(bw.filter_grad(naive_loss))(model, ids).jaxpr
    assert (batch, seq, VOCAB) in {tuple(a.shape) for a in _avals(naive)}


class _NoHead(bw.Module):
    def hidden_states(self, input_ids):
        return jnp.zeros((input_ids.shape[0], HIDDEN))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(labels=jnp.zeros(5, jnp.int32)),
            ValueError,
            r"`labels` has shape \(5,\)",
        ),
        (dict(labels=jnp.zeros((1, 6), jnp.int32)), ValueError, r"`labels` has shape"),
        (dict(labels=jnp.zeros(6)), TypeError, r"`labels` must be an integer array"),
        (dict(mask=jnp.ones((2, 6), bool)), ValueError, r"`mask` has shape \(2, 6\)"),
        (dict(chunk_size=0), ValueError, r"`chunk_size` must be at least 1, got 0"),
        (dict(chunk_size=2.5), TypeError, r"`chunk_size` must be an int"),
        (dict(chunk_size=True), TypeError, r"`chunk_size` must be an int"),
        (dict(labels=jnp.full(6, VOCAB)), ValueError, r"from 0 to 36 .* got 37"),
        (
            dict(labels=jnp.full(6, -1)),
            ValueError,
            r"or -100 for a position left out of the loss; got -1 at position 1 ",
        ),
    ],
)
def test_errors(model, kwargs, error, match):
    with pytest.raises(error, match=match):
        bm.causal_lm_loss(model, _ids(7, (6,)), **kwargs)


def test_model_and_input_errors(model):
    with pytest.raises(TypeError, match=r"takes a causal language model with"):
        bm.causal_lm_loss(_NoHead(), _ids(7, (6,)))
    with pytest.raises(ValueError, match=r"`input_ids` must have shape \(seq,\) or"):
        bm.causal_lm_loss(model, _ids(7, (1, 2, 6)))
    labels = jnp.full(6, VOCAB)
    with pytest.raises(bw.BoxwoodRuntimeError, match=r"got a label outside"):
        bw.filter_jit(bm.causal_lm_loss)(model, _ids(7, (6,)), labels)


@bw.filter_jit
def _chunked_and_whole_gradients(model, ids, labels):
    """`((loss, gradient), gradient of the whole logits' loss)`, in one program."""
    chunked = bw.filter_value_and_grad(bm.causal_lm_loss)
    return chunked(model, ids, labels, chunk_size=5), bw.filter_grad(naive_loss)(
        model, ids, labels
    )


@pytest.mark.parametrize(
    "kind, options",
    [("gpt2", {}), ("llama", dict(tie_word_embeddings=False)), ("gemma", {})],
)
def test_equals_transformers_labels_loss(kind, options):
    from _hf_models import WIDE, shared_model, token_ids, torch

    model, reference = shared_model(kind, **WIDE, **options)
    ids = token_ids(8, (2, 13))
    labels = ids.copy()
    labels[0, 4:7] = -100
    with torch.no_grad():
        out = reference(torch.tensor(ids), labels=torch.tensor(labels))
    ids, labels = jnp.asarray(ids), jnp.asarray(labels)
    if kind != "gpt2":
        loss = bw.filter_jit(bm.causal_lm_loss)(model, ids, labels, chunk_size=5)
        np.testing.assert_allclose(loss, out.loss.item(), rtol=1e-5)
        return  # the chunked gradient's path is the same for every family
    # GPT-2: the value and the gradient, and the whole logits' gradient, from
    # one compiled program
    (loss, grads), expected = _chunked_and_whole_gradients(model, ids, labels)
    np.testing.assert_allclose(loss, out.loss.item(), rtol=1e-5)
    for g, e in zip(jax.tree.leaves(grads), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)
    shapes = _logit_shapes(model, ids, chunk_size=5, vocab=97)
    assert (5, 97) in shapes and not shapes & {(13, 97), (2, 13, 97), (26, 97)}


@bw.filter_jit
def _both_conventions(model, ids, mask):
    """The loss without and with `predicted_from_padding`, in one program."""
    loss = bm.causal_lm_loss
    return loss(model, ids, attention_mask=mask), loss(
        model, ids, attention_mask=mask, predicted_from_padding=True
    )


@pytest.mark.parametrize(
    "kind, options",
    [("gpt2", {}), ("llama", dict(tie_word_embeddings=False))],
)
def test_both_left_padding_conventions_equal_transformers(kind, options):
    """With left padding, the default leaves out each row's first real token
    (only a pad precedes it); `predicted_from_padding=True` scores it, as
    `transformers`' recipe (labels -100 on the pads) does."""
    from _hf_models import WIDE, shared_model, token_ids, torch

    model, reference = shared_model(kind, **WIDE, **options)
    ids = token_ids(9, (2, 8))
    mask = np.ones((2, 8), np.int64)
    mask[0, :3] = 0
    ids[0, :3] = 0
    on_pads = np.where(mask == 1, ids, -100)  # `transformers`' recipe
    first_too = on_pads.copy()
    first_too[0, 3] = -100

    def theirs(labels):
        tensors = dict(input_ids=ids, attention_mask=mask, labels=labels)
        with torch.no_grad():
            out = reference(**{k: torch.tensor(v) for k, v in tensors.items()})
        return out.loss.item()

    default, scored = _both_conventions(model, ids, mask)
    np.testing.assert_allclose(default, theirs(first_too), rtol=1e-5)
    assert abs(float(scored) - float(default)) > 1e-3  # the conventions differ
    # the first real token is then predicted from a pad's output, which follows
    # how padding attends: as boxwood's in the Llama family (GPT-2's pads attend
    # to each other uniformly in `transformers`)
    if kind == "llama":
        np.testing.assert_allclose(scored, theirs(on_pads), rtol=1e-5)
