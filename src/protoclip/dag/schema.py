"""The project config described for people and tools: a JSON Schema and a Markdown key table, both generated.

``protoclip schema [--check]`` writes (or checks) workflow/schemas/config.schema.yaml and config/README.md from the
config dataclasses: type and default from each field, its description from the comment beside or above it. The
Snakefile validates Snakemake's ``config`` against the schema (the workflow catalog's convention); value rules
(``validate()``) stay with :func:`protoclip.project.load_config`.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import sys
import textwrap
import tokenize
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml

from protoclip.config.strict import INTERNAL, REGISTERED_BY, open_sections, to_dict
from protoclip.files.atomic import write_text
from protoclip.project import ProjectConfig

SCHEMA_FILE = Path("workflow/schemas/config.schema.yaml")
README_FILE = Path("config/README.md")
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# The loader accepts numbers PyYAML reads as strings (YAML 1.1 wants ``1.0e-4``; ``5e-4`` loads as a string):
# the schema must too, or Snakemake would refuse a config every stage accepts (protoclip.config.strict._NUMBER)
NUMBER_TEXT = r"^\s*[+-]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][+-]?\d+)?\s*$"
DEFS = {
    "number": {"anyOf": [{"type": "number"}, {"type": "string", "pattern": NUMBER_TEXT}],
               "description": "a number; 1e-4 style (a string to YAML 1.1) is accepted"},
    "integer": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": NUMBER_TEXT}],
                "description": "an integer; 1e6 style (a string to YAML 1.1) is accepted"},
}


# --------------------------------------------------------------------------- descriptions from the source
def field_comments(cls: type) -> dict[str, str]:
    """{field name: its comment}: the comment lines right above the field joined with the comment on its own
    line(s), as the project writes a default's reason (``lr: float = 5e-4  # Table I, cosine decay``)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a class built at run time has no source: no descriptions
        return {}
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    body = ast.parse(source).body[0].body
    out: dict[str, str] = {}
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, line = [], node.lineno - 1
        while line >= 1 and line in comments and lines[line - 1].lstrip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        text = "; ".join(x for x in (" ".join(above), " ".join(beside)) if x)
        if text:
            out[node.target.id] = text
    return out


def class_doc(cls: type) -> str:
    """The first paragraph of the docstring written in ``cls``'s source, on one line ('' when it has none; not
    the signature @dataclass puts in ``__doc__`` then)."""
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    except (OSError, TypeError):
        return ""
    doc = ast.get_docstring(node) or ""
    return " ".join(doc.split("\n\n")[0].split())


# --------------------------------------------------------------------------- annotations -> JSON Schema
def _scalar_types(schema: dict) -> set[str]:
    return set(schema["type"]) if isinstance(schema.get("type"), list) else {schema.get("type")}


def type_schema(tp: Any) -> dict:
    """The JSON Schema of annotation ``tp``, accepting what :func:`protoclip.config.strict.build` accepts."""
    origin = get_origin(tp)
    if tp is Any:
        return {}
    if origin in (Union, types.UnionType):
        options = [type_schema(a) for a in get_args(tp) if a is not type(None)]
        nullable = type(None) in get_args(tp)
        if nullable:
            options.append({"type": "null"})
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin is Literal:
        values = list(get_args(tp))
        return {"enum": values}
    if dataclasses.is_dataclass(tp):
        return section_schema(tp)
    if origin in (list, tuple):
        args = get_args(tp) or (Any,)
        out: dict = {"type": "array", "items": type_schema(args[0])}
        if origin is tuple and Ellipsis not in args:
            out.update(minItems=len(args), maxItems=len(args))
        return out
    if origin is dict:
        _, value_tp = get_args(tp) or (Any, Any)
        return {"type": "object", "additionalProperties": type_schema(value_tp)}
    if tp is float:
        return {"$ref": "#/$defs/number"}
    if tp is int:
        return {"$ref": "#/$defs/integer"}
    simple = {bool: "boolean", str: "string", Path: "string", dict: "object", list: "array"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"no JSON Schema for the annotation {tp!r}")


