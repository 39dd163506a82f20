#!/usr/bin/env bash
# The one prepared command for the TPU machine (one TPU v5e chip, no network; see
# benchmarks/README.md): installs what is missing from the machine's own package
# index, runs benchmarks/accelerator.py within a time budget, then
# benchmarks/train_curve.py, then the test suite in one process with a time limit,
# all inside about 9.5 minutes; the phase "first" (not in the default phases) runs
# benchmarks/tpu_first_step.py: first steps and steady steps side by side. Run
# from the repository root:
#
#   bash benchmarks/tpu_run.sh            # full sizes
#   bash benchmarks/tpu_run.sh --quick    # tiny sizes (a CPU check of this script)
#
# Writes into $OUT (default benchmarks/results/tpu-run/), 9 files: run.txt (machine,
# versions, the phases' times, the suite's summary), bench.log (the benchmarks'
# output), accelerator.json and accelerator.md, train_curve.json and
# train_curve.md, pytest.txt (the suite's output, -v -rA), failures.txt (each
# test's start, each failure's traceback and each hung test's stacks as they
# happen, benchmarks/_tpu_failures.py) and pytest-junit.xml (the last attempt's);
# the phase "generate" (not in the defaults either) writes generate_profile.json
# and generate_profile.md (benchmarks/tpu_generate_profile.py); the phase "switches" (not in
# the defaults) writes decode_switches.json and decode_switches.md
# (benchmarks/decode_switches.py: `generate` with each decoding-step switch on
# and off, in one process, within TPU_RUN_FIRST_S); the phase "first" writes first_step.json and first_step.md (with
# TPU_RUN_FIRST_CACHE=1 instead first_step_nan_cold/ and first_step_nan_cached/:
# a process that fills a persistent compilation cache and one that reads it,
# both with BOXWOOD_ON_ERROR=nan; with TPU_RUN_FIRST_FRESH=N instead each
# contender in a fresh process, N rounds in alternating order, medians).
#
# From the environment (seconds): TPU_RUN_TOTAL_S (570), TPU_RUN_BENCH_S (330),
# TPU_RUN_CURVE_S (75), TPU_RUN_FIRST_S (300, each process of the phase
# "first"); the suite gets what is left. TPU_RUN_FIRST_ARGS (more options for
# tpu_first_step.py, e.g. "--order jax,none,rbg,threefry"). TPU_RUN_PHASES (default
# "bench,curve,tests"; e.g. "tests" to give the suite the whole run),
# TPU_RUN_BENCH_ARGS (more options for accelerator.py, e.g. "--attention xla"),
# TPU_RUN_GENERATE_PROFILE=0 (the phase "generate" runs decode_layouts.py only),
# TPU_RUN_GENERATE_LAYOUTS=0 (it runs tpu_generate_profile.py only),
# TPU_RUN_SWITCHES_ARGS (more options for decode_switches.py, e.g. "--batches 32"),
# TPU_RUN_PROFILE_ARGS (options for tpu_profile.py, the phase "profile", within
# TPU_RUN_FIRST_S; e.g. "--only whole,unrolled,nnx", flax installed for nnx, or
# "--case llama --only boxwood,whole,jax" for the 852M Llama),
# TPU_RUN_TEST_LIMIT (240: a test running longer is taken as hung, and pytest
# starts again without the tests that ran), TPU_RUN_TESTS (the test paths, or @FILE for those listed in FILE, e.g.
# @benchmarks/tpu_pending_tests.txt; default: TPU-relevant files first, tests/backends/test_tpu_only.py
# at their head, then all of tests/), TPU_RUN_TORCH=1 (also install the CPU torch of /opt/wheels, about 40 s,
# for the tests that compare with `transformers` PyTorch), TPU_RUN_SHARD=k/n (run the
# k-th of n shards of the test files: the suite across n calls; k1,k2/n runs several), TPU_RUN_SITE (where
# packages install; default .tpu-site/ in the checkout, on disk: never /tmp, which is
# in RAM there and outlives the call). Each phase installs only what it needs.
#
# equinox and beartype are not in the machine's index: their wheels travel in the
# git-ignored folder .whl-tpu/ (carry it with the tree), filled on a machine with
# a registry by
#   pip download --no-deps --only-binary=:all: -d .whl-tpu equinox==0.13.8 beartype==0.23.1
#
# To try it on a CPU: OUT=/tmp/t JAX_PLATFORMS=cpu bash benchmarks/tpu_run.sh --quick
# (the index install is skipped where /opt/pypi/simple does not exist).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
TOTAL=${TPU_RUN_TOTAL_S:-570}
BENCH=${TPU_RUN_BENCH_S:-330}
CURVE=${TPU_RUN_CURVE_S:-75}
FIRST=${TPU_RUN_FIRST_S:-300}
PHASES=${TPU_RUN_PHASES:-bench,curve,tests}
OUT=${OUT:-$PWD/benchmarks/results/tpu-run}
PY=${PYTHON:-python3}
QUICK=""
[ "${1:-}" = "--quick" ] && QUICK="--quick"
mkdir -p "$OUT"
LOG="$OUT/run.txt"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
elapsed() { echo $(($(date +%s) - START)); }
say() { echo "[tpu_run] $* (at $(elapsed) s)" | tee -a "$LOG"; }
has() { "$PY" -c "import $1" >/dev/null 2>&1; }
phase() { [[ ",$PHASES," == *",$1,"* ]]; }

