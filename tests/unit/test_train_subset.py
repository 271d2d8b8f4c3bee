"""train.subset_fraction (ProtoCLIP Fig. 7): a seeded, nested subsample of the training pairs."""
import pandas as pd
import pytest

from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.data.loading.training_set import subsample_pairs


def test_subsets_are_seeded_nested_and_in_manifest_order():
    df = pd.DataFrame({"id": [f"p{i}" for i in range(100)]})
    small, large = subsample_pairs(df, 0.1, seed=3), subsample_pairs(df, 0.5, seed=3)
    assert len(small) == 10 and len(large) == 50
    assert set(small.id) <= set(large.id)  # growing subsets of one seed contain the smaller ones
    assert list(small.id) == sorted(small.id, key=lambda s: int(s[1:]))  # manifest order kept
    assert subsample_pairs(df, 0.1, seed=3).equals(small) and not subsample_pairs(df, 0.1, seed=4).equals(small)
    assert subsample_pairs(df, 1.0, seed=3) is df
    assert len(subsample_pairs(df, 0.001, seed=0)) == 1  # never empty


def test_subset_fraction_is_validated(tmp_path):
    import yaml

    conf = tmp_path / "c.yaml"
    conf.write_text(yaml.safe_dump({"runs": {"r": {"method": "clip", "subset_fraction": 1.5}}}))
    with pytest.raises(ConfigError, match="subset_fraction must be in"):
        load_config(conf)
