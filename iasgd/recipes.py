"""Named recipes: the settings that train a model well, under one name
(`--recipe`).

A recipe fills in the options it names where the command line does not:
`python -m iasgd.run --recipe cifar10 --algo interval --threads 2` trains
with the recipe's model, augmentation, optimiser and schedule, and
`--epochs 20` beside it still wins. The algorithm and the thread count are
never a recipe's: the paper's comparison runs one recipe under each of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Recipe:
    """help: what it trains and what it reaches; settings: option values by
    field name (the names of iasgd.config.TrainConfig and iasgd.run.RunOptions)."""

    help: str
    settings: Mapping[str, Any]


RECIPES: dict[str, Recipe] = {
    # measured in bench/results/recipe-cifar10.md
    "cifar10": Recipe(
        "CIFAR-10 to about 80 %: vgg-bn, random crops and flips, Nesterov SGD with weight "
        "decay, a short warm-up and a cosine decay over 30 epochs of batches of 16",
        {"dataset": "cifar10", "model": "vgg-bn", "augment": "crop,flip", "crop_padding": 4,
         "batch_size": 16, "lr": 0.0125, "momentum": 0.9, "nesterov": True,
         "weight_decay": 5e-4, "lr_warmup": 0.02, "lr_decay": "cosine", "epochs": 30}),
}


def with_recipe(values: Mapping[str, Any], name: str, given: set[str]) -> dict[str, Any]:
    """The option values with recipe `name`'s settings where `given` (the
    options the command line names) has none."""
    settings = RECIPES[name].settings
    return {**values, **{k: v for k, v in settings.items() if k not in given}}
