"""Display of a large model: `Module._repr_html_` (the notebook tree) and
`boxwood.summary` for models of 10,000 array leaves, next to `tree_pformat` (the
text repr) on the same model. The goal: the HTML tree renders in under a second.
"""

from __future__ import annotations

import jax
import numpy as np

import boxwood as bw
from _timing import interleave, timing_rows
from boxwood import nn

FIGURE = "display"
GOAL_S = 1.0


class Stack(bw.Module):
    """A deep stack of linear layers: one long list."""

    layers: list


class Blocks(bw.Module):
    """Nested: blocks of a few layers each (many collapsible entries)."""

    blocks: tuple


def _linear(rng) -> nn.Linear:
    layer = nn.Linear(8, 8, key=jax.random.key(0))
    w = rng.standard_normal((8, 8), dtype=np.float32)
    return bw.tree_at(lambda m: (m.weight, m.bias), layer, (w, w[0]))


def models(leaves: int) -> dict[str, bw.Module]:
    rng = np.random.default_rng(0)
    base = _linear(rng)  # numpy leaves: building the model stays cheap
    layers = [base] * (leaves // 2)
    blocks = tuple(Stack(layers[i : i + 4]) for i in range(0, len(layers), 4))
    return {
        "one list of Linear": Stack(layers),
        "nested blocks of 4 Linear": Blocks(blocks),
    }


def run(quick: bool) -> list[dict]:
    reps = 3 if quick else 9
    rows = []
    for case, model in models(10_000).items():
        assert len(jax.tree_util.tree_leaves(model)) == 10_000
        runners = {
            "tree_pformat": lambda n, m=model: [bw.tree_pformat(m) for _ in range(n)],
            "_repr_html_": lambda n, m=model: [m._repr_html_() for _ in range(n)],
            "summary (text)": lambda n, m=model: [str(bw.summary(m)) for _ in range(n)],
        }
        results = interleave(
            runners, reps=reps, target_s=0.2, min_calls=1, max_calls=50
        )
        rows += timing_rows(
            FIGURE, f"{case}, 10,000 leaves", results, limit="tree_pformat",
            scale=1e3, unit="ms",
        )  # fmt: skip
    return rows


if __name__ == "__main__":
    for r in run(quick=True):
        print(
            f"{r['case']:40s} {r['contender']:16s} {r['value']:8.1f} {r['unit']}  x{r['ratio']:.2f}"
        )
