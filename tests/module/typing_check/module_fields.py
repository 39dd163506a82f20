"""Checked by basedpyright in tests/module/test_typing.py, never run: a type checker sees a
Module's fields and the constructor they make (`typing.dataclass_transform`).

Each line that must be reported ends with a comment naming the rule; every other
line must be clean.
"""

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

import boxwood as bw


class Layer(bw.Module):
    weight: jax.Array
    size: int = bw.field(static=True, default=3)
    scale: float = bw.field(default=1.0, converter=float)


class WithInit(bw.Module):
    table: jax.Array

    def __init__(self, rows: int):
        self.table = jnp.zeros((rows, 2))


class Child(Layer):
    extra: str = bw.field(static=True, default="x")


if TYPE_CHECKING:  # `static_field` warns when run

    class Legacy(bw.Module):
        weight: jax.Array
        name: str = bw.static_field(default="legacy")


def constructors_type_check() -> None:
    Layer(jnp.zeros(3))
    Layer(weight=jnp.zeros(3), size=4, scale=2.0)
    Child(jnp.zeros(3), 4, 1.0, "y")
    WithInit(3)
    Legacy(jnp.zeros(1), name="x")
    size: int = Layer(jnp.zeros(3)).size
    del size


if TYPE_CHECKING:  # the errors the checker must report

    def errors() -> None:
        Layer()  # reportCallIssue
        Layer(jnp.zeros(3), size="big")  # reportArgumentType
        Layer(jnp.zeros(3), colour=1)  # reportCallIssue
        WithInit()  # reportCallIssue
        Child(jnp.zeros(3), extra=1)  # reportArgumentType
        Legacy(jnp.zeros(1), name=2)  # reportArgumentType
        name: str = Layer(jnp.zeros(3)).size  # reportAssignmentType
        del name
