"""bench/engines.py: every engine bench/inference.py times gives transformers' vectors (fp32 within float error, int8
within cosine 0.99), unit-norm and in input order across length-sorted batches; an absent package is a Skipped."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import common  # noqa: E402
import engines  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread", "int8_compiled")
TEXTS = ["A short one.", "The film is a charming, funny and very long look at the lives of people in Paris and London.",
         "Bleak.", "It was quite dull, but the acting was good.", "Anna met Peter in France last year.",
         "A movie."]
CATALOG = engines.catalog(["fp32", "int8"], [])


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> engines.Setting:
    """A tiny random BertModel with minilm's tokenizer, and room for the converted models."""
    work = tmp_path_factory.mktemp("engines")
    return engines.Setting(common.tiny_model(work / "tiny"), work / "converted", 1, tuple(TEXTS))


@pytest.fixture(scope="module")
def reference(setting: engines.Setting) -> np.ndarray:
    """transformers-fp32's vectors of TEXTS (file order, the baseline)."""
    return engines.transformers_eager(setting)(TEXTS, 2)


@pytest.mark.parametrize("name", [n for n in CATALOG if n != "transformers-fp32"])
@pytest.mark.slow
def test_engine_matches_transformers(name: str, setting: engines.Setting, reference: np.ndarray) -> None:
    try:
        run = CATALOG[name](setting)
    except engines.Skipped as err:
        pytest.skip(str(err))
    got = run(TEXTS, 4)  # batches of 4 after sorting by length: rows must come back in input order
    assert got.shape == reference.shape and got.dtype == np.float32
    assert_close(torch.from_numpy(np.linalg.norm(got, axis=1)), torch.ones(len(TEXTS)), atol=1e-5, rtol=0)
    if "int8" in name or name.endswith("-auto"):  # auto may pick an int8 candidate: its bar is cosine 0.99
        cosine = (got * reference).sum(1)
        assert cosine.min() >= 0.99, f"{name}: cosine to transformers fp32 {cosine}"
    else:
        assert_close(torch.from_numpy(got), torch.from_numpy(reference), atol=1e-5, rtol=0)


def test_missing_package_is_skipped_with_its_extra() -> None:
    with pytest.raises(engines.Skipped, match=r"no_such_engine_package is not installed.*\.\[bench\]"):
        engines.require("no_such_engine_package")