def _default(f: dataclasses.Field) -> tuple[bool, Any]:
    """(has a default, its YAML value); nested sections give none (their keys carry their own)."""
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return False, None
    if dataclasses.is_dataclass(value):
        return False, None
    return True, to_dict(value)


def section_schema(cls: type) -> dict:
    """A config section (a dataclass) as an object schema: its fields and the sections registered into it, no
    other key (the loader refuses unknown keys too)."""
    hints = get_type_hints(cls)
    docs = field_comments(cls)
    holder, sections = open_sections(cls)
    props: dict[str, dict] = {}
    required = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name == holder or f.name.startswith("_") or f.metadata.get(INTERNAL):
            continue
        prop = type_schema(hints[f.name])
        if docs.get(f.name):  # a section: the field's comment, then its class docstring
            text = f"{docs[f.name]}. {prop['description']}" if prop.get("description") else docs[f.name]
            prop = {"description": text, **{k: v for k, v in prop.items() if k != "description"}}
        has_default, value = _default(f)
        if has_default:
            prop["default"] = value
        elif not dataclasses.is_dataclass(hints[f.name]):
            required.append(f.name)
        props[f.name] = prop
    # e.g. train.nclip: registered by the nclip method. The schema ships with the package: the sections of the
    # package's own methods (a method defined elsewhere, such as a test's, is not part of it)
    by = next((f.metadata.get(REGISTERED_BY) for f in dataclasses.fields(cls) if f.name == holder), None)
    for key, section in sorted((k, v) for k, v in sections.items() if v.__module__.startswith("protoclip.")):
        sub = section_schema(section)
        sub["description"] = (f"Registered by {by or 'a training method (protoclip.registry)'}. "
                              + sub.get("description", "")).strip()
        props[key] = sub
    out: dict = {"description": class_doc(cls)} if class_doc(cls) else {}
    out.update(type="object", properties=props)
    if required:
        out["required"] = required
    out["additionalProperties"] = False
    return out


def project_schema() -> dict:
    """The whole project config's schema (what ``config/config.yaml`` and every ``--configfile`` may hold)."""
    body = section_schema(ProjectConfig)
    return {"$schema": JSON_SCHEMA_DIALECT,
            "title": "protoclip-repro project config",
            "description": ("The project config (config/config.yaml, or the files given with --configfile). "
                            "Generated by `protoclip schema` from the config dataclasses; the strict loader "
                            "protoclip.project.load_config checks the values too."),
            **{k: v for k, v in body.items() if k != "description"},
            "$defs": DEFS}


def schema_text(schema: dict | None = None) -> str:
    head = ("# Generated by `protoclip schema` from the config dataclasses (src/protoclip/config.py and each\n"
            "# section's module): do not edit by hand. The Snakefile validates its config against this file.\n")
    return head + yaml.safe_dump(schema or project_schema(), sort_keys=False, width=100, allow_unicode=True)


