"""Bad input stops with one line naming the key or the file (exit 2 through the CLI), never a traceback or a
silent wrong result: config values that used to load and fail inside the job seconds later, YAML
files with a repeated key, experiment entries that are folders or not UTF-8, `device: cuda` without a GPU,
and model files that are empty, truncated or foreign.

The config cases are fuzzed: each bad value is planted, by a seeded generator, in one of three places (the
``train:`` defaults of the config, a run of an experiment file, an inline run), and the message must name the
key and the file it was planted in, computed here from where it was planted.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from protoclip.cli import main
from protoclip.project import load_config
from protoclip.errors import ConfigError
from protoclip.config.strict import read_yaml

# (key path under a run, bad value, the word the message must contain): each loaded without a word before
BAD_VALUES = [
    (("betas",), [0.9, 0.98, 0.999], "betas"),  # three betas for a two-beta optimizer
    (("betas",), [0.9, 1.0], "betas"),  # torch.optim.AdamW: beta in [0, 1)
    (("betas",), [-0.1, 0.999], "betas"),
    (("eps",), 0.0, "eps"),
    (("eps",), -1e-8, "eps"),
    (("num_workers",), -1, "num_workers"),
    (("seed",), -3, "seed"),  # numpy's default_rng refuses negative seeds
    (("model",), "RN5O", "model"),  # a typo: O for 0
    (("model",), "tiny_rn", "model"),
    (("embed_dim",), 0, "embed_dim"),
    (("context_length",), 1, "context_length"),
    (("image_size",), 48, "image_size"),  # tiny-rn (the default model): multiples of 32 only
    (("image_size",), 0, "image_size"),
    (("class_tokens",), 2, "class_tokens"),  # tiny-rn is a ResNet: no class tokens
    (("head_hidden",), -1, "head_hidden"),  # 0 is valid: a single Linear head (models.ProjectionHead)
    (("head_out",), 0, "head_out"),
    (("device",), "gpu", "device"),
    (("device",), "cuda0", "device"),
    (("lock_image_epoch",), -1.0, "lock_image_epoch"),
    (("loss", "subspheres"), 3, "subspheres"),  # with distance ps_negtrace below: 3 does not divide 128
]
# values planted beside a bad value so that it is the only thing wrong (the ps case needs a ps distance)
CONTEXT = {"subspheres": {"loss": {"distance": "ps_negtrace"}}}


def nested(path: tuple[str, ...], value) -> dict:
    out: dict = value
    for k in reversed(path):
        out = {k: out}
    return out


def merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def plant(tmp_path: Path, where: str, path: tuple[str, ...], value, extra: dict) -> tuple[Path, Path, str]:
    """Write a config with the bad value at ``where``; returns (config file, file the message must name,
    key as the message must spell it)."""
    overrides = merge(merge({"method": "clip"}, extra), nested(path, value))
    cfg = tmp_path / "config.yaml"
    exp = tmp_path / "exp.yaml"
    if where == "defaults":
        data, named, key = {"train": merge({"method": "clip"}, merge(extra, nested(path, value)))}, cfg, "train."
    elif where == "experiment":
        exp.write_text(yaml.safe_dump({"runs": {"r": overrides}}))
        data, named, key = {"experiments": [exp.name]}, exp, ""
    else:
        data, named, key = {"runs": {"r": overrides}}, cfg, ""
    cfg.write_text(yaml.safe_dump(data))
    return cfg, named, key + ".".join(path)


@pytest.mark.parametrize("seed", range(3))
def test_bad_values_stop_at_load_naming_key_and_file(tmp_path, capsys, seed):
    rng = random.Random(seed)
    for i, (path, value, word) in enumerate(BAD_VALUES):
        where = rng.choice(["defaults", "experiment", "inline"])
        case = tmp_path / f"case{i}"
        case.mkdir()
        cfg, named, key = plant(case, where, path, value, CONTEXT.get(word, {}))
        with pytest.raises(ConfigError) as err:
            load_config(cfg)
        msg = str(err.value)
        assert word in msg and str(named) in msg and "\n" not in msg, (seed, where, path, value, msg)
        if where == "defaults":
            assert key.split(".")[0] == "train" and "train." in msg, msg
        # through the CLI: one line on stderr, exit 2, no traceback
        assert main(["runs", "--config", str(cfg)]) == 2
        out = capsys.readouterr().err.strip()
        assert out.count("\n") == 0 and word in out and "Traceback" not in out, out


def test_good_neighbours_of_the_bad_values_load(tmp_path):
    """The checks reject only what fails: the nearest good values load."""
    good = [{"betas": [0.0, 0.5]}, {"eps": 1e-12}, {"num_workers": 0}, {"seed": 0}, {"model": "RN50"},
            {"embed_dim": 1}, {"context_length": 2}, {"image_size": 32}, {"model": "tiny-vit", "image_size": 24},
            {"model": "tiny-vit", "class_tokens": 2}, {"device": "cuda:1", "gpu": True}, {"device": "cpu"},
            {"lock_image_epoch": 0.0}, {"loss": {"distance": "ps_negtrace", "subspheres": 4}}]
    for i, over in enumerate(good):
        path = tmp_path / f"ok{i}.yaml"
        path.write_text(yaml.safe_dump({"runs": {"r": {"method": "clip", **over}}}))
        load_config(path).run("r")


@pytest.mark.parametrize("section,key,value", [
    ("evaluate", "device", "gpu"), ("teacher", "device", "GPU"), ("evaluate", "seed", -1), ("teacher", "seed", -1),
    ("toy", "seed", -1), ("evaluate.nemd", "max_pairs", 0), ("evaluate.tsne", "max_points", 0),
    ("toy", "kmeans_redo", 0), ("prepare", "openclipart_max_keywords", -1),
])
def test_bad_values_of_other_sections_name_the_key(tmp_path, section, key, value):
    path = tmp_path / "config.yaml"
    head, _, sub = section.partition(".")  # evaluate.nemd: a task's section
    path.write_text(yaml.safe_dump({head: {sub: {key: value}} if sub else {key: value}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{section}." in str(err.value) and key in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("old,new", [("knn_k", "knn.k"), ("linear_protocol_runs", "linear.protocol_runs"),
                                     ("tsne_max_points", "tsne.max_points")])
def test_a_task_setting_under_its_old_loose_key_names_its_section(tmp_path, old, new):
    """The task settings moved into their tasks' sections (evaluate.<task>): a config still giving an old key stops
    naming the key to write instead, not as an unknown key."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"evaluate": {old: {} if old.endswith("runs") else 1}}))
    with pytest.raises(ConfigError, match=f"'evaluate.{old}' is now 'evaluate.{new}'") as err:
        load_config(path)
    assert str(path) in str(err.value)


