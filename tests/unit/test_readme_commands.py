"""Every `snakemake` and `protoclip` command README.md and the docs/ pages show parses as its tool reads it, and names
what exists: config files that load, runs, data sets and rules the config defines, profiles, config keys. (The
paper's `snakemake --configfile config/paper.yaml ...` commands are also dry-run in tests/e2e/test_config_model.py.)
README.md stays a front door: short, without dates or commit hashes, its docs/ links to pages that exist."""
from __future__ import annotations

import re
import shlex

import pytest
import yaml

from protoclip.cli import COMMANDS as SUBCOMMANDS, command_parser, main
from protoclip.project import load_config
from testkit import REPO
README = (REPO / "README.md").read_text()
# the pages whose commands are checked: the README and every page under docs/ it points to
PAGES = {p.relative_to(REPO).as_posix(): p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
# a user's own files the pages name as such (an overlay of their paths, their tracking server, the smoke run's)
USER_FILES = {"my-tracking.yaml", "my-data.yaml", "my-site.yaml", "other.yaml", "smoke.yaml"}


def shown_commands(text: str) -> list[tuple[str, bool]]:
    """(command, complete) of every snakemake / protoclip command of one page: complete in ```bash blocks
    (continuation lines joined, comments cut), as far as written in inline `code` (placeholders such as <run> left
    out)."""
    out = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line.strip())
            for part in re.split(r"\s*(?:&&|;)\s*", line):
                if part.startswith(("snakemake ", "protoclip ")):
                    out.append((part, True))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`((?:snakemake|protoclip) [^`]*)`", prose):
        if "<" not in span and "\n" not in span:  # not a placeholder, not a quoted log line
            out.append((span.replace("...", "").strip(), False))
    return out


SHOWN = [(page, command, full) for page, text in PAGES.items() for command, full in shown_commands(text)]
# each command once, complete if any page shows it whole
COMMANDS = list({c: any(f for _, c2, f in SHOWN if c2 == c) for _, c, _ in SHOWN}.items())


def test_the_readme_shows_the_commands_this_test_reads():
    """Over README.md and docs/*.md together: the export command and the paper's commands are there to check."""
    complete = [c for _, c, full in SHOWN if full]
    assert any(c.startswith("protoclip export") for c in complete)
    assert sum(c.startswith("snakemake --configfile config/paper.yaml") for c in complete) >= 6
    assert any(c.startswith("protoclip ") for c, _ in shown_commands(README)), "README.md shows no stage command"


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
    """Each `cat > my-*.yaml <<'EOF'` block of README.md or a docs/ page, merged onto config/paper.yaml as Snakemake merges two --configfile
    files, validates (every run's data source still declared) and changes only what it sets."""
    from protoclip.config.strict import deep_merge, read_yaml

    overlays = [o for text in PAGES.values()
                for o in re.findall(r"cat > (my-[\w-]+\.yaml) <<'EOF'\n(.*?)\nEOF", text, flags=re.S)]
    assert overlays, "no page writes an overlay file"
    paper = read_yaml(REPO / "config" / "paper.yaml")
    for name, text in overlays:
        merged = deep_merge(paper, yaml.safe_load(text))
        merged.update({k: [str(REPO / "config" / e) for e in merged[k]] for k in ("experiments", "targets")})
        merged["claims"]["files"] = [str(REPO / "config" / f) for f in merged["claims"]["files"]]
        (tmp_path / name).write_text(yaml.safe_dump(merged))
        cfg = load_config(tmp_path / name)
        assert cfg.run_names() == load_config(REPO / "config" / "paper.yaml").run_names(), name


# ------------------------------------------------------------------------------------------------ a front door
TWO_COMMANDS = """```bash
make run    # creates .venv, installs the package, runs the whole DAG on the offline default
make test   # creates .venv, installs the package, runs the tests (what CI runs: .ci/run)
```"""


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return {github_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", prose, flags=re.M)}


def local_links(text: str) -> list[str]:
    """The relative targets of the page's markdown links (web addresses left out)."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", prose) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_a_front_door():
    """Under 250 lines and 20 KB, the two commands as they are, no dates or commit hashes (measured timings and
    their dates live in docs/speed.md and bench/), and it links to pages under docs/."""
    lines, size = README.count("\n"), len(README.encode())
    assert lines < 250, f"README.md has {lines} lines (a front door: under 250; move the detail to docs/)"
    assert size < 20_000, f"README.md is {size} bytes (a front door: under 20 KB; move the detail to docs/)"
    assert TWO_COMMANDS in README
    dates = re.findall(r"\b\d{4}-\d{2}-\d{2}\b", README)
    assert not dates, f"README.md names dates {dates}: dated numbers belong in docs/speed.md or bench/"
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", README)
    assert not hashes, f"README.md names commits {hashes}"
    assert sum(t.startswith("docs/") for t in local_links(README)) >= 10, "README.md links to few docs/ pages"


@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_link_points_to_a_page_that_exists(page):
    """Every relative link of README.md and docs/*.md to a markdown page or a folder names one that exists (and,
    with #anchor, a heading of it); images under results/ are `make run`'s outputs, not in a clone."""
    here = (REPO / page).parent
    for target in local_links(PAGES[page]):
        path, _, anchor = target.partition("#")
        if path.startswith("results/") or path.startswith("../results/"):
            continue
        file = (here / path).resolve() if path else REPO / page
        assert file.exists(), f"{page}: the link {target} points to no file"
        if anchor and file.suffix == ".md":
            assert anchor in anchors(file.read_text()), f"{page}: the link {target}: no heading #{anchor} there"
