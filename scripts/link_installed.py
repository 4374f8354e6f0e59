"""Puts distributions installed in this interpreter's environment, with everything they require,
into another environment's site-packages as hard links, so that an environment which already has
them costs no disk. The install test uses it to give its fresh environment the PyTorch the user
already has (PyTorch with its CUDA libraries is about 6 GB unpacked); pip then installs the rest.

usage: python scripts/link_installed.py SITE_PACKAGES NAME...
"""
import importlib.metadata as metadata
import os
import shutil
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(names):
    """The installed distributions that NAMES require, NAMES included, without extras."""
    environment = default_environment()
    seen, todo = {}, [canonicalize_name(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            sys.exit(f"link_installed: {name} is required but not installed in {sys.prefix}")
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(dict(environment, extra="")):
                todo.append(canonicalize_name(req.name))
    return seen


def link_tree(dist, site):
    """Links every file DIST recorded under its site-packages; scripts outside it are left out."""
    count = 0
    for entry in dist.files or []:
        if entry.parts and entry.parts[0] == "..":
            continue
        source = os.path.realpath(dist.locate_file(entry))
        if not os.path.isfile(source):
            continue
        target = os.path.join(site, *entry.parts)
        if os.path.exists(target):
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
        count += 1
    return count


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    site, names = argv[1], argv[2:]
    if not os.path.isdir(site):
        sys.exit(f"link_installed: {site} is not a directory")
    dists = closure(names)
    files = sum(link_tree(dist, site) for dist in dists.values())
    print(f"link_installed: {len(dists)} distributions, {files} files linked into {site}")


if __name__ == "__main__":
    main(sys.argv)
