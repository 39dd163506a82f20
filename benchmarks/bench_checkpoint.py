"""Figure: checkpoints. Saving and loading a model of about 500 MB with
`boxwood.save` / `boxwood.load` side by side with `safetensors.numpy.save_file` /
`load_file` on the same arrays (the limit), and the time a background save
(`blocking=False`) takes to return to the training loop.

boxwood's save also fsyncs the file and its directory (crash safety), which
`safetensors.numpy.save_file` does not; its load validates every tensor and puts the
arrays on the device, where `load_file` returns NumPy arrays. Two more columns show
where the time goes: "no fsync / into NumPy" does the same work as safetensors
(boxwood's writer without the fsync and rename; `boxwood.load` into a tree of NumPy
arrays), and "safetensors.numpy + fsync" is `save_file` followed by an fsync of the
file: the floor of any save that is on disk when it returns (the disk's write speed).

Before each timed save, `os.sync()` (untimed) writes out what earlier saves left in
the page cache, so that a save's fsync waits for its own data only, not for the
previous contender's.
"""

from __future__ import annotations

import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import boxwood
from _timing import interleave_once, median, paired_ratio, row
from boxwood._checkpoint._format import write_arrays
from boxwood._checkpoint._safetensors import check_savable, to_host

FIGURE = "checkpoint save / load"


def _model(total_mb: int) -> dict:
    """A model-like tree: layers of float32 weights and biases, `total_mb` in all."""
    n_layers = 16
    width = int((total_mb * 2**20 / 4 / n_layers) ** 0.5)
    key = jax.random.key(0)
    layers = []
    for i in range(n_layers):
        k = jax.random.fold_in(key, i)
        layers.append(
            {
                "weight": jax.random.normal(k, (width, width), jnp.float32),
                "bias": jnp.zeros((width,), jnp.float32),
            }
        )
    return {"layers": layers}


def _runners(tree: dict, directory: str) -> dict:
    from safetensors import numpy as st_numpy

    flat = boxwood.state_dict(tree)  # the same arrays, by the same names
    like = boxwood.filter_eval_shape(lambda: tree)
    # NumPy leaves of the right shapes that take no memory: `load` returns NumPy
    numpy_like = jax.tree.map(
        lambda x: np.broadcast_to(np.zeros((), x.dtype), x.shape), tree
    )
    paths = {
        name: os.path.join(directory, f"{name}.safetensors")
        for name in ("safetensors", "boxwood", "background", "numpy", "fsynced")
    }

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def timed_save(fn) -> float:
        os.sync()  # untimed: no other contender's data left to write
        return timed(fn)

    def st_run() -> dict:
        host = {k: np.asarray(v) for k, v in flat.items()}
        save = timed_save(lambda: st_numpy.save_file(host, paths["safetensors"]))
        load = timed(lambda: st_numpy.load_file(paths["safetensors"]))
        return {"save": save, "load": load}

    def st_fsync_run() -> dict:
        host = {k: np.asarray(v) for k, v in flat.items()}

        def save() -> None:
            st_numpy.save_file(host, paths["fsynced"])
            fd = os.open(paths["fsynced"], os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        return {"save": timed_save(save), "load": None}

    def bw_run() -> dict:
        save = timed_save(lambda: boxwood.save(paths["boxwood"], tree))
        load = timed(
            lambda: jax.block_until_ready(boxwood.load(paths["boxwood"], like))
        )
        return {"save": save, "load": load}

    def bw_numpy_run() -> dict:
        # the same work as safetensors.numpy: no fsync, NumPy arrays out
        arrays = to_host(check_savable(tree), copy=False)
        with open(paths["numpy"], "wb") as f:
            save = timed_save(lambda: write_arrays(f, arrays, {}))
        load = timed(lambda: boxwood.load(paths["numpy"], numpy_like))
        return {"save": save, "load": load}

    def bg_run() -> dict:
        os.sync()
        start = time.perf_counter()
        handle = boxwood.save(paths["background"], tree, blocking=False)
        returned = time.perf_counter() - start
        handle.wait()
        return {"save": returned, "load": None}

    return {
        "safetensors.numpy": st_run,
        "boxwood": bw_run,
        "boxwood, background": bg_run,
        "boxwood, no fsync / into NumPy": bw_numpy_run,
        "safetensors.numpy + fsync": st_fsync_run,
    }


def run(quick: bool) -> list[dict]:
    total_mb = 64 if quick else 512
    reps = 3 if quick else 5
    tree = _model(total_mb)
    jax.block_until_ready(tree)
    nbytes = sum(x.nbytes for x in jax.tree.leaves(tree))
    with tempfile.TemporaryDirectory(dir=os.environ.get("BOXWOOD_BENCH_DIR")) as d:
        results = interleave_once(_runners(tree, d), reps=reps)
        loaded = boxwood.load(os.path.join(d, "boxwood.safetensors"), tree)
        assert boxwood.tree_equal(loaded, tree)
    case = f"{nbytes / 2**20:,.0f} MB, {len(jax.tree.leaves(tree))} arrays"
    base = results["safetensors.numpy"]
    rows = []
    for name, res in results.items():
        for metric in ("save", "load"):
            samples = res[metric]
            if samples[0] is None:
                continue
            label = "save (time to return)" if name.endswith("background") else metric
            note = ""
            if name.endswith("background"):
                share = median(samples) / median(results["boxwood"]["save"])
                note = f"a background save returns in {share:.1%} of a blocking save's time"
            elif name == "boxwood" and metric == "save":
                floor = median(results["safetensors.numpy + fsync"]["save"])
                note = (
                    f"boxwood's crash-safe save takes {median(samples) / floor:.2f}x "
                    "the time of safetensors.numpy + fsync (the disk's write speed)"
                )
            rows.append(
                row(
                    FIGURE,
                    case,
                    name,
                    label if metric == "save" else "load",
                    median(samples) * 1e3,
                    "ms",
                    ratio=median(samples) / median(base[metric]),
                    ratio_to="safetensors.numpy",
                    paired_ratio=paired_ratio(samples, base[metric]),
                    note=note,
                    reps=reps,
                    samples=[s * 1e3 for s in samples],
                )
            )
    return rows
