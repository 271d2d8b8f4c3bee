"""Every `snakemake` and `protoclip` command the README shows parses as its tool reads it, and names what exists:
config files that load, runs, data sets and rules the config defines, profiles, config keys. (The paper's
`snakemake --configfile config/paper.yaml ...` commands are also dry-run in tests/e2e/test_config_model.py.)"""
from __future__ import annotations

import re
import shlex

import pytest
import yaml

from protoclip.cli import COMMANDS as SUBCOMMANDS, command_parser, main
from protoclip.config import load_config
from testkit import REPO
README = (REPO / "README.md").read_text()
# a user's own files the README names as such (an overlay of their paths, their tracking server, the smoke run's)
USER_FILES = {"my-tracking.yaml", "my-data.yaml", "my-site.yaml", "other.yaml", "smoke.yaml"}


def shown_commands() -> list[tuple[str, bool]]:
    """(command, complete) of every snakemake / protoclip command: complete in ```bash blocks (continuation
    lines joined, comments cut), as far as written in inline `code` (placeholders such as <run> left out)."""
    out = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            for part in re.split(r"\s*(?:&&|;)\s*", line):
                if part.startswith(("snakemake ", "protoclip ")):
                    out.append((part, True))
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    for span in re.findall(r"`((?:snakemake|protoclip) [^`]*)`", prose):
        if "<" not in span and "\n" not in span:  # not a placeholder, not a quoted log line
            out.append((span.replace("...", "").strip(), False))
    return out


COMMANDS = shown_commands()


def test_the_readme_shows_the_commands_this_test_reads():
    complete = [c for c, full in COMMANDS if full]
    assert any(c.startswith("protoclip export") for c in complete)
    assert sum(c.startswith("snakemake --configfile config/paper.yaml") for c in complete) >= 6


@pytest.mark.parametrize("command", [c for c, _ in COMMANDS if c.startswith("protoclip ")])
def test_protoclip_command(command, capsys):
    argv = shlex.split(command)[1:]
    full = dict(COMMANDS)[command]
    if argv == ["--version"]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 0 and capsys.readouterr().out.startswith("protoclip ")
        return
    assert argv[0] in SUBCOMMANDS, f"{command}: no subcommand {argv[0]}"
    if not full:  # a command named in the prose: its subcommand, and the config it names loads
        if "--config" in argv:
            load_config(REPO / argv[argv.index("--config") + 1])
        return
    parser, _ = command_parser(argv[0])
    try:
        args = parser.parse_args(argv[1:])
    except SystemExit as err:
        raise AssertionError(f"{command}: does not parse") from err
    if getattr(args, "config", None) and SUBCOMMANDS[argv[0]].config:
        cfg = load_config(REPO / args.config)
        if getattr(args, "run", None):
            assert args.run in cfg.run_names(), f"{command}: {args.config} has no run {args.run}"
        for d in getattr(args, "dataset", None) or []:
            assert d in cfg.evaluate.datasets, f"{command}: no data set {d}"


@pytest.mark.parametrize("command", [c for c, _ in COMMANDS if c.startswith("snakemake ")])
def test_snakemake_command(command):
    from snakemake.cli import get_argument_parser

    argv = shlex.split(command)[1:]
    assert sum(a in ("--configfile", "--configfiles") for a in argv) <= 1, \
        f"{command}: a second --configfile replaces the first's files (list them after one flag)"
    args = get_argument_parser().parse_args(argv)
    for f in args.configfile or []:
        assert (REPO / f).is_file() or str(f) in USER_FILES, f"{command}: no config file {f}"
    for f in [f for f in args.configfile or [] if (REPO / f).is_file()]:
        load_config(REPO / f)
    for p in args.profile or []:
        assert (REPO / p / "config.yaml").is_file(), f"{command}: no profile {p}"
    rules = set(re.findall(r"^rule (\w+):", "".join(p.read_text() for p in (REPO / "workflow/rules").glob("*.smk")),
                           flags=re.M)) | {"all"}
    for target in args.targets or []:
        assert target in rules or target.startswith("results/"), f"{command}: no rule {target}"


def test_the_overlays_the_readme_writes_load_on_top_of_the_paper_config(tmp_path):
    """Each `cat > my-*.yaml <<'EOF'` block, merged onto config/paper.yaml as Snakemake merges two --configfile
    files, validates (every run's data source still declared) and changes only what it sets."""
    from protoclip.schema import deep_merge, read_yaml

    overlays = re.findall(r"cat > (my-[\w-]+\.yaml) <<'EOF'\n(.*?)\nEOF", README, flags=re.S)
    assert overlays, "the README writes no overlay file"
    paper = read_yaml(REPO / "config" / "paper.yaml")
    for name, text in overlays:
        merged = deep_merge(paper, yaml.safe_load(text))
        merged.update({k: [str(REPO / "config" / e) for e in merged[k]] for k in ("experiments", "targets")})
        merged["claims"]["files"] = [str(REPO / "config" / f) for f in merged["claims"]["files"]]
        (tmp_path / name).write_text(yaml.safe_dump(merged))
        cfg = load_config(tmp_path / name)
        assert cfg.run_names() == load_config(REPO / "config" / "paper.yaml").run_names(), name
