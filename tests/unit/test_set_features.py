"""An evaluation set's features and their cache file: what is saved is what loads, absent arrays stay absent, and
a cache extracted from something else (another model file, another subsample) is not returned."""
from __future__ import annotations

import numpy as np

from protoclip.evaluate.set_features import SetFeatures


def test_the_cache_file_round_trips_and_refuses_another_key(tmp_path):
    rng = np.random.default_rng(0)
    feats = SetFeatures(test_z=rng.standard_normal((5, 3), dtype=np.float32), test_y=np.array([0, 1, 1, 2, 0]),
                        caption_text_to_image=np.array([0, 0, 1]))
    path, key = tmp_path / "set.npz", {"model_sha256": "ab", "max_test": 5}
    feats.save(path, key)

    with np.load(path) as z:  # the file's format: the present arrays by name, and what they came from
        assert set(z.files) == {"meta_json", "test_z", "test_y", "caption_text_to_image"}
    back = SetFeatures.load(path, key)
    assert set(back.arrays()) == {"test_z", "test_y", "caption_text_to_image"}
    np.testing.assert_array_equal(back.test_z, feats.test_z)
    assert back.train_z is None and back.labelled and not back.captions
    assert SetFeatures.load(path, {**key, "model_sha256": "cd"}) is None
    assert SetFeatures.load(path) is not None  # no key given: read whatever it holds (the report's t-SNE)
