"""Build script for boxwood's optional C extensions (the rest is in pyproject.toml).

`boxwood._jit._speedups` runs `filter_jit`'s warm calls in C, and
`boxwood._module._fields` reads modules' fields in C. Both are optional: where no C
compiler is available the build continues without them and boxwood uses the same
paths written in Python (set `BOXWOOD_PURE_PYTHON=1` to choose that path anyway).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "boxwood._jit._speedups",
            sources=["src/boxwood/_jit/_speedups.c"],
            optional=True,
        ),
        Extension(
            "boxwood._module._fields",
            sources=["src/boxwood/_module/_fields.c"],
            optional=True,
        ),
    ]
)
