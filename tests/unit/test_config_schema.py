"""The config's JSON Schema and config/README.md are generated from the config classes and kept in sync; the
schema accepts every shipped config and refuses what the strict loader refuses, with the key named."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Literal

import jsonschema
import pytest
import yaml

from protoclip.project import ProjectConfig, load_config
from protoclip.dag.schema import (
    README_FILE,
    SCHEMA_FILE,
    field_comments,
    generated_files,
    project_schema,
    type_schema,
)
from protoclip.dag.snakemake import schema_error
from protoclip.errors import ConfigError
from protoclip.config.strict import deep_merge
from protoclip.registry import method_sections
from testkit import REPO

SHIPPED = ["config.yaml", "paper.yaml", "ci.yaml", "paper_pcl.yaml"]


def validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(yaml.safe_load((REPO / SCHEMA_FILE).read_text()))


def test_generated_files_are_in_sync_with_the_config_classes():
    for path, text in generated_files(REPO).items():
        assert path.exists(), f"{path} is missing: run `protoclip schema`"
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run `protoclip schema`"


def test_schema_is_a_valid_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(yaml.safe_load((REPO / SCHEMA_FILE).read_text()))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_is_valid(name):
    data = yaml.safe_load((REPO / "config" / name).read_text())
    errors = [e.message for e in validator().iter_errors(data)]
    assert errors == []


def test_every_field_and_registered_section_is_a_key():
    # walk the dataclasses independently of the generator: each init field (not the loader's own) is a property
    def keys(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")
                and f.name not in ("source", "sections")}

    schema = project_schema()
    assert set(schema["properties"]) == keys(ProjectConfig)
    train = schema["properties"]["train"]["properties"]
    sections = method_sections()
    assert {"nclip", "pcl"} <= set(sections)  # the methods' own sections, found through the registry
    for key, section in sections.items():
        if section.__module__.startswith("protoclip."):
            assert set(train[key]["properties"]) == keys(section), key
        else:  # a method registered outside the package (another test's toy method): not in the shipped schema
            assert key not in train, key
    assert "source" not in schema["properties"]  # set by the loader, not a YAML key


BAD = [  # (override of config/config.yaml, words of the loader's error, the key the schema error names)
    ({"train": {"lrr": 0.1}}, "unknown key 'train.lrr'", "unknown key 'train.lrr'"),
    ({"bogus": 1}, "unknown key 'bogus'", "unknown key 'bogus'"),
    ({"train": {"nclip": {"lambda3": 1.0}}}, "unknown key 'train.nclip.lambda3'", "unknown key 'train.nclip.lambda3'"),
    ({"prepare": {"seed": "abc"}}, "'prepare.seed' must be int", "'prepare.seed' must be an integer"),
    ({"train": {"precision": "fp8"}}, "'train.precision' must be", "'train.precision'"),
    ({"evaluate": {"datasets": {"x": {"path": "/x"}}}}, "kind", "'evaluate.datasets.x'"),
    ({"prepare": {"user_data": [{"name": "a", "format": "parquet", "path": "/a"}]}}, "'prepare.user_data[0].format'",
     "'prepare.user_data.0.format'"),
    ({"train": {"betas": [0.9]}}, "'train.betas' must have 2 values", "'train.betas'"),
    ({"paths": {"mlflow_log_models": "refs"}}, "'paths.mlflow_log_models' must be bool | 'copy' | 'reference'",
     "'paths.mlflow_log_models'"),
]


@pytest.mark.parametrize("override,loader_says,schema_says", BAD)
def test_schema_refuses_what_the_loader_refuses_naming_the_key(tmp_path, override, loader_says, schema_says):
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    data = deep_merge(base, override)
    data["experiments"] = [str(REPO / "config" / e) for e in data["experiments"]]
    data["claims"]["files"] = [str(REPO / "config" / f) for f in data["claims"]["files"]]
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=None) as err:
        load_config(conf)
    assert loader_says in str(err.value)
    errors = list(validator().iter_errors(data))
    assert errors, "the schema accepted a config the loader refuses"
    try:  # snakemake.utils.validate raises the first error, wrapped
        raise RuntimeError("Error validating config file.") from errors[0]
    except RuntimeError as wrapped:
        line = schema_error(wrapped)
    assert schema_says in line and "\n" not in line, line


def test_numbers_yaml_1_1_reads_as_strings_are_accepted_as_the_loader_accepts_them():
    base = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    data = deep_merge(base, {"train": {"lr": "5e-4", "episode_size": "1e3", "lock_image_epoch": None}})
    assert [e.message for e in validator().iter_errors(data)] == []
    bad = deep_merge(base, {"train": {"lr": "fast"}})
    assert list(validator().iter_errors(bad))


@dataclass
class _Example:
    """An example section."""

    # the comment above,
    # on two lines
    a: int = 1  # and the one beside
    b: list[str] = field(
        default_factory=lambda: ["x"])  # beside the field's last line
    c: Literal["p", "q"] | None = None
    d: tuple[float, float] = (0.0, 1.0)


def test_descriptions_come_from_the_comments_above_and_beside_each_field():
    assert field_comments(_Example) == {"a": "the comment above, on two lines; and the one beside",
                                        "b": "beside the field's last line"}


def test_annotations_map_to_the_json_schema_the_loader_accepts():
    assert type_schema(bool) == {"type": "boolean"}
    assert type_schema(float) == {"$ref": "#/$defs/number"}
    assert type_schema(int | None) == {"anyOf": [{"$ref": "#/$defs/integer"}, {"type": "null"}]}
    assert type_schema(Literal["p", "q"]) == {"enum": ["p", "q"]}
    assert type_schema(tuple[float, float]) == {"type": "array", "items": {"$ref": "#/$defs/number"},
                                                "minItems": 2, "maxItems": 2}
    assert type_schema(dict[str, bool]) == {"type": "object", "additionalProperties": {"type": "boolean"}}
    section = type_schema(_Example)
    assert section["description"] == "An example section." and section["additionalProperties"] is False
    assert section["properties"]["b"]["default"] == ["x"] and "required" not in section


def test_readme_lists_every_key_of_every_section_with_its_default():
    text = (REPO / README_FILE).read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert all(len(re.findall(r"(?<!\\)\|", line)) == 5 for line in rows)  # 4 cells each, pipes in cells escaped
    for heading in ("## `train`", "## `train.loss`", "## `train.nclip`", "## `evaluate.datasets.<name>`",
                    "## `prepare.user_data[]`"):
        assert heading in text
    train = text.split("## `train`\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in train.splitlines() if line.startswith("| `")]
    assert len(rows) == len(project_schema()["properties"]["train"]["properties"])
    assert "| `lr` | number | `0.0005` | Table I, cosine decay |" in train


def test_cli_writes_the_files_and_check_names_a_stale_one(tmp_path, capsys):
    from protoclip.cli import main

    assert main(["schema", "--root", str(tmp_path), "--check"]) == 1  # nothing there yet: both stale
    assert str(tmp_path / SCHEMA_FILE) in capsys.readouterr().err
    assert main(["schema", "--root", str(tmp_path)]) == 0
    assert (tmp_path / SCHEMA_FILE).read_text() == (REPO / SCHEMA_FILE).read_text()
    assert main(["schema", "--root", str(tmp_path), "--check"]) == 0
    (tmp_path / README_FILE).write_text("edited by hand\n")
    assert main(["schema", "--root", str(tmp_path), "--check"]) == 1
    assert f"{tmp_path / README_FILE} is stale" in capsys.readouterr().err
