"""A small offline renderer for the subset of kustomize that deploy/k8s uses, so that the overlays can be rendered
and validated in tests without the kustomize binary (`kubectl kustomize DIR` prints the same documents).

Supported, with kustomize's meaning: `resources` (files in or below the kustomization's directory, and other
kustomization directories anywhere), `namespace`, `images` (name -> newName / newTag / digest), `replicas`, and
`patches` given as inline JSON 6902 operations (add, remove, replace, test) with a `target` kind and name. Any
other key is refused, so that a manifest never relies on something this renderer would silently skip.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "namespace", "images", "replicas", "patches"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "DeviceClass"}


class KustomizeError(ValueError):
    pass


def render(directory: Path) -> list[dict]:
    """Every document the kustomization in `directory` produces, in kustomize's order of resources."""
    directory = Path(directory).resolve()
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{directory}: kustomization fields this renderer does not support: {sorted(unknown)}")
    if spec.get("kind", "Kustomization") != "Kustomization":
        raise KustomizeError(f"{directory}: kind must be Kustomization")
    docs: list[dict] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        if path.is_dir():
            docs += render(path)
        elif directory not in path.parents:  # kustomize's default load restriction
            raise KustomizeError(f"{directory}: resource file {entry} is outside the kustomization's directory")
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for patch in spec.get("patches", []):
        _patch(docs, patch, directory)
    for image in spec.get("images", []):
        for container in (c for d in docs for c in _containers(d)):
            container["image"] = _retag(container["image"], image)
    for replicas in spec.get("replicas", []):
        (doc,) = [d for d in docs if d["metadata"]["name"] == replicas["name"] and "replicas" in d.get("spec", {})]
        doc["spec"]["replicas"] = replicas["count"]
    if "namespace" in spec:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = spec["namespace"]
    return docs


def _containers(doc: dict) -> list[dict]:
    pod = doc.get("spec", {}).get("template", {}).get("spec", {})
    return pod.get("initContainers", []) + pod.get("containers", [])


def _retag(image: str, rule: dict) -> str:
    name, tag = _split(image)
    if name != rule["name"]:
        return image
    name = rule.get("newName", name)
    if "digest" in rule:
        return f"{name}@{rule['digest']}"
    return f"{name}{':' + str(rule['newTag']) if 'newTag' in rule else tag}"


def _split(image: str) -> tuple[str, str]:
    """(name, ':tag' or '@digest' or '')."""
    if "@" in image:
        name, _, digest = image.partition("@")
        return name, "@" + digest
    head, _, last = image.rpartition("/")
    if ":" in last:
        base, _, tag = last.partition(":")
        return (f"{head}/{base}" if head else base), ":" + tag
    return image, ""


def _patch(docs: list[dict], patch: dict, directory: Path) -> None:
    if set(patch) - {"target", "patch"} or "patch" not in patch:
        raise KustomizeError(f"{directory}: only inline JSON 6902 patches with a target are supported")
    target = patch["target"]
    matches = [d for d in docs if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]]
    if not matches:
        raise KustomizeError(f"{directory}: patch target {target} matches nothing")
    ops = yaml.safe_load(patch["patch"])
    if not isinstance(ops, list):
        raise KustomizeError(f"{directory}: a patch must be a list of JSON 6902 operations")
    for doc in matches:
        for op in ops:
            _apply(doc, op, directory)


def _apply(doc: dict, op: dict, directory: Path) -> None:
    """One RFC 6902 operation (add, remove, replace, test) on `doc`, in place."""
    keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
    parent = doc
    for key in keys[:-1]:
        parent = parent[int(key)] if isinstance(parent, list) else parent[key]
    last = keys[-1]
    kind = op["op"]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(index, copy.deepcopy(op["value"]))
            return
        if index >= len(parent):
            raise KustomizeError(f"{directory}: {op['path']}: no such list entry")
    elif kind != "add" and last not in parent:
        raise KustomizeError(f"{directory}: {op['path']}: no such field")
    if kind == "test":
        if parent[index if isinstance(parent, list) else last] != op["value"]:
            raise KustomizeError(f"{directory}: test failed at {op['path']}: expected {op['value']!r}")
    elif kind == "remove":
        del parent[index if isinstance(parent, list) else last]
    elif kind in ("add", "replace"):
        parent[index if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
    else:
        raise KustomizeError(f"{directory}: unsupported patch op {kind!r}")
