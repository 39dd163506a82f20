"""The main demo: several modules, each with its own optimizer, in one compiled step.

Run it with `boxwood-demo` (or `python -m boxwood.demo`; `--help` lists the options).
On the bundled UCI handwritten digits it trains an encoder with dropout, a classifier
head and a decoder for an auxiliary reconstruction loss, each with its own optax
state, in one `train_step` compiled by `boxwood.filter_jit` (no `partial`, no
`static_argnums`); evaluates in `nn.inference_mode`; keeps dispatch asynchronous (one
read per epoch); reports the compile counts from `cache_info()`; and writes a
checkpoint, reloads it and checks the reloaded modules' accuracy.
"""

from __future__ import annotations

import sys

from ._cli import DemoError, Options, parse

__all__ = ["main", "Options", "DemoError"]


def main(argv: list[str] | None = None) -> int:
    """Run the demo with command-line arguments `argv` (default: `sys.argv[1:]`).

    **Returns:** `0` on success. A problem the user can fix (a bad option, a missing
    data folder or package) prints one line, `boxwood-demo: error: ...`, to stderr
    and raises `SystemExit(2)`.
    """
    try:
        from ._run import run

        run(parse(argv))
    except DemoError as error:
        print(f"boxwood-demo: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return 0
