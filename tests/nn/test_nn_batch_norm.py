import jax
import jax.numpy as jnp
import numpy as np
import pytest

import boxwood
import boxwood.nn as nn


@pytest.fixture
def normal():
    """`normal(*shape)`: standard normal float32 inputs (NumPy-generated, so that
    tests do not compile a random-number kernel per shape)."""
    rng = np.random.default_rng(0)
    return lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)


def batched(bn, axis_name="batch", **kwargs):
    """`bn` over a batch, as one jitted program (eagerly, each operation would
    compile a program of its own for each shape)."""
    call = lambda x, s: bn(x, s, **kwargs)
    return jax.jit(
        jax.vmap(call, axis_name=axis_name, in_axes=(0, None), out_axes=(0, None))
    )


def test_initial_state_and_params():
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch")
    mean, var = state.get(bn.state_index)
    np.testing.assert_array_equal(mean, jnp.zeros(3))
    np.testing.assert_array_equal(var, jnp.ones(3))
    np.testing.assert_array_equal(bn.weight, jnp.ones(3))
    np.testing.assert_array_equal(bn.bias, jnp.zeros(3))
    assert bn.momentum == 0.99 and bn.eps == 1e-5 and not bn.inference


def test_training_normalises_with_batch_statistics(getkey, normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(2, "batch", channelwise_affine=False)
    x = 3 * normal(16, 2, 5) + 7
    y, state = batched(bn)(x, state)
    per_channel = jnp.moveaxis(y, 1, 0).reshape(2, -1)
    np.testing.assert_allclose(per_channel.mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(per_channel.std(axis=1), 1, atol=1e-3)


def test_running_stats_no_warmup_and_unbiased(getkey, normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(2, "batch", momentum=0.9)
    x = normal(5, 2, 3) + 2
    _, state = batched(bn)(x, state)
    flat = jnp.moveaxis(x, 1, 0).reshape(2, -1)
    mean, var = state.get(bn.state_index)
    np.testing.assert_allclose(mean, 0.1 * flat.mean(axis=1), rtol=1e-5)
    np.testing.assert_allclose(var, 0.9 + 0.1 * flat.var(axis=1, ddof=1), rtol=1e-5)


def test_inference_uses_running_stats_and_keeps_state(getkey, normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(2, "batch")
    running = (jnp.array([1.0, -1.0]), jnp.array([4.0, 0.25]))
    state = state.set(bn.state_index, running)
    x = normal(3, 2)
    expected = (x - running[0][None]) / jnp.sqrt(running[1] + 1e-5)[None]
    for model, kwargs in [(bn, {"inference": True}), (nn.inference_mode(bn), {})]:
        y, new_state = batched(model, **kwargs)(x, state)
        np.testing.assert_allclose(y, expected, rtol=1e-5)
        np.testing.assert_array_equal(new_state.get(bn.state_index)[1], running[1])
    # A call-time `inference=False` overrides the model-wide flag.
    eval_bn = nn.inference_mode(bn)
    _, trained = batched(eval_bn, inference=False)(x, state)
    assert not np.allclose(trained.get(bn.state_index)[1], running[1])


def test_affine_parameters_apply(getkey):
    bn, state = nn.make_with_state(nn.BatchNorm)(2, "batch")
    bn = boxwood.tree_at(
        lambda m: (m.weight, m.bias),
        bn,
        (jnp.array([2.0, 3.0]), jnp.array([1.0, -1.0])),
    )
    y, _ = batched(bn, inference=True)(jnp.zeros((2, 2)), state)
    np.testing.assert_allclose(y, jnp.array([[1.0, -1.0]] * 2), atol=1e-6)


def test_no_affine_has_no_params():
    bn = nn.BatchNorm(4, "batch", channelwise_affine=False)
    assert bn.weight is None and bn.bias is None


def test_several_axis_names(getkey, normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(2, ("outer", "inner"), momentum=0.0)
    x = normal(3, 4, 2)
    inner = jax.vmap(bn, axis_name="inner", in_axes=(0, None), out_axes=(0, None))
    y, state = jax.vmap(
        inner, axis_name="outer", in_axes=(0, None), out_axes=(0, None)
    )(x, state)
    np.testing.assert_allclose(
        state.get(bn.state_index)[0], x.mean(axis=(0, 1)), rtol=1e-5
    )
    np.testing.assert_allclose(
        state.get(bn.state_index)[1], x.reshape(-1, 2).var(axis=0, ddof=1), rtol=1e-5
    )


def test_gradients_and_jit(getkey, normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch")
    x = normal(4, 3)

    @jax.jit
    def loss(bn, x, state):
        y, _ = batched(bn)(x, state)
        return jnp.sum(y * jnp.arange(3.0)[None])

    grads = jax.grad(loss)(bn, x, state)
    assert grads.weight.shape == (3,)
    assert float(jnp.abs(grads.weight).sum()) > 0


def test_bf16_forward(getkey, normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch", dtype=jnp.bfloat16)
    assert bn.weight.dtype == jnp.bfloat16
    assert state.get(bn.state_index)[0].dtype == jnp.bfloat16
    x = normal(8, 3, 2).astype(jnp.bfloat16)
    y, state = batched(bn)(x, state)
    assert y.dtype == jnp.bfloat16
    assert state.get(bn.state_index)[1].dtype == jnp.bfloat16
    # float32 statistics with a bf16 input also work, and give a bf16 output.
    bn32, state32 = nn.make_with_state(nn.BatchNorm)(3, "batch")
    y32, _ = batched(bn32)(x, state32)
    assert y32.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        y.astype(jnp.float32), y32.astype(jnp.float32), atol=0.05
    )


@pytest.mark.parametrize("shape", [(2, 4), (2,), (2, 3, 1)])
def test_wrong_channels_raises(shape):
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch")
    with pytest.raises(
        ValueError,
        match=r"BatchNorm\(input_size=3\): expected input of shape \(3, \.\.\.\)",
    ):
        batched(bn)(jnp.ones((2, *shape)), state)


def test_scalar_input_raises():
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch")
    with pytest.raises(
        ValueError, match=r"expected input of shape \(3, \.\.\.\), got \(\)"
    ):
        batched(bn)(jnp.ones(2), state)


def test_outside_vmap_raises():
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch")
    with pytest.raises(NameError, match="must be called inside `jax.vmap"):
        bn(jnp.ones(3), state)


def test_single_value_per_channel_raises():
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch")
    with pytest.raises(ValueError, match="more than one value per channel"):
        batched(bn)(jnp.ones((1, 3)), state)
    y, _ = batched(bn, inference=True)(jnp.ones((1, 3)), state)  # fine in inference
    assert y.shape == (1, 3)


@pytest.mark.parametrize("momentum", [1.0, -0.1])
def test_bad_momentum_raises(momentum):
    with pytest.raises(ValueError, match=r"`momentum` must be in \[0, 1\)"):
        nn.BatchNorm(3, "batch", momentum=momentum)


def test_config_is_static():
    bn = nn.BatchNorm(3, ["a", "b"])
    assert bn.axis_name == ("a", "b")
    leaves = jax.tree_util.tree_leaves(nn.delete_init_state(bn))
    assert len(leaves) == 2  # only weight and bias


def _flat(x):
    """(batch, channels, *spatial) -> (channels, batch * spatial)."""
    return jnp.moveaxis(x, 1, 0).reshape(x.shape[1], -1)


@pytest.mark.parametrize(
    "mode, present",
    [
        ("torch", {"state_index"}),
        ("batch", {"batch_counter", "batch_state_index"}),
        ("ema", {"ema_first_time_index", "ema_state_index"}),
    ],
)
def test_mode_state_layout(mode, present):
    bn, state = nn.make_with_state(nn.BatchNorm)(3, "batch", mode=mode)
    names = {
        "state_index",
        "batch_counter",
        "batch_state_index",
        "ema_first_time_index",
        "ema_state_index",
    }
    assert {n for n in names if getattr(bn, n) is not None} == present
    assert bn.mode == mode
    if mode == "batch":
        assert state.get(bn.batch_counter) == 0
        np.testing.assert_array_equal(state.get(bn.batch_state_index)[1], jnp.ones(3))
    if mode == "ema":
        assert bool(state.get(bn.ema_first_time_index)) is True


def test_batch_mode_trains_on_batch_stats_and_debiases_at_inference(normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(
        2, "batch", momentum=0.9, channelwise_affine=False, mode="batch"
    )
    x1, x2 = normal(6, 2, 3) + 2, 2 * normal(6, 2, 3) - 1
    y1, state = batched(bn)(x1, state)
    m1, v1 = _flat(x1).mean(1), _flat(x1).var(1)  # biased variance
    np.testing.assert_allclose(
        _flat(y1), (_flat(x1) - m1[:, None]) / jnp.sqrt(v1 + 1e-5)[:, None], atol=1e-4
    )
    _, state = batched(bn)(x2, state)
    m2, v2 = _flat(x2).mean(1), _flat(x2).var(1)
    assert state.get(bn.batch_counter) == 2
    hidden_mean = 0.9 * (0.1 * m1) + 0.1 * m2
    hidden_var = 0.9 * (0.9 + 0.1 * v1) + 0.1 * v2
    mean, var = state.get(bn.batch_state_index)
    np.testing.assert_allclose(mean, hidden_mean, rtol=1e-5)
    np.testing.assert_allclose(var, hidden_var, rtol=1e-5)
    xt = normal(4, 2)
    y, after = batched(bn, inference=True)(xt, state)
    debias = 1 - 0.9**2
    mean_hat, var_hat = hidden_mean / debias, hidden_var / debias
    expected = (xt - mean_hat[None]) / jnp.sqrt(var_hat + 1e-5)[None]
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
    assert after.get(bn.batch_counter) == 2


def test_ema_mode_normalises_with_updated_running_stats(normal):
    bn, state = nn.make_with_state(nn.BatchNorm)(
        2, "batch", momentum=0.8, channelwise_affine=False, mode="ema"
    )
    x1, x2 = normal(5, 2) + 3, normal(5, 2) - 1
    y1, state = batched(bn)(x1, state)
    m1, v1 = x1.mean(0), x1.var(0)  # first step: the batch statistics themselves
    np.testing.assert_allclose(
        y1, (x1 - m1[None]) / jnp.sqrt(v1 + 1e-5)[None], atol=1e-4
    )
    assert bool(state.get(bn.ema_first_time_index)) is False
    y2, state = batched(bn)(x2, state)
    m = 0.8 * m1 + 0.2 * x2.mean(0)
    v = 0.8 * v1 + 0.2 * x2.var(0)
    np.testing.assert_allclose(state.get(bn.ema_state_index)[0], m, rtol=1e-5)
    np.testing.assert_allclose(y2, (x2 - m[None]) / jnp.sqrt(v + 1e-5)[None], atol=1e-4)
    y3, _ = batched(nn.inference_mode(bn))(x2, state)
    np.testing.assert_allclose(y3, y2, atol=1e-5)


def test_legacy_mode_warns_and_bad_mode_raises():
    with pytest.warns(DeprecationWarning, match=r"mode='legacy'\) is Equinox's"):
        bn = nn.BatchNorm(3, "batch", mode="legacy")
    assert bn.mode == "ema"
    with pytest.raises(ValueError, match=r"`mode` must be one of 'torch'.*got 'EMA'"):
        nn.BatchNorm(3, "batch", mode="EMA")


@pytest.mark.parametrize("mode", ["batch", "ema"])
def test_equinox_modes_allow_one_value_per_channel_and_jit(mode, normal):
    # Only the unbiased variance of mode="torch" needs two values per channel.
    bn, state = nn.make_with_state(nn.BatchNorm)(2, "batch", mode=mode)
    step = jax.jit(lambda bn, x, s: batched(bn)(x, s))
    for _ in range(2):
        y, state = step(bn, normal(1, 2), state)
    assert y.shape == (1, 2) and bool(np.isfinite(np.asarray(y)).all())
