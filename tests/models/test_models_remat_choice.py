"""`boxwood.models.choose_remat`: each remat policy's step compiled, its memory
held to a limit (faked here: a CPU reports none), the fastest that fits chosen,
and what it measured kept in the `RematChoice`."""

import jax
import jax.numpy as jnp
import optax
import pytest

import boxwood as bw
import boxwood.models as bm
import boxwood.nn as nn

X = jnp.ones((64, 32))


def _stack():
    return nn.Stacked(lambda k: nn.MLP(32, 32, 128, 1, key=k), 4, key=jax.random.key(0))


def _grad(stack, x):
    return bw.filter_grad(lambda s, x: jnp.sum(jax.vmap(s)(x) ** 2))(stack, x)


@pytest.fixture(scope="module")
def free_choice():
    return bm.choose_remat(_grad, _stack(), X, repeats=1)


def test_without_a_limit_every_policy_fits_and_the_fastest_is_taken(free_choice):
    model, choice = free_choice
    assert [r.policy for r in choice.rows] == list(bm._remat_choice.POLICIES)
    assert all(r.fits for r in choice.rows)
    # a CPU reports no memory limit; a TPU or GPU its memory
    assert (choice.limit_bytes is None) == (jax.default_backend() == "cpu")
    fastest = min(choice.rows, key=lambda r: r.step_seconds)
    assert choice.policy == fastest.policy and "fastest" in choice.reason
    assert model.remat == (False if fastest.policy == "none" else
                           True if fastest.policy == "full" else fastest.policy)  # fmt: skip
    none, dots, full = (r.peak_bytes for r in choice.rows)
    assert none >= dots >= full > 0  # keeping less takes less
    if jax.default_backend() == "cpu":  # a TPU pads this tiny stack to one size
        assert none > dots > full
    assert "step" in str(choice) and choice.policy in str(choice)


@pytest.fixture
def fake_memory(monkeypatch):
    """Each compiled step's memory, faked: 3000, 2000 and 1000 bytes for the
    candidates in the order compiled (none, dots, full), on any backend."""
    sizes = iter([3000, 2000, 1000] * 3)
    monkeypatch.setattr(bm._remat_choice, "_peak", lambda compiled: (next(sizes), 0))


def test_a_policy_over_the_limit_is_not_run_and_not_chosen(fake_memory):
    model, choice = bm.choose_remat(_grad, _stack(), X, memory_limit=2000, repeats=1)
    assert choice.policy == "full" and model.remat is True
    assert [r.peak_bytes for r in choice.rows] == [3000, 2000, 1000]
    assert [r.fits for r in choice.rows] == [False, False, True]  # 90% of 2000
    assert [r.step_seconds is None for r in choice.rows] == [True, True, False]
    assert "none, dots_with_no_batch_dims_saveable did not fit" in choice.reason
    assert choice.limit_bytes == 2000 and "limit" in str(choice)


def test_when_nothing_fits_the_smallest_is_returned_with_a_warning(fake_memory):
    with pytest.warns(
        UserWarning, match="no remat policy's step fits.*'full', the smallest"
    ):
        model, choice = bm.choose_remat(_grad, _stack(), X, memory_limit=500)
    assert choice.policy == "full" and "no policy fits" in choice.reason
    assert model.remat is True


@jax.numpy_dtype_promotion("standard")  # optax's Adam mixes int32 counts and floats
def test_a_training_step_with_its_optimiser_state():
    """The optimiser state holds the model's structure, remat setting included:
    each candidate gets it converted, and `choice.apply` converts the caller's."""
    stack = _stack()
    optimiser = optax.adam(1e-3)
    state = optimiser.init(stack)

    @bw.filter_jit(donate="all-except-first")
    def train_step(x, stack, state):
        loss, grads = bw.filter_value_and_grad(lambda s: jnp.sum(jax.vmap(s)(x) ** 2))(
            stack
        )
        updates, state = optimiser.update(grads, state, stack)
        return bw.apply_updates(stack, updates), state, loss

    chosen, choice = bm.choose_remat(
        lambda s, o, x: train_step(x, s, o), stack, state, X,
        policies=("full",), repeats=1,
    )  # fmt: skip
    assert not stack.layers.layers[0].weight.is_deleted()  # nothing donated
    assert choice.policy == "full" and chosen.remat is True
    with pytest.raises(ValueError, match="pytree"):  # the state before the choice
        train_step(X, chosen, state)
    _, _, loss = train_step(X, chosen, choice.apply(state))
    assert jnp.isfinite(loss)


def test_unrolls_cross_every_policy_with_every_way_of_looping(monkeypatch):
    # 1 and True compare equal in Python: the candidates must stay apart
    sizes = iter([3000, 2000, 1000, 2500, 1500, 500])
    monkeypatch.setattr(bm._remat_choice, "_peak", lambda compiled: (next(sizes), 0))
    model, choice = bm.choose_remat(
        _grad, _stack(), X, unrolls=(1, True), memory_limit=1000, repeats=1
    )
    assert [(r.policy, r.unroll) for r in choice.rows] == [
        (p, u) for u in (1, True) for p in bm._remat_choice.POLICIES
    ]
    assert [type(r.unroll) for r in choice.rows] == [int] * 3 + [bool] * 3
    # only full remat with the blocks unrolled fits in 90% of 1000 bytes
    assert [r.fits for r in choice.rows] == [False] * 5 + [True]
    assert (choice.policy, choice.unroll) == ("full", True)
    assert model.remat is True and model.unroll is True
    assert "'full, unroll=True'" in str(choice) and "none, unroll=1" in str(choice)
    assert "none, unroll=1, dots_with_no_batch_dims_saveable, unroll=1" in choice.reason
    # the caller's optimiser state is converted to both settings
    state = choice.apply(optax.sgd(0.1).init(_stack()))
    assert jax.tree.structure(state) == jax.tree.structure(optax.sgd(0.1).init(model))


def test_without_unrolls_the_models_own_loop_is_kept(free_choice):
    model, choice = free_choice
    assert choice.unroll is None and all(r.unroll is None for r in choice.rows)
    assert "unroll" not in str(choice)
    twice, _ = bm.choose_remat(
        _grad, _stack().with_unroll(2), X, policies=("full",), repeats=1
    )
    assert twice.unroll == 2 and type(twice.unroll) is int


def test_bad_arguments_are_errors_naming_them():
    with pytest.raises(ValueError, match="`policies` is empty"):
        bm.choose_remat(_grad, _stack(), X, policies=())
    with pytest.raises(ValueError, match=r"`margin` must be in \[0, 1\), got 1.5"):
        bm.choose_remat(_grad, _stack(), X, margin=1.5)
    with pytest.raises(TypeError, match="must have `with_remat`.*got Linear"):
        bm.choose_remat(_grad, nn.Linear(2, 2, key=jax.random.key(0)), X)
    with pytest.raises(ValueError, match=r"`unrolls` must be a non-empty.*got \(\)"):
        bm.choose_remat(_grad, _stack(), X, unrolls=())
    with pytest.raises(ValueError, match="`unrolls` must be a non-empty.*got True"):
        bm.choose_remat(_grad, _stack(), X, unrolls=True)
    with pytest.raises(ValueError, match="Stacked: `unroll` must be a positive int"):
        bm.choose_remat(_grad, _stack(), X, unrolls=(0,))
    with pytest.raises(ValueError, match="remat='auto'.*choose_remat"):
        _stack().with_remat("auto")