MODEL_CASES = [  # (build_model keyword arguments, checked at load as these run keys)
    dict(name="tiny-rn", image_size=48), dict(name="tiny-rn", image_size=64), dict(name="tiny-rn", image_size=32),
    dict(name="tiny-vit", image_size=60), dict(name="tiny-vit", image_size=24),
    dict(name="tiny-rn", class_tokens=2), dict(name="tiny-vit", class_tokens=2),
    dict(name="tiny-rn", embed_dim=0), dict(name="tiny-rn", context_length=1), dict(name="no-such-model"),
]


@pytest.mark.parametrize("kw", MODEL_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_model_checks_at_load_agree_with_building_the_model(kw):
    """Known answer from the real thing: the load-time check refuses exactly what build_model cannot build."""
    from protoclip.config.architectures import check_model
    from protoclip.models import build_model

    kw = dict(kw)
    name = kw.pop("name")
    try:
        build_model(name, head_hidden=8, head_out=8, **kw)
        builds = True
    except Exception:
        builds = False
    try:
        check_model(name, **kw)
        accepted = True
    except ValueError:
        accepted = False
    assert accepted == builds, (name, kw)


def test_known_models_are_open_clips():
    import open_clip

    import protoclip.models  # noqa: F401  registers the shipped configs with open_clip
    from protoclip.config.architectures import known_models

    assert set(known_models()) == set(open_clip.list_models())


def test_cuda_without_a_gpu_is_one_line(monkeypatch):
    from protoclip.jobs.devices import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ConfigError, match="no GPU is visible"):
            resolve_device(device)
    assert resolve_device("auto").type == "cpu" and resolve_device("cpu").type == "cpu"


