"""Build script for boxwood's optional C extension (the rest is in pyproject.toml).

`boxwood._jit._speedups` runs `filter_jit`'s warm calls in C. It is optional: where no C
compiler is available the build continues without it and boxwood uses the same
path written in Python (set `BOXWOOD_PURE_PYTHON=1` to choose that path anyway).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "boxwood._jit._speedups",
            sources=["src/boxwood/_jit/_speedups.c"],
            optional=True,
        )
    ]
)