if [ -n "${TPU_RUN_SHARD:-}" ]; then
  K=${TPU_RUN_SHARD%/*} N=${TPU_RUN_SHARD#*/}
  BAD=0
  [[ "$K" =~ ^[0-9]+(,[0-9]+)*$ && "$N" =~ ^[0-9]+$ ]] || BAD=1
  if [ "$BAD" = 0 ]; then
    for k in ${K//,/ }; do { [ "$k" -lt 1 ] || [ "$k" -gt "$N" ]; } && BAD=1; done
  fi
  if [ "$BAD" = 1 ]; then
    echo "TPU_RUN_SHARD must be k/n (or k1,k2,.../n) with 1 <= k <= n, got '$TPU_RUN_SHARD'" >&2
    exit 2
  fi
fi
{
  echo "date: $(date -u +%FT%TZ)"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), cores: $(nproc)"
  "$PY" --version
  echo "phases: $PHASES; args: ${QUICK:-none}"
} >"$LOG"

# boxwood from this tree; installed packages after what PYTHONPATH already names
# (JAX's own folder first, never replaced). They go into a folder of the
# checkout (on disk, kept from call to call), not into /tmp, which is in RAM on
# the TPU machine and is inherited by the next call.
SITE=${TPU_RUN_SITE:-$PWD/.tpu-site}
mkdir -p "$SITE"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}:$SITE"
INDEX=file:///opt/pypi/simple
PIP=("$PY" -m pip install --isolated -q --only-binary=:all: --target "$SITE")
# What each phase needs, as module:package pairs; a phase's packages install only
# when the phase runs (transformers, tokenizers and torch only with TPU_RUN_TORCH=1,
# for the tests that compare with them).
WANT_BASE="jaxtyping:jaxtyping wadler_lindig:wadler-lindig optax:optax"
WANT_BENCH="safetensors:safetensors tqdm:tqdm"
WANT_TESTS="pytest:pytest hypothesis:hypothesis safetensors:safetensors tqdm:tqdm"
# the demo's --plot and docs/models.md's tokenizer, each a group of its own
WANT_TESTS_EXTRA=("matplotlib:matplotlib" "tokenizers:tokenizers")
WANT_FLAX="flax:flax"
NEEDS_ECOSYSTEM=0
if phase bench && [[ ",${TPU_RUN_BENCH_ARGS:-}," != *"--only"* || "${TPU_RUN_BENCH_ARGS:-}" == *ecosystem* ]]; then
  NEEDS_ECOSYSTEM=1
fi
phase tests && NEEDS_ECOSYSTEM=1
# Flax NNX's step in the phase "profile"
[[ "${TPU_RUN_PROFILE_ARGS:-}" == *nnx* ]] && phase profile && NEEDS_ECOSYSTEM=1
GROUPS_TO_INSTALL=("$WANT_BASE")
phase bench || phase curve || phase first || phase generate || phase switches || phase profile \
  && GROUPS_TO_INSTALL+=("$WANT_BENCH")