# --------------------------------------------------------------------------- YAML files
@pytest.mark.parametrize("text,key,line", [
    ("train:\n  lr: 0.1\nruns: {}\ntrain:\n  lr: 0.2\n", "train", 4),  # two train: blocks
    ("runs:\n  a:\n    method: clip\n  b: {}\n  a:\n    method: protoclip\n", "a", 5),  # a run declared twice
    ("train:\n  loss:\n    tau_y: 0.1\n    tau_y: 0.2\n", "tau_y", 4),
    ("train: {lr: 0.1, lr: 0.2}\n", "lr", 1),  # flow style
])
def test_repeated_yaml_key_names_key_file_and_line(tmp_path, text, key, line):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        read_yaml(path)
    msg = str(err.value)
    assert f"key '{key}' is repeated" in msg and str(path) in msg and f"line {line}:" in msg, msg


def test_merge_keys_may_override(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("base: &b {lr: 0.1, eps: 1.0e-8}\ntrain:\n  <<: *b\n  lr: 0.2\n")
    assert read_yaml(path)["train"] == {"lr": 0.2, "eps": 1e-8}


def test_repeated_run_in_an_experiment_file(tmp_path):
    (tmp_path / "exp.yaml").write_text("runs:\n  r:\n    method: clip\n  r:\n    method: protoclip\n")
    (tmp_path / "config.yaml").write_text("experiments: [exp.yaml]\n")
    with pytest.raises(ConfigError, match=r"exp.yaml: line 4: key 'r' is repeated \(first at line 2\)"):
        load_config(tmp_path / "config.yaml")


@pytest.mark.parametrize("make,words", [
    (lambda p: p.mkdir(), "is a folder"),
    (lambda p: p.write_bytes("runs:\n  r: {method: clip}  # caf\u00e9\n".encode("latin-1")), "not UTF-8"),
    (lambda p: p.write_bytes(b"\x00\x01\xff\xfe"), "not UTF-8"),
    (lambda p: p.write_text("runs: [\n"), "not valid YAML"),
])
def test_unreadable_experiment_entry_names_the_file(tmp_path, capsys, make, words):
    make(tmp_path / "exp.yaml")
    (tmp_path / "config.yaml").write_text("experiments: [exp.yaml]\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "config.yaml")
    assert words in str(err.value) and str(tmp_path / "exp.yaml") in str(err.value) and "\n" not in str(err.value)
    assert main(["runs", "--config", str(tmp_path / "config.yaml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# --------------------------------------------------------------------------- model files
@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    from protoclip.models import build_model, save_model

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("model") / "model.pt"
    save_model(path, build_model("tiny-rn", head_hidden=16, head_out=8), {"model": "tiny-rn", "method": "clip"})
    return path


def broken_model_files(good: Path, folder: Path, seed: int = 0) -> list[Path]:
    """Empty, truncated at seeded cut points, foreign (text, another torch object, another format), and a
    protoclip file whose weights do not fit the architecture it names."""
    data = good.read_bytes()
    rng = random.Random(seed)
    out: dict[str, bytes | object] = {"empty": b"", "text": b"model: tiny-rn\n", "png": b"\x89PNG\r\n\x1a\n" + data[:64]}
    for cut in sorted(rng.sample(range(1, len(data)), 6)) + [len(data) - 1]:
        out[f"cut{cut}"] = data[:cut]
    payload = torch.load(good, weights_only=True)
    out["list"] = [1, 2, 3]
    out["other_format"] = {**payload, "format": "open_clip"}
    out["no_weights"] = {k: v for k, v in payload.items() if k != "state_dict"}
    out["wrong_head"] = {**payload, "head_out": 4}
    out["bad_json"] = {**payload, "config_json": "{not json"}
    out["bad_eval_json"] = {**payload, "eval_json": '{"similarity": "cos'}
    paths = []
    for name, content in out.items():
        p = folder / f"{name}.pt"
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            torch.save(content, p)
        paths.append(p)
    return paths


def test_broken_model_files_are_one_line_naming_the_file(model_file, tmp_path):
    from protoclip.models import load_model
    from protoclip.models.checkpoint import ModelFileError, read_eval_spec

    load_model(model_file)  # the intact file loads
    read_eval_spec(model_file)
    for path in broken_model_files(model_file, tmp_path):
        # the evaluation spec is read without building the model: weights and saved config are not its business
        readers = [load_model] + ([read_eval_spec] if path.stem not in ("wrong_head", "bad_json") else [])
        if path.stem == "bad_eval_json":
            readers = [read_eval_spec]
        for read in readers:
            with pytest.raises(ModelFileError) as err:
                read(path)
            msg = str(err.value)
            assert msg.startswith(f"{path}: ") and "\n" not in msg, (read.__name__, path.name, msg)


def test_evaluate_with_a_truncated_model_exits_2_with_one_line(model_file, tmp_path, capsys, monkeypatch):
    import protoclip.tracking

    monkeypatch.setattr(protoclip.tracking, "_mlflow", lambda cfg: None)  # files only: MLflow is not tested here
    results = tmp_path / "results"
    run_dir = results / "runs" / "r"
    run_dir.mkdir(parents=True)
    (run_dir / "model.pt").write_bytes(model_file.read_bytes()[:5000])
    cfg = {"paths": {"data_dir": str(tmp_path / "data"), "results_dir": str(results),
                     "mlflow_uri": f"sqlite:///{tmp_path}/mlflow.db"},
           "runs": {"r": {"method": "clip"}},
           "evaluate": {"device": "cpu", "datasets": {"digits": {"kind": "offline", "tasks": ["knn"]}}}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    from protoclip.files.layout import Layout

    layout = Layout.from_config(load_config(tmp_path / "config.yaml"))
    npz = layout.eval_set("digits")
    npz.parent.mkdir(parents=True, exist_ok=True)
    labels = np.repeat(np.arange(2), 4)
    np.savez(npz, images=np.zeros((8, 16, 16, 3), np.uint8), labels=labels,
             split=np.array(["train", "test"] * 4), classnames=np.array(["a", "b"]))
    assert main(["evaluate", "--config", str(tmp_path / "config.yaml"), "--run", "r"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "model file error" in err[-1] and str(run_dir / "model.pt") in err[-1]
    assert not any("Traceback" in line for line in err)


# --------------------------------------------------------------------------- the CLI guard
def test_cli_turns_any_user_error_into_one_line_and_keeps_bugs_as_tracebacks(tmp_path, capsys, monkeypatch):
    import protoclip.toy.stage as toy
    from protoclip.errors import UserError

    class SomeDataError(UserError):  # any stage's own user-error class
        kind = "data error"

    path = tmp_path / "config.yaml"
    path.write_text("paths: {results_dir: %s}\n" % (tmp_path / "results"))

    def bad_input(cfg, layout=None):
        raise SomeDataError("data/x.csv: line 3: an unterminated quote\n(the rest of the file would be one caption)")

    monkeypatch.setattr(toy, "run_toy_nemd", bad_input)
    assert main(["toy-nemd", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("protoclip toy-nemd: data error: data/x.csv: line 3:"), err

    def bug(cfg, layout=None):
        raise KeyError("a bug, not the user's input")

    monkeypatch.setattr(toy, "run_toy_nemd", bug)
    with pytest.raises(KeyError):
        main(["toy-nemd", "--config", str(path)])
