"""The main demo end to end, its option checks, and the MNIST IDX loader."""

import gzip
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from _child_flags import child_env
from boxwood.data import load_digits, load_mnist, read_idx
from boxwood.demo import main

# The demo wraps its step functions once per run; this module runs it many times in
# one process, which boxwood's own notice about re-wrapped functions would flag.
pytestmark = pytest.mark.filterwarnings("ignore:This line has wrapped")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _write_idx(path, array, code=0x08):
    header = bytes([0, 0, code, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    data = header + array.tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    """A folder of MNIST-format IDX files (`t10k-*-ubyte.gz`: 28x28 uint8 images,
    uint8 labels) made from the bundled digits, each 8x8 image scaled 3x and padded
    to 28x28 as MNIST centres its digits: real handwriting, no download."""
    images, labels = load_digits()
    big = np.kron(images, np.ones((3, 3), images.dtype))  # 24x24
    big = np.pad(big, ((0, 0), (2, 2), (2, 2)))
    pixels = np.round(big / big.max() * 255).astype(np.uint8)
    folder = tmp_path_factory.mktemp("mnist")
    _write_idx(folder / "t10k-images-idx3-ubyte.gz", pixels)
    _write_idx(folder / "t10k-labels-idx1-ubyte.gz", labels.astype(np.uint8))
    return folder


def run_demo(args, capsys):
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int32 counts and floats
        assert main([*args, "--no-progress"]) == 0
    return capsys.readouterr().out


def test_demo_trains_reports_and_reloads(tmp_path, capsys):
    pytest.importorskip("matplotlib")  # for --plot (the test extra installs it)
    out = run_demo(["--epochs", "4", "--out", str(tmp_path), "--plot"], capsys)
    assert "compiles: train_step 1, evaluate 1" in out
    losses = [float(v) for v in re.findall(r"train loss (\d+\.\d+)", out)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 3
    test_acc = float(re.search(r"^test accuracy (\d\.\d+)", out, re.M).group(1))
    assert test_acc >= 0.9
    assert (
        f"reloaded checkpoint: test accuracy {test_acc:.3f} (same as before; metadata says {test_acc:.3f}); evaluate compiled once in all"
        in out
    )
    assert f"checkpoint written to {tmp_path / 'demo.safetensors'}" in out
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"\d+ steps in \d+\.\ds: \d+(\.\d+)? steps?/s \(compilation", out)
    one_step = run_demo(
        ["--epochs", "1", "--batch-size", "1259", "--out", str(tmp_path)], capsys
    )
    assert re.search(
        r"^1 step in \d+\.\ds: \d+(\.\d+)? steps?/s \(compilation", one_step, re.M
    )
    assert ": 0 steps/s" not in one_step  # a slow single step still shows its rate
    assert "encoder.hidden    Linear" in out  # the summary table of the three modules


def test_demo_is_reproducible_for_a_seed(tmp_path, capsys):
    args = [
        "--epochs",
        "1",
        "--batch-size",
        "256",
        "--seed",
        "3",
        "--out",
        str(tmp_path),
    ]
    first = re.findall(r"(?:train loss|accuracy) \d\.\d+", run_demo(args, capsys))
    second = re.findall(r"(?:train loss|accuracy) \d\.\d+", run_demo(args, capsys))
    assert first == second and len(first) >= 3


def test_demo_shows_a_progress_bar_on_a_terminal(tmp_path, capsys, monkeypatch):
    pytest.importorskip("tqdm")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    with jax.numpy_dtype_promotion("standard"):
        main(["--epochs", "1", "--batch-size", "512", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert "step/s" in captured.err or "s/step" in captured.err  # tqdm's bar
    assert "epoch   1/1  train loss" in captured.out


def test_demo_trains_on_mnist_idx_files(tmp_path, capsys, mnist_dir):
    out = run_demo(
        ["--data", f"mnist:{mnist_dir}", "--epochs", "3", "--batch-size", "64",
         "--out", str(tmp_path)], capsys,
    )  # fmt: skip
    assert f"data: MNIST from {mnist_dir} (28x28): 1259 train / 269 validation" in out
    assert float(re.search(r"^test accuracy (\d\.\d+)", out, re.M).group(1)) > 0.7


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-size", "0"], r"argument --batch-size: must be at least 1, got 0"),
        (["--batch-size", "-3"], r"argument --batch-size: must be at least 1, got -3"),
        (["--batch-size", "5000"], r"--batch-size 5000 is larger than the training set \(1259 images\); use at most 1259"),
        (["--epochs", "0"], r"argument --epochs: must be at least 1, got 0"),
        (["--epochs", "two"], r"argument --epochs: must be a whole number, got 'two'"),
        (["--lr", "-1"], r"argument --lr: must be a positive finite number"),
        (["--lr", "nan"], r"argument --lr: must be a positive finite number"),
        (["--seed", "-1"], r"argument --seed: must be in \[0, 2\*\*32\)"),
        (["--data", "cifar"], r"argument --data: must be `digits` or `mnist:DIR`"),
        (["--data", "mnist:/no/such/dir"], r"--data mnist:/no/such/dir: /no/such/dir is not a directory"),
        (["--frobnicate"], r"unrecognized arguments: --frobnicate"),
    ],
)  # fmt: skip
def test_bad_options_give_one_line_and_exit_2(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("boxwood-demo: error: ")
    assert re.search(message, lines[0])


def test_out_must_be_a_folder(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "file")])
    assert "exists and is not a folder" in capsys.readouterr().err


BLOCK_OPTAX = "import sys; sys.modules['optax'] = None; "


def test_help_works_and_a_missing_optax_is_one_clear_line():
    # one fresh process without optax: `--help` (argparse exits 0 after printing
    # it), then a training run, which must stop at once with one clear line
    script = BLOCK_OPTAX + (
        "from boxwood.demo import main\n"
        "try:\n    main(['--help'])\n"
        "except SystemExit as done:\n    print('help exited', done.code, flush=True)\n"
        "main(['--epochs', '1'])"
    )
    failed = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, cwd=ROOT, env=child_env(),
    )  # fmt: skip
    assert "--batch-size" in failed.stdout
    assert failed.stdout.rstrip().endswith("help exited 0")
    assert failed.returncode == 2
    assert failed.stderr.strip() == (
        "boxwood-demo: error: the demo needs optax; install the train extra: "
        'pip install -e ".[train]" in a clone of boxwood (or pip install optax)'
    )


