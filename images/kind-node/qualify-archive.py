#!/usr/bin/env python3
"""Rewrites a `docker save` archive for `kind build node-image`.

docker save names docker.io images in their short form ("kindest/kindnetd:v1"), while kind
compares an archive's tags with the fully qualified names it wants ("docker.io/kindest/kindnetd:v1")
and pulls whatever it does not find. kind also reads only the first entry of manifest.json, or all
of `repositories` when that member comes first. So every tag is qualified, in both files, and
`repositories` is written first.

Usage: qualify-archive.py IN.tar OUT.tar
"""
import io
import json
import sys
import tarfile


def qualify(ref: str) -> str:
    name = ref.split("@", 1)[0]
    first = name.split("/", 1)[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return ref
    if "/" not in name:
        ref = "library/" + ref
    return "docker.io/" + ref


def main(src: str, dst: str) -> None:
    with tarfile.open(src) as tin:
        members = tin.getmembers()
        manifest = json.load(tin.extractfile("manifest.json"))
        for entry in manifest:
            entry["RepoTags"] = [qualify(t) for t in entry.get("RepoTags") or []]
        repos: dict = {}
        for entry in manifest:
            for tag in entry["RepoTags"]:
                repo, _, version = tag.rpartition(":")
                # the value is the top layer's id, as docker writes it
                top = entry["Layers"][-1].split("/", 1)[0]
                repos.setdefault(repo, {})[version] = top
        extra = {
            "repositories": json.dumps(repos).encode(),
            "manifest.json": json.dumps(manifest).encode(),
        }
        with tarfile.open(dst, "w") as tout:
            for name, data in extra.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o644
                tout.addfile(info, io.BytesIO(data))
            for m in members:
                if m.name in extra:
                    continue
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
