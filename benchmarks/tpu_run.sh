#!/usr/bin/env bash
# The one prepared command for a machine with a GPU (issue #36): installs what is
# missing, runs benchmarks/gpu.py within a time budget, then the test suite with
# 12 workers, all inside about 9 minutes. Run from anywhere:
#
#   bash benchmarks/gpu_run.sh
#
# Writes into $OUT (default benchmarks/results/gpu-run/): env.txt (machine and
# versions), bench.log, gpu.json and gpu.md (the benchmark), pytest.txt (the
# suite's output) and pytest-summary.txt (its closing line and failing ids).
# Times, in seconds, from the environment: GPU_RUN_TOTAL_S (540), GPU_RUN_BENCH_S
# (330); the tests get what is left. To try it on a CPU machine:
#   OUT=/tmp/g GPU_RUN_BENCH_ARGS=--quick GPU_RUN_PYTEST_ARGS="-p no:xdist tests/test_import.py" \
#     bash benchmarks/gpu_run.sh
#
# Such a machine may reach no package registry: every install here is tried only
# for what is missing, under a short timeout, and wheels carried in .whl/ are
# installed first.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
TOTAL=${GPU_RUN_TOTAL_S:-540}
BENCH=${GPU_RUN_BENCH_S:-330}
OUT=${OUT:-$PWD/benchmarks/results/gpu-run}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
elapsed() { echo $(($(date +%s) - START)); }
has() { "$PY" -c "import $1" >/dev/null 2>&1; }

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  "$PY" --version
} >"$OUT/env.txt"

# Wheels carried with the working tree (see the device notes): installed first.
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# boxwood itself, unless this tree's is already imported, without touching the
# machine's packages (its torch and jax are CUDA builds that `.[dev]`'s pins would
# replace); the source tree if that fails.
if ! "$PY" -c "import boxwood, sys; sys.exit(not boxwood.__file__.startswith('$PWD/'))" 2>/dev/null; then
  timeout 90 "$PY" -m pip install -q --no-deps --no-build-isolation -e . >>"$OUT/env.txt" 2>&1 \
    || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
# What the benchmark and the suite need, installed only where missing.
for pair in jaxtyping:jaxtyping optax:optax torch:torch transformers:transformers \
  safetensors:safetensors pytest:pytest xdist:pytest-xdist hypothesis:hypothesis \
  equinox:equinox; do
  has "${pair%%:*}" || timeout 120 "$PY" -m pip install -q "${pair#*:}" >>"$OUT/env.txt" 2>&1 \
    || echo "missing and not installable: ${pair#*:}" >>"$OUT/env.txt"
done
# JAX must see the GPU: the CUDA build of jaxlib, if the machine has a GPU and JAX
# does not use it.
if command -v nvidia-smi >/dev/null \
  && [ "$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null)" != gpu ]; then
  timeout 180 "$PY" -m pip install -q -U "jax[cuda13]" >>"$OUT/env.txt" 2>&1 \
    || echo "jax[cuda13] not installable here: JAX runs on $("$PY" -c 'import jax; print(jax.default_backend())' 2>&1 | tail -1)" >>"$OUT/env.txt"
fi
"$PY" - >>"$OUT/env.txt" 2>&1 <<'EOF'
import importlib.metadata as md
for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt", "torch", "transformers",
             "optax", "equinox", "boxwood"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "not installed")
import jax
print("jax backend:", jax.default_backend(), jax.devices())
EOF
echo "[gpu_run] installs done at $(elapsed) s"

# The benchmark: gpu.py stops starting processes at its budget and stops the one
# running at the deadline (what it finished is kept).
# GPU_RUN_BENCH_ARGS adds options (`--quick` to try this script on a CPU).
timeout -k 10 $((BENCH + 30)) "$PY" benchmarks/gpu.py --budget "$BENCH" --out "$OUT/gpu.json" \
  ${GPU_RUN_BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
echo "[gpu_run] benchmark exit $? at $(elapsed) s"
cat "$OUT/gpu.md" 2>/dev/null || tail -n 40 "$OUT/bench.log"

# The suite: files whose packages this machine lacks are left out (named in the
# summary). XLA must not take 75% of the GPU per worker: 12 workers share it.
IGNORE=()
for pair in basedpyright:test_typing playwright:test_display_browser nbformat:test_notebooks \
  nbclient:test_notebooks beartype:test_module_jaxtyping beartype:test_ecosystem \
  lineax:test_ecosystem optimistix:test_ecosystem diffrax:test_ecosystem \
  treescope:test_display orbax.checkpoint:test_checkpoint_orbax matplotlib:test_demo \
  build:test_packaging; do
  has "${pair%%:*}" || IGNORE+=("--ignore=tests/${pair#*:}.py")
done
LEFT=$((TOTAL - $(elapsed) - 15))
[ "$LEFT" -lt 60 ] && LEFT=60
echo "[gpu_run] tests: ${LEFT} s; left out: ${IGNORE[*]:-none}"
# GPU_RUN_PYTEST_ARGS replaces `-n 12` (a test file, `-p no:xdist`, to try this
# script on a small machine).
XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -k 10 "$LEFT" "$PY" -m pytest -q --tb=short \
  ${GPU_RUN_PYTEST_ARGS:--n 12} "${IGNORE[@]}" >"$OUT/pytest.txt" 2>&1
CODE=$?
{
  echo "pytest exit $CODE after $(elapsed) s in all (124: stopped at its ${LEFT} s limit)"
  echo "left out: ${IGNORE[*]:-none}"
  grep -E "^(FAILED|ERROR) " "$OUT/pytest.txt" | sort
  tail -n 1 "$OUT/pytest.txt"
} >"$OUT/pytest-summary.txt"
cat "$OUT/pytest-summary.txt" | tail -n 30
echo "[gpu_run] done at $(elapsed) s"