def test_plot_without_matplotlib_fails_before_training(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(SystemExit) as exit_info:
        main(["--plot", "--epochs", "1", "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing trained, nothing printed
    assert captured.err == (
        "boxwood-demo: error: --plot needs matplotlib; install the plot extra: "
        'pip install -e ".[plot]" in a clone of boxwood (or pip install matplotlib), '
        "or run without --plot\n"
    )


@pytest.mark.parametrize(
    "where", ["under a file"] + (["/proc"] if sys.platform == "linux" else [])
)
def test_an_out_folder_that_cannot_be_made_fails_before_training(
    where, tmp_path, capsys
):
    if where == "/proc":
        # root is told the folder cannot exist, anyone else that they may not
        out = "/proc/boxwood-demo-out"
        reason = r"\((No such file or directory|Permission denied)\)"
    else:
        (tmp_path / "file").write_text("")
        out, reason = str(tmp_path / "file" / "sub"), r"\(Not a directory\)"
    with pytest.raises(SystemExit) as exit_info:
        main(["--epochs", "1", "--out", out])
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert re.fullmatch(
        rf"boxwood-demo: error: --out {re.escape(out)}: cannot create this folder "
        rf"{reason}; give a folder you can write to",
        lines[0],
    )


@pytest.mark.parametrize(
    "steps, seconds, shown",
    [(3000, 2.5, "1200 steps/s"), (17, 5.0, "3.4 steps/s"), (1, 3.2, "0.31 steps/s"),
     (2, 2.0, "1 step/s"), (5, 0.0, "inf steps/s")],
)  # fmt: skip
def test_steps_per_second_keeps_the_digits_that_matter(steps, seconds, shown):
    from boxwood.demo._run import steps_per_second

    assert steps_per_second(steps, seconds) == shown


def test_compile_counts_read_as_words():
    from boxwood.demo._run import times

    assert [times(n) for n in (1, 2, 3)] == ["once", "twice", "3 times"]


def test_read_idx_reads_plain_and_gzipped_files(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", images)
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([7, 1], np.uint8))
    np.testing.assert_array_equal(
        read_idx(tmp_path / "t10k-images-idx3-ubyte.gz"), images
    )
    x, y = load_mnist(tmp_path)
    assert x.dtype == np.float32 and x.shape == (2, 3, 4) and x.max() == 23 / 255
    assert y.tolist() == [7, 1] and y.dtype == np.int32


def test_read_idx_rejects_bad_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"PK\x03\x04rest")
    with pytest.raises(ValueError, match=r"bad is not an IDX file"):
        read_idx(tmp_path / "bad")
    _write_idx(tmp_path / "short", np.zeros((4, 2), np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-3])
    with pytest.raises(ValueError, match=r"promises shape \(4, 2\).*truncated"):
        read_idx(tmp_path / "short")
    with pytest.raises(FileNotFoundError, match=r"no t10k-images-idx3-ubyte\[.gz\] in"):
        load_mnist(tmp_path)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 2, 2), np.uint8))
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(2, np.uint8))
    with pytest.raises(
        ValueError, match=r"expected images \[n, rows, cols\] and labels \[n\]"
    ):
        load_mnist(tmp_path)


def test_load_mnist_reads_a_folder_of_mnist_files(mnist_dir):
    images, labels = load_mnist(mnist_dir)
    digits, digit_labels = load_digits()
    assert images.shape == (len(digits), 28, 28) and images.dtype == np.float32
    assert labels.shape == (len(digits),) and labels.dtype == np.int32
    np.testing.assert_array_equal(labels, digit_labels)
    assert images.min() == 0.0 and images.max() == 1.0
    assert (images[:, :2] == 0).all() and (images[:, :, -2:] == 0).all()  # padding