# --------------------------------------------------------------------------- the Markdown table
def _type_text(prop: dict) -> str:
    if "$ref" in prop:
        return prop["$ref"].rsplit("/", 1)[-1]
    if "enum" in prop:
        return " | ".join(f"`{v}`" for v in prop["enum"])
    if "anyOf" in prop:
        return " or ".join(_type_text(p) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        items = prop.get("items") or {}
        size = f"{prop['minItems']} " if prop.get("minItems") == prop.get("maxItems") and "minItems" in prop else ""
        return f"list of {size}{_type_text(items) if items else 'any'}"
    if kind == "object" and "properties" not in prop:
        value = prop.get("additionalProperties")
        return f"mapping of name to {_type_text(value)}" if isinstance(value, dict) and value else "mapping"
    if kind == "object":
        return "section"
    return str(kind)


def _cell(text: str) -> str:
    """One Markdown table cell: one line, pipes escaped, reStructuredText's ``code`` as Markdown's `code`."""
    return " ".join(str(text).split()).replace("``", "`").replace("|", "\\|")


def _default_text(prop: dict) -> str:
    if "default" not in prop:
        return "*required*" if prop.get("_required") else ""
    return f"`{yaml.safe_dump(prop['default'], default_flow_style=True, width=10_000).strip().removesuffix('...').strip()}`"


def _link(text: str, dotted: str) -> str:
    """``text, see <section>`` linked to the section's heading (GitHub's anchors: punctuation dropped)."""
    anchor = "".join(c for c in dotted.lower() if c.isalnum() or c in "-_")
    return f"{text}, see [`{dotted}`](#{anchor})"


def _sections(schema: dict, prefix: str = "") -> list[tuple[str, dict]]:
    """(dotted key, object schema) of every section, depth first; a mapping of named sections (evaluate.datasets)
    appears as ``<key>.<name>``."""
    out = [(prefix, schema)]
    for key, prop in schema.get("properties", {}).items():
        if prop.get("type") == "object" and "properties" in prop:
            out += _sections(prop, f"{prefix}{key}.")
        value = prop.get("additionalProperties")
        if isinstance(value, dict) and "properties" in value:
            out += _sections(value, f"{prefix}{key}.<name>.")
        items = prop.get("items")
        if prop.get("type") == "array" and isinstance(items, dict) and "properties" in items:
            out += _sections(items, f"{prefix}{key}[].")
    return out


def readme_text(schema: dict | None = None) -> str:
    """config/README.md: every key of the schema, a table per section (key, type, default, description)."""
    schema = schema or project_schema()
    lines = ["<!-- Generated by `protoclip schema` from workflow/schemas/config.schema.yaml: do not edit by hand. -->",
             "", "# The project config", "",
             "`config/config.yaml` is the offline default every command reads (`--config`; Snakemake: "
             "`--configfile`). `config/paper.yaml` holds the papers' sizes, `config/ci.yaml` the same runs in "
             "minutes; the runs and paper targets live in the experiment files under `experiments/` "
             "(experiments/README.md). Every key is checked when the config loads: an unknown key or a wrong "
             "type stops with the key and file named, before any job runs. The JSON Schema of these keys is "
             "`workflow/schemas/config.schema.yaml`, which the Snakefile validates against.", "",
             "Types: `number` and `integer` also accept `1e-4` style (a string to YAML 1.1); `null` means "
             "\"not set\" where a key allows it.", ""]
    for dotted, section in _sections(schema):
        name = dotted.rstrip(".") or "top level"
        lines += [f"## `{name}`" if dotted else "## Top level", ""]
        if section.get("description") and dotted:
            lines += [_cell(section["description"]), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        required = set(section.get("required", []))
        for key, prop in section.get("properties", {}).items():
            nested = prop.get("type") == "object" and "properties" in prop
            kind = _link("section", f"{dotted}{key}") if nested else _type_text(prop)
            if "properties" in (prop.get("items") or {}):
                kind = _link("list of sections", f"{dotted}{key}[]")
            if "properties" in (prop.get("additionalProperties") or {}):
                kind = _link("mapping of name to section", f"{dotted}{key}.<name>")
            default = "*required*" if key in required else _default_text(prop)
            desc = prop.get("description", "") if not nested else ""
            lines.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(desc)} |")
        lines.append("")
    return "\n".join(lines)


def generated_files(root: Path | str = ".") -> dict[Path, str]:
    """{path: text} of the generated files under repository ``root``."""
    schema = project_schema()
    root = Path(root)
    return {root / SCHEMA_FILE: schema_text(schema), root / README_FILE: readme_text(schema)}


def write_generated(root: Path | str = ".", check: bool = False) -> list[Path]:
    """Write the generated files (``check``: write nothing); returns the ones whose text differed."""
    stale = []
    for path, text in generated_files(root).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
            if not check:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_text(path, text)
    return stale


__all__ = ["project_schema", "section_schema", "type_schema", "field_comments", "schema_text", "readme_text",
           "generated_files", "write_generated", "SCHEMA_FILE", "README_FILE"]


def add_arguments(p, name: str) -> None:
    """`protoclip schema [--root DIR] [--check]`: needs no config (made from the config classes)."""
    p.add_argument("--root", default=".", help="repository root (default: the working directory)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")


def main(args) -> int:
    stale = write_generated(args.root, check=args.check)
    for path in stale:
        print(f"protoclip schema: {path} {'is stale: run `protoclip schema`' if args.check else 'written'}",
              file=sys.stderr if args.check else sys.stdout)
    return 1 if args.check and stale else 0
