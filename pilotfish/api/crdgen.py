"""Generate the CRD YAML from the pydantic models: `python -m pilotfish.api.crdgen [--check]`.

pydantic emits JSON Schema (draft 2020-12) with `$ref`s, `anyOf` for Optional and titles;
the API server wants a *structural* OpenAPI v3 schema: every node typed, no references, no
unions except int-or-string, `properties` and `additionalProperties` never together. This
module converts one into the other and refuses, rather than papers over, anything it does
not know how to make structural, so that a model change cannot produce a CRD the API server
rejects or, worse, one it accepts but prunes differently from what Python expects.

The same bytes go to `crds/` (for `kubectl apply -f crds/`) and to the chart's `crds/` (Helm
installs CRDs from there and never templates them). `--check` is what CI and the unit tests
run to catch a model edited without regenerating.
"""

import argparse
import copy
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from pilotfish.api import ALL_KINDS
from pilotfish.api.base import Resource
from pilotfish.names import CATEGORY, GROUP, VERSION

OUTPUT_DIRS: Final = (Path("crds"), Path("charts") / "pilotfish" / "crds")
HEADER: Final = (
    "# Generated from pilotfish/api by `make crds` (python -m pilotfish.api.crdgen).\n"
    "# Do not edit: change the models and regenerate.\n"
)

_API_VERSION_DESCRIPTION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers "
    "should convert recognized schemas to the latest internal value, and may reject "
    "unrecognized values. More info: https://git.k8s.io/community/contributors/devel/"
    "sig-architecture/api-conventions.md#resources"
)
_KIND_DESCRIPTION = (
    "Kind is a string value representing the REST resource this object represents. Servers "
    "may infer this from the endpoint the client submits requests to. Cannot be updated. In "
    "CamelCase. More info: https://git.k8s.io/community/contributors/devel/"
    "sig-architecture/api-conventions.md#types-kinds"
)

INT_OR_STRING_ANY_OF: Final = ({"type": "integer"}, {"type": "string"})

# Every OpenAPI key the generator may emit. Anything else pydantic produces is an error:
# it is either non-structural (allOf, oneOf, not, nullable), forbidden in CRDs (uniqueItems,
# patternProperties, propertyNames, $ref) or something nobody has checked yet.
_ALLOWED_KEYS: Final = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "enum",
        "default",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "anyOf",
        "x-kubernetes-int-or-string",
        "x-kubernetes-preserve-unknown-fields",
        "x-kubernetes-embedded-resource",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-validations",
    }
)


class SchemaError(ValueError):
    """A model whose schema cannot be expressed as a structural CRD schema."""


def openapi_schema(kind: type[Resource]) -> dict[str, Any]:
    """The structural `openAPIV3Schema` of one kind."""
    raw = kind.model_json_schema(by_alias=True, mode="validation")
    defs: dict[str, Any] = raw.pop("$defs", {})
    schema = _convert(raw, defs, kind.__name__)
    props = schema["properties"]
    # Root metadata may only be `type: object` (the API server owns its schema); apiVersion
    # and kind are plain strings so that other versions can be served later.
    props["apiVersion"] = {"type": "string", "description": _API_VERSION_DESCRIPTION}
    props["kind"] = {"type": "string", "description": _KIND_DESCRIPTION}
    props["metadata"] = {"type": "object"}
    problems = structural_problems(schema)
    if problems:
        raise SchemaError(f"{kind.__name__}: " + "; ".join(problems))
    return schema


