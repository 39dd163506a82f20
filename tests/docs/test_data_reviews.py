"""`boxwood.data.load_reviews()`: the shipped file is what its generator makes,
in GLUE's layout (labelled train and validation splits, a test split of -1),
small, and learnable from its words alone."""

import gzip
from importlib import resources

import numpy as np

from boxwood.data import load_reviews
from boxwood.data._reviews import NEGATIVE, POSITIVE, make_reviews


def test_the_shipped_file_is_the_generators_output():
    raw = resources.files("boxwood.data").joinpath("reviews.tsv.gz").read_bytes()
    assert len(raw) < 8_000  # a few KB in the package
    assert gzip.decompress(raw).decode("ascii") == make_reviews()


def test_splits_in_glue_layout():
    reviews = load_reviews()
    assert list(reviews) == ["train", "validation", "test"]
    for split, count in [("train", 480), ("validation", 120), ("test", 120)]:
        sentences, labels = reviews[split]
        assert len(sentences) == count and labels.shape == (count,)
        assert labels.dtype == np.int32
    assert set(reviews["test"][1].tolist()) == {-1}
    for split in ("train", "validation"):
        labels = reviews[split][1]
        assert set(labels.tolist()) == {0, 1}
        assert 0.35 < labels.mean() < 0.65  # both classes well represented


def test_the_sentiment_words_decide_the_label():
    """Every labelled sentence holds words of its label's list and none of the
    other's: a bag of words learns the task."""
    for split in ("train", "validation"):
        for sentence, label in zip(*load_reviews()[split]):
            words = set(sentence.split())
            ours, theirs = (POSITIVE, NEGATIVE) if label else (NEGATIVE, POSITIVE)
            assert words & set(ours) and not words & set(theirs), sentence
