"""Walking a jaxpr for the tests that check what a program holds."""

import jax.extend.core as jex


def all_equations(jaxpr):
    """The equations of `jaxpr` and of every jaxpr nested in them (scan and while
    bodies, checkpoints, conditionals, jit calls)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jex.jaxprs_in_params(eqn.params):
            yield from all_equations(sub)


def primitive_names(jaxpr):
    """The names of the primitives `jaxpr` uses, nested jaxprs included."""
    return {eqn.primitive.name for eqn in all_equations(jaxpr)}