def _convert(node: dict[str, Any], defs: dict[str, Any], path: str) -> dict[str, Any]:
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").removeprefix("#/$defs/")]
        # Siblings of the reference (the field's description and default) win over the
        # referenced model's own (its class docstring).
        return _convert({**copy.deepcopy(target), **node}, defs, path)
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [b for b in node.pop("anyOf") if b != {"type": "null"}]
        if len(branches) != 1:
            raise SchemaError(
                f"{path}: a union other than `X | None` or int-or-string is not structural"
            )
        # Optional: the field is simply not required; null is never a valid value.
        return _convert({**branches[0], **node}, defs, path)

    node.pop("title", None)
    if "default" in node and node["default"] is None:
        del node["default"]
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for exclusive, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        bound = node.get(exclusive)
        if isinstance(bound, int | float) and not isinstance(bound, bool):
            # JSON Schema 2020-12 has numeric exclusive bounds; OpenAPI 3.0 has booleans.
            node[inclusive] = bound
            node[exclusive] = True
    if "description" in node:
        node["description"] = _normalize_description(node["description"])

    if node.get("x-kubernetes-int-or-string"):
        node.pop("type", None)
        if tuple(node.get("anyOf", ())) != INT_OR_STRING_ANY_OF:
            node["anyOf"] = [dict(b) for b in INT_OR_STRING_ANY_OF]
        else:
            node["anyOf"] = [dict(b) for b in node["anyOf"]]

    extra = node.pop("additionalProperties", None)
    if extra is True or extra == {}:
        # dict[str, Any] or a model with extra="allow": keep what we do not describe.
        node["x-kubernetes-preserve-unknown-fields"] = True
        node.setdefault("type", "object")
    elif isinstance(extra, dict):
        if "properties" in node:
            raise SchemaError(f"{path}: properties and additionalProperties together")
        node["additionalProperties"] = _convert(extra, defs, f"{path}[*]")
    # extra is False (extra="forbid"): the API server prunes unknown fields anyway.

    if "properties" in node:
        node["properties"] = {
            name: _convert(sub, defs, f"{path}.{name}") for name, sub in node["properties"].items()
        }
    if "required" in node:
        node["required"] = sorted(node["required"])
        if not node["required"]:
            del node["required"]
    if "items" in node:
        node["items"] = _convert(node["items"], defs, f"{path}[]")

    unknown = sorted(set(node) - _ALLOWED_KEYS)
    if unknown:
        raise SchemaError(f"{path}: cannot express {', '.join(unknown)} in a CRD schema")
    return node


def _normalize_description(text: str) -> str:
    # Docstrings wrap at the source's line length; kubectl explain wraps on its own, so keep
    # only paragraph breaks.
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def structural_problems(schema: dict[str, Any]) -> list[str]:
    """Why a CRD schema is not structural (or breaks a Pilotfish rule); empty when it is fine.

    Mirrors the API server's checks that can be made without one (apiextensions-apiserver
    `ValidateStructural` and the CRD validation around it), plus Pilotfish's own: every
    field has a description, so `kubectl explain` is useful.
    """
    problems: list[str] = []
    if schema.get("type") != "object":
        problems.append("root: type must be object")
    if "additionalProperties" in schema:
        problems.append("root: additionalProperties is not allowed at the root")
    metadata = schema.get("properties", {}).get("metadata")
    if metadata is not None and metadata != {"type": "object"}:
        problems.append("root.metadata: only `type: object` is allowed")
    _walk(schema, "root", problems, is_root=True)
    return problems


def _walk(node: dict[str, Any], path: str, problems: list[str], *, is_root: bool = False) -> None:
    for key in sorted(set(node) - _ALLOWED_KEYS):
        problems.append(f"{path}: {key} is not allowed")
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    if int_or_string:
        if "type" in node:
            problems.append(f"{path}: int-or-string must not have a type")
        if "anyOf" in node and tuple(node["anyOf"]) != INT_OR_STRING_ANY_OF:
            problems.append(f"{path}: int-or-string anyOf must be [integer, string] exactly")
        if preserve or node.get("x-kubernetes-embedded-resource"):
            problems.append(f"{path}: int-or-string excludes the other x-kubernetes-* kinds")
    elif "anyOf" in node:
        problems.append(f"{path}: anyOf is only allowed for int-or-string")
    if not node.get("type") and not int_or_string and not preserve:
        problems.append(f"{path}: no type")
    if "default" in node and node["default"] is None:
        problems.append(f"{path}: default null")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if node.get("x-kubernetes-embedded-resource") and not (
        node.get("type") == "object" and preserve
    ):
        problems.append(f"{path}: embedded resources need type object and preserve-unknown")
    _check_list_type(node, path, problems)

    for name, sub in node.get("properties", {}).items():
        sub_path = f"{path}.{name}"
        if not sub.get("description") and not (is_root and name == "metadata"):
            problems.append(f"{sub_path}: no description")
        _walk(sub, sub_path, problems)
    for name in node.get("required", []):
        if name not in node.get("properties", {}):
            problems.append(f"{path}: required field {name} is not a property")
    if isinstance(node.get("items"), dict):
        _walk(node["items"], f"{path}[]", problems)
    elif node.get("type") == "array":
        problems.append(f"{path}: array without items")
    if isinstance(node.get("additionalProperties"), dict):
        _walk(node["additionalProperties"], f"{path}[*]", problems)


