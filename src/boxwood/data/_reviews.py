"""The sentences of `load_reviews()`, made deterministically from templates:
`python -m boxwood.data._reviews` writes `reviews.tsv.gz` beside this file."""

from __future__ import annotations

import gzip
import pathlib
import random

# The words that carry the label; every other word is shared by both labels.
POSITIVE = (
    "good", "great", "fine", "lovely", "superb", "excellent", "pleasant",
    "wonderful", "brilliant", "charming", "moving", "clever",
)  # fmt: skip
NEGATIVE = (
    "bad", "poor", "dull", "awful", "boring", "terrible", "weak", "dreadful",
    "clumsy", "tedious", "bland", "messy",
)  # fmt: skip
NOUNS = (
    "film", "story", "cast", "ending", "script", "music", "plot", "acting",
    "pacing", "dialogue", "camera work", "sequel", "lead", "soundtrack",
)  # fmt: skip
ADVERBS = ("really", "quite", "very", "rather", "truly", "simply")
TEMPLATES = (
    "the {noun} was {adj}",
    "{a} {adj} {noun}",
    "what {a} {adj} {noun}",
    "the {noun} is {adv} {adj}",
    "{adj} {noun} and {adj2} {noun2}",
    "i found the {noun} {adv} {adj}",
    "overall the {noun} felt {adj}",
    "the {noun} and the {noun2} were both {adj}",
    "{adv} {adj} , with {adj2} {noun}",
)
# GLUE's layout: labelled train and validation splits, and a test split whose
# labels are withheld (-1)
SPLITS = (("train", 480), ("validation", 120), ("test", 120))


def make_reviews() -> str:
    """The dataset as tab-separated text: a `split label sentence` header, then
    one line per sentence (label 1: positive, 0: negative, -1: withheld)."""
    rng = random.Random(0)
    lines = ["split\tlabel\tsentence"]
    for split, count in SPLITS:
        for _ in range(count):
            label = rng.randrange(2)
            adjectives = POSITIVE if label else NEGATIVE
            adj, adj2 = rng.sample(adjectives, 2)
            noun, noun2 = rng.sample(NOUNS, 2)
            sentence = rng.choice(TEMPLATES).format(
                a="an" if adj[0] in "aeiou" else "a", adj=adj, adj2=adj2,
                noun=noun, noun2=noun2, adv=rng.choice(ADVERBS),
            )  # fmt: skip
            lines.append(f"{split}\t{label if split != 'test' else -1}\t{sentence}")
    return "\n".join(lines) + "\n"


def write_reviews(path: pathlib.Path) -> None:
    """Write `make_reviews()` gzipped to `path`, byte for byte the same each
    time (no file name or time in the gzip header)."""
    path.write_bytes(gzip.compress(make_reviews().encode("ascii"), mtime=0))


if __name__ == "__main__":
    write_reviews(pathlib.Path(__file__).with_name("reviews.tsv.gz"))