phase tests && GROUPS_TO_INSTALL+=("$WANT_TESTS" "${WANT_TESTS_EXTRA[@]}")
[ "$NEEDS_ECOSYSTEM" = 1 ] && GROUPS_TO_INSTALL+=("$WANT_FLAX")
[ "${TPU_RUN_TORCH:-0}" = 1 ] && GROUPS_TO_INSTALL+=("transformers:transformers tokenizers:tokenizers")
if [ "$NEEDS_ECOSYSTEM" = 1 ] && ls .whl-tpu/*.whl >/dev/null 2>&1 && ! has equinox; then
  PIP_CONFIG_FILE=/dev/null timeout 60 "${PIP[@]}" --no-index --no-deps .whl-tpu/*.whl >>"$LOG" 2>&1 \
    || echo "the wheels of .whl-tpu/ did not install" >>"$LOG"
fi
# In groups, so that a package the index lacks costs only its group.
for group in "${GROUPS_TO_INSTALL[@]}"; do
  WANT=()
  for pair in $group; do
    has "${pair%%:*}" || WANT+=("${pair#*:}")
  done
  if [ -d /opt/pypi/simple ] && [ ${#WANT[@]} -gt 0 ]; then
    PIP_CONFIG_FILE=/dev/null timeout 100 "${PIP[@]}" --index-url "$INDEX" "${WANT[@]}" >>"$LOG" 2>&1 \
      || echo "index install failed or timed out: ${WANT[*]}" >>"$LOG"
  fi
done
if [ "${TPU_RUN_TORCH:-0}" = 1 ] && ! has torch && [ -d /opt/wheels ]; then
  PIP_CONFIG_FILE=/dev/null timeout 120 "${PIP[@]}" --index-url "$INDEX" --find-links /opt/wheels torch \
    >>"$LOG" 2>&1 || echo "torch did not install" >>"$LOG"
fi
echo "installed into $SITE: $(du -sh "$SITE" 2>/dev/null | cut -f1)" >>"$LOG"
for m in jax optax jaxtyping flax equinox beartype pytest transformers torch; do
  "$PY" -c "import $m; print('$m', getattr($m, '__version__', '?'), $m.__file__)" >>"$LOG" 2>&1 \
    || echo "$m: not importable" >>"$LOG"
done
say "installs done"

if phase bench; then
  # accelerator.py stops starting processes at its budget; each process has its
  # own limit (a hang loses only its figures).
  timeout -k 10 $((BENCH + 30)) "$PY" benchmarks/accelerator.py --budget "$BENCH" \
    --process-timeout 150 --out "$OUT" $QUICK ${TPU_RUN_BENCH_ARGS:-} >"$OUT/bench.log" 2>&1
  say "accelerator.py exit $?"
fi
if phase first; then
  # One process measures every contender's first step (after a tiny warm-up
  # step that takes JAX's own first-use costs) and its steady step. With
  # TPU_RUN_FIRST_CACHE=1 instead, two processes with BOXWOOD_ON_ERROR=nan (JAX
  # never caches a program holding a host callback, as boxwood's id check is):
  # the first fills a fresh persistent compilation cache, the second measures
  # the first steps from it.
  if [ "${TPU_RUN_FIRST_CACHE:-0}" = 1 ]; then
    CACHE_DIR="$PWD/.tpu-first-cache"
    rm -rf "$CACHE_DIR"
    for RUN in cold cached; do
      BOXWOOD_ON_ERROR=nan timeout -k 10 "$FIRST" "$PY" benchmarks/tpu_first_step.py --warm \
        --out "$OUT/first_step_nan_$RUN" --cache "$CACHE_DIR" $QUICK ${TPU_RUN_FIRST_ARGS:-} \
        >>"$OUT/bench.log" 2>&1
      say "tpu_first_step.py ($RUN, BOXWOOD_ON_ERROR=nan) exit $? (124: stopped at its ${FIRST} s limit)"
      [ -f "$OUT/first_step_nan_$RUN/first_step.md" ] && cat "$OUT/first_step_nan_$RUN/first_step.md" >>"$LOG"
    done
    rm -rf "$CACHE_DIR"
  elif [ -n "${TPU_RUN_FIRST_FRESH:-}" ]; then
    # each contender in its own process, TPU_RUN_FIRST_FRESH rounds, within what
    # is left of the call (each process within TPU_RUN_FIRST_S)
    LEFT=$((TOTAL - $(elapsed) - 20))
    timeout -k 10 "$LEFT" "$PY" benchmarks/tpu_first_step.py --warm --out "$OUT" $QUICK \
      --fresh "$TPU_RUN_FIRST_FRESH" --child-timeout "$FIRST" ${TPU_RUN_FIRST_ARGS:-} \
      >>"$OUT/bench.log" 2>&1
    say "tpu_first_step.py --fresh $TPU_RUN_FIRST_FRESH exit $? (124: stopped at its ${LEFT} s limit)"
    [ -f "$OUT/first_step.md" ] && cat "$OUT/first_step.md" >>"$LOG"
  else
    timeout -k 10 "$FIRST" "$PY" benchmarks/tpu_first_step.py --warm --out "$OUT" $QUICK \
      ${TPU_RUN_FIRST_ARGS:-} >>"$OUT/bench.log" 2>&1
    say "tpu_first_step.py exit $? (124: stopped at its ${FIRST} s limit)"
    [ -f "$OUT/first_step.md" ] && cat "$OUT/first_step.md" >>"$LOG"
  fi
fi
if phase generate; then
  # What bounds greedy generation: boxwood and the hand-written loop, whole
  # calls and one-token calls, and a device profile of each.
  if [ "${TPU_RUN_GENERATE_LAYOUTS:-1}" = 1 ]; then
    timeout -k 10 "$FIRST" "$PY" benchmarks/decode_layouts.py --out "$OUT" $QUICK >>"$OUT/bench.log" 2>&1
    say "decode_layouts.py exit $?"
  fi
  if [ "${TPU_RUN_GENERATE_PROFILE:-1}" = 1 ]; then
    timeout -k 10 "$FIRST" "$PY" benchmarks/tpu_generate_profile.py --out "$OUT" $QUICK \
      >>"$OUT/bench.log" 2>&1
    say "tpu_generate_profile.py exit $? (124: stopped at its ${FIRST} s limit)"
    [ -f "$OUT/generate_profile.md" ] && head -n 12 "$OUT/generate_profile.md" >>"$LOG"
  fi
fi
if phase switches; then
  # `generate` with each decoding-step switch on and off (decode_switches.py).
  timeout -k 10 "$FIRST" "$PY" benchmarks/decode_switches.py --out "$OUT" $QUICK \
    ${TPU_RUN_SWITCHES_ARGS:-} >>"$OUT/bench.log" 2>&1
  say "decode_switches.py exit $? (124: stopped at its ${FIRST} s limit)"
  [ -f "$OUT/decode_switches.md" ] && cat "$OUT/decode_switches.md" >>"$LOG"
fi
if phase profile; then
  # What separates boxwood's GPT-2 step from the others' (tpu_profile.py): e.g.
  # TPU_RUN_PROFILE_ARGS="--only whole,unrolled,nnx" beside the fastest peer.
  timeout -k 10 "$FIRST" "$PY" benchmarks/tpu_profile.py --out "$OUT" $QUICK \
    ${TPU_RUN_PROFILE_ARGS:-} >>"$OUT/bench.log" 2>&1
  say "tpu_profile.py exit $? (124: stopped at its ${FIRST} s limit)"
  [ -f "$OUT/profile.md" ] && head -n 12 "$OUT/profile.md" >>"$LOG"
fi
if phase curve; then
  timeout -k 10 "$CURVE" "$PY" benchmarks/train_curve.py --out "$OUT" $QUICK >>"$OUT/bench.log" 2>&1
  say "train_curve.py exit $? (124: stopped at its ${CURVE} s limit)"
fi

if phase tests; then
  # One process (one program holds the chip). The TPU runtime's start-up warnings
  # would be errors under the suite's filterwarnings; files whose packages are
  # missing are collection errors, not a stop. At the limit pytest gets SIGINT,
  # so it still writes its summary and the junit file.
  shopt -s nullglob
  if [[ "${TPU_RUN_TESTS:-}" == @* ]]; then
    # @FILE: the paths listed in FILE, one a line (# comments, blank lines)
    mapfile -t TESTS < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "${TPU_RUN_TESTS#@}")
  elif [ -n "${TPU_RUN_TESTS:-}" ]; then
    read -r -a TESTS <<<"$TPU_RUN_TESTS"
  elif [ -n "$QUICK" ]; then
    TESTS=(tests/house/test_architecture.py)
  else
    # pytest would run a file named before its folder in the folder's order: the
    # rest of the files are listed one by one, after the TPU-relevant ones.
    TESTS=(tests/backends/test_tpu_only.py tests/backends/test_backend_portability.py tests/tree/test_cast_floating.py tests/nn/test_nn_attention*.py
      tests/nn/test_attention*.py tests/models/test_models_*.py)
    for f in tests/*/test_*.py; do
      [[ " ${TESTS[*]} " == *" $f "* ]] || TESTS+=("$f")
    done
  fi
  # TPU_RUN_SHARD=k/n: the k-th of n shards of the files (every n-th file from
  # the k-th), so that the suite runs across n calls, each within the limits;
  # k1,k2,.../n: those shards together.
  if [ -n "${TPU_RUN_SHARD:-}" ]; then
    SHARD=()
    for i in "${!TESTS[@]}"; do
      [[ ",$K," == *",$((i % N + 1)),"* ]] && SHARD+=("${TESTS[$i]}")
    done
    TESTS=("${SHARD[@]}")
    say "shard $K/$N: ${#TESTS[@]} files"
  fi
  # failures.txt gets each test's start and each failure's traceback as they
  # happen (pytest prints them only at the end, which a run stopped at its limit
  # never reaches); a test running past 150 s dumps every thread's stack into
  # pytest.txt, and one past TPU_RUN_TEST_LIMIT (240 s) is taken as hung: pytest
  # exits (75), and starts again without the tests that already ran, while time
  # is left (benchmarks/_tpu_failures.py).
  : >"$OUT/failures.txt"
  : >"$OUT/pytest.txt"
  ATTEMPT=0
  while :; do
    LEFT=$((TOTAL - $(elapsed) - 70))
    [ "$LEFT" -lt 30 ] && LEFT=30
    DESELECT=()
    while IFS= read -r id; do DESELECT+=(--deselect "$id"); done \
      < <(sed -n 's/^started //p' "$OUT/failures.txt")
    say "tests (attempt $ATTEMPT, ${#DESELECT[@]} args deselecting tests run before): ${LEFT} s for ${TESTS[*]:0:3} ..."
    TPU_RUN_FAILURES="$OUT/failures.txt" TPU_RUN_TEST_LIMIT=${TPU_RUN_TEST_LIMIT:-240} \
    PYTHONPATH="$PWD/benchmarks:$PYTHONPATH" \
    timeout -s INT -k 60 "$LEFT" "$PY" -m pytest -o addopts="" -p no:cacheprovider -p no:xdist -v \
      -p _tpu_failures -o faulthandler_timeout=150 \
      -rA --continue-on-collection-errors --junitxml="$OUT/pytest-junit.xml" \
      -W "ignore:Transparent hugepages:UserWarning" -W "ignore:cloud_tpu_init:UserWarning" \
      "${DESELECT[@]}" "${TESTS[@]}" >>"$OUT/pytest.txt" 2>&1
    CODE=$?
    [ "$CODE" = 75 ] || break
    grep "^HUNG " "$OUT/failures.txt" | tail -n 1 | tee -a "$LOG"
    ATTEMPT=$((ATTEMPT + 1))
    [ $((TOTAL - $(elapsed) - 70)) -lt 60 ] && break
  done
  {
    echo "pytest exit $CODE (124: stopped at its ${LEFT} s limit, summary and junit kept; 1: failures; 75: a test hung, no time left to go on)"
    grep -E "^(FAILED|ERROR) " "$OUT/pytest.txt" | sort | head -n 200
    tail -n 1 "$OUT/pytest.txt"
    # every attempt's failures and hangs (the summary above is the last attempt's)
    echo "as they happened:"
    grep -E "^(FAILED|HUNG) " "$OUT/failures.txt" | head -n 200
    if [ "$CODE" = 124 ] || [ "$CODE" = 137 ] || [ "$CODE" = 75 ]; then
      echo "running when stopped: $(grep "^started " "$OUT/failures.txt" | tail -n 1)"
    fi
  } >>"$LOG"
fi
say "done"
tail -n 25 "$LOG"