def _check_list_type(node: dict[str, Any], path: str, problems: list[str]) -> None:
    list_type = node.get("x-kubernetes-list-type")
    if list_type is None:
        return
    items = node.get("items", {})
    if node.get("type") != "array":
        problems.append(f"{path}: x-kubernetes-list-type on a non-array")
    elif list_type == "set" and items.get("type") in ("object", "array"):
        problems.append(f"{path}: a set holds scalars only")
    elif list_type == "map":
        if items.get("type") != "object":
            problems.append(f"{path}: a list map holds objects only")
        for key in node.get("x-kubernetes-list-map-keys", []):
            sub = items.get("properties", {}).get(key)
            if sub is None:
                problems.append(f"{path}: list map key {key} is not a property")
            elif key not in items.get("required", []) and "default" not in sub:
                problems.append(f"{path}: list map key {key} must be required or defaulted")
        if not node.get("x-kubernetes-list-map-keys"):
            problems.append(f"{path}: a list map needs x-kubernetes-list-map-keys")


def crd_manifest(kind: type[Resource]) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind, as a dict."""
    info = kind.crd
    subresources: dict[str, Any] = {"status": {}}
    if info.scale is not None:
        scale = {
            "specReplicasPath": info.scale.spec_replicas_path,
            "statusReplicasPath": info.scale.status_replicas_path,
        }
        if info.scale.label_selector_path is not None:
            scale["labelSelectorPath"] = info.scale.label_selector_path
        subresources["scale"] = scale
    kind_name = kind.kind_name()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": info.name,
            "labels": {"app.kubernetes.io/part-of": "pilotfish"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind_name,
                "listKind": f"{kind_name}List",
                "plural": info.plural,
                "singular": kind_name.lower(),
                "shortNames": list(info.short_names),
                "categories": [CATEGORY],
            },
            "scope": info.scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema(kind)},
                    "subresources": subresources,
                    "additionalPrinterColumns": [c.to_openapi() for c in info.printer_columns],
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings, so paragraphs in descriptions stay readable."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def render(kind: type[Resource]) -> str:
    """The YAML text of one kind's CRD: sorted keys, fixed width, so output is stable."""
    body = yaml.dump(
        crd_manifest(kind),
        Dumper=_Dumper,
        sort_keys=True,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    return HEADER + body


def file_name(kind: type[Resource]) -> str:
    """The CRD's file name: its own name (plural.group) so files map one-to-one to CRDs."""
    return f"{kind.crd.name}.yaml"


def rendered(kinds: Iterable[type[Resource]] = ALL_KINDS) -> dict[str, str]:
    """File name to YAML text, for every kind."""
    return {file_name(kind): render(kind) for kind in kinds}


def _stale(directory: Path, expected: dict[str, str]) -> list[Path]:
    # Generated files of kinds that no longer exist (renamed or removed); only files carrying
    # our header are ours to judge.
    if not directory.is_dir():
        return []
    return sorted(
        p
        for p in directory.glob(f"*.{GROUP}.yaml")
        if p.name not in expected and p.read_text(encoding="utf-8").startswith(HEADER)
    )


def write(root: Path) -> list[Path]:
    """Write every CRD under root; return the files that changed (written or removed)."""
    expected = rendered()
    changed: list[Path] = []
    for directory in OUTPUT_DIRS:
        target = root / directory
        target.mkdir(parents=True, exist_ok=True)
        for name, text in expected.items():
            path = target / name
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                changed.append(path)
        for path in _stale(target, expected):
            path.unlink()
            changed.append(path)
    return changed


def check(root: Path) -> list[Path]:
    """Files under root that differ from what the models generate (missing, edited, stale)."""
    expected = rendered()
    drift: list[Path] = []
    for directory in OUTPUT_DIRS:
        target = root / directory
        for name, text in expected.items():
            path = target / name
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                drift.append(path)
        drift.extend(_stale(target, expected))
    return drift


def default_root() -> Path:
    """The checkout this module lives in (the generator writes into the source tree)."""
    return Path(__file__).resolve().parents[2]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pilotfish.api.crdgen",
        description="Write the Pilotfish CRDs, generated from pilotfish.api, to "
        + " and ".join(f"{d}/" for d in OUTPUT_DIRS)
        + ".",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 and name each file that differs from the models",
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help="repository root (default: the checkout this module is in)",
    )
    args = parser.parse_args(argv)
    root: Path = args.root if args.root is not None else default_root()
    if not (root / "charts" / "pilotfish").is_dir():
        print(f"crdgen: {root} has no charts/pilotfish; pass --root", file=sys.stderr)
        return 2
    if args.check:
        drift = check(root)
        for path in drift:
            print(f"{_relative(path, root)} is out of date: run `make crds`", file=sys.stderr)
        return 1 if drift else 0
    for path in write(root):
        print(f"updated {_relative(path, root)}")
    return 0


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
