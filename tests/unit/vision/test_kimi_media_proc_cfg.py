"""A Moonshot release's `media_proc_cfg` (Kimi K3's preprocessor_config.json) read as the
Kimi K2.5 processor's keys: the same prepared pixels as the flat config it spells."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from warp_providers import vision
from warp_providers.errors import ModelFormatError

MEDIA = {"media_proc_cfg": {"patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 64,
                            "patch_limit_on_one_side": 16, "image_mean": [0.5, 0.5, 0.5],
                            "image_std": [0.5, 0.5, 0.5], "fixed_output_tokens": None}}
FLAT = {"patch_size": 14, "merge_size": 2, "max_patches": 64,
        "size": {"max_height": 16, "max_width": 16},
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}


def _png(h: int, w: int, seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def test_media_proc_cfg_maps_to_the_flat_keys() -> None:
    got = vision.kimi_preprocessor(MEDIA)
    for k, v in FLAT.items():
        assert got[k] == v, k
    assert vision.kimi_preprocessor(FLAT) == FLAT  # flat configs pass unchanged


@pytest.mark.parametrize("size", [(112, 112), (84, 196), (300, 200), (20, 500)])
def test_k3_config_prepares_as_the_flat_one(size) -> None:
    info = {"arch": "kimi_k3", "patch_size": 14, "merge_size": 2, "temporal_patch_size": 1}
    k3 = vision.for_vision({**info, "preprocessor": MEDIA})
    flat = vision.for_vision({**info, "arch": "kimi_k25", "preprocessor": FLAT})
    data = _png(*size, seed=size[0])
    a, b = k3.prepare(data), flat.prepare(data)
    assert a.grid_thw == b.grid_thw and np.array_equal(a.pixel_values, b.pixel_values)
    assert a.n_tokens == k3.tokens_for(size[1], size[0])
    assert a.grid_thw[1] * a.grid_thw[2] <= 64 + 4 * 16 + 4  # the budget of 64 holds


def test_other_budget_changes_the_grid_and_bad_merge_refused() -> None:
    small = {"media_proc_cfg": {**MEDIA["media_proc_cfg"], "in_patch_limit": 16}}
    info = {"arch": "kimi_k3", "patch_size": 14, "merge_size": 2}
    data = _png(300, 200, 1)
    assert (vision.for_vision({**info, "preprocessor": small}).prepare(data).n_tokens
            < vision.for_vision({**info, "preprocessor": MEDIA}).prepare(data).n_tokens)
    bad = {"media_proc_cfg": {**MEDIA["media_proc_cfg"], "merge_kernel_size": [2, 3]}}
    with pytest.raises(ModelFormatError, match="merge_kernel_size"):
        vision.for_vision({**info, "preprocessor": bad})
