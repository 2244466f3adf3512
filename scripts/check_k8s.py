"""Validate deploy/k8s against Kubernetes' published schemas and print the objects.

    python scripts/check_k8s.py deploy/k8s [--k8s-version 1.33]

Every manifest the kustomization lists is checked with kubernetes-validate (the
OpenAPI schemas of a Kubernetes release, strict: unknown fields are errors), and every
file in the folder must be listed. Prints {"version": ..., "objects": [...]} as JSON
for the test that checks the manifests against the binaries
(tests/tests/deploy_manifests.rs). Exits 1 with every problem found.
"""

import argparse
import json
import pathlib
import sys

import kubernetes_validate
import yaml


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=pathlib.Path)
    ap.add_argument("--k8s-version", default=kubernetes_validate.latest_version())
    args = ap.parse_args()
    kustomization = yaml.safe_load((args.folder / "kustomization.yaml").read_text())
    listed = kustomization.get("resources", [])
    on_disk = sorted(p.name for p in args.folder.glob("*.yaml") if p.name != "kustomization.yaml")
    problems = []
    if sorted(listed) != on_disk:
        problems.append(f"kustomization.yaml lists {sorted(listed)}, the folder holds {on_disk}")
    objects = []
    for name in listed:
        path = args.folder / name
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except (OSError, yaml.YAMLError) as e:
            problems.append(f"{name}: {e}")
            continue
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, args.k8s_version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.path)
                problems.append(f"{name}: {doc.get('kind')} {where}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                problems.append(f"{name}: no schema for {doc.get('apiVersion')} {doc.get('kind')}: {e}")
            objects.append({"file": name, "object": doc})
    if problems:
        for p in problems:
            print(f"error: {p}", file=sys.stderr)
        return 1
    print(json.dumps({"version": args.k8s_version, "objects": objects}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
