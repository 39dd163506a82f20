"""Build script for boxwood's optional C extensions (the rest is in pyproject.toml).

`boxwood._native._speedups` runs `filter_jit`'s warm calls in C, and
`boxwood._native._fields` reads modules' fields in C. Both are optional: where no C
compiler is available the build continues without them and boxwood uses the same
paths written in Python (set `BOXWOOD_PURE_PYTHON=1` to choose that path anyway).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "boxwood._native._speedups",
            sources=["src/boxwood/_native/_speedups.c"],
            optional=True,
        ),
        Extension(
            "boxwood._native._fields",
            sources=["src/boxwood/_native/_fields.c"],
            optional=True,
        ),
    ]
)
