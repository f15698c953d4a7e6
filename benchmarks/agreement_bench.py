"""What the statistics of human review cost: a queue's agreement report and a reliability record.

    uv run python benchmarks/agreement_bench.py [--items 1000] [--reviewers 3] [--repeat 5]

Builds seeded review matrices of ``--items`` items x ``--reviewers`` reviewers (10 % of the
reviews missing) for each level of measurement, and times ``agreement_report`` (percent
agreement, Krippendorff's alpha, Cohen's kappa when two reviewers, the reviewer x reviewer
table, every interval from 1,000 bootstrap resamples), then the reliability figures of one
evaluator over ``--items`` gold items (binary, numeric, categorical) and a Rogan-Gladen
corrected rate. Prints the best of ``--repeat`` runs in milliseconds. No database or Redis is
needed: these are the pure functions the background refresh and the pages call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import django
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "evalsite.settings")
django.setup()  # runs.review's package loads the models; nothing here queries the database

from runs.review import agreement, measures  # noqa: E402


def best_ms(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append((time.perf_counter() - started) * 1000)
    return min(times)


def matrix(rng, items: int, reviewers: int, values) -> list[list]:
    truth = rng.choice(values, size=items)
    rows = []
    for _ in range(reviewers):
        noisy = np.where(rng.random(items) < 0.8, truth, rng.choice(values, size=items))
        rows.append([None if rng.random() < 0.1 else v.item() for v in noisy])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--reviewers", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(20261124)
    names = [f"reviewer{n}" for n in range(args.reviewers)]
    cases = {
        "nominal (yes/no)": (np.array([True, False]), "nominal"),
        "ordinal (1..5)": (np.arange(1, 6), "ordinal"),
        "interval (floats)": (np.round(rng.random(args.items * 3) * 10, 3), "interval"),
    }
    print(
        f"agreement_report, {args.items} items x {args.reviewers} reviewers, best of {args.repeat}:"
    )
    for label, (values, level) in cases.items():
        data = matrix(rng, args.items, args.reviewers, values)
        ms = best_ms(
            lambda data=data, level=level: agreement.agreement_report(data, names, level),
            args.repeat,
        )
        print(f"  {label:20s} {ms:8.1f} ms")

    gold = rng.random(args.items) < 0.6
    said = np.where(rng.random(args.items) < 0.85, gold, ~gold)
    scores = rng.random(args.items)
    labels = ["good", "partly", "bad"]
    gold_labels = rng.choice(labels, size=args.items)
    said_labels = np.where(
        rng.random(args.items) < 0.7, gold_labels, rng.choice(labels, args.items)
    )
    record = measures.binary_record(said.tolist(), gold.tolist())
    print(f"reliability figures over {args.items} gold items, best of {args.repeat}:")
    runs = {
        "binary": lambda: measures.binary_record(said.tolist(), gold.tolist()),
        "numeric": lambda: measures.numeric_record(
            (scores + rng.normal(0, 0.1, args.items)).tolist(), scores.tolist()
        ),
        "categorical": lambda: measures.categorical_record(
            said_labels.tolist(), gold_labels.tolist(), labels
        ),
        "rogan-gladen": lambda: measures.rogan_gladen(
            int(said.sum()), args.items, record["confusion"]
        ),
    }
    for label, function in runs.items():
        print(f"  {label:20s} {best_ms(function, args.repeat):8.1f} ms")


if __name__ == "__main__":
    main()
