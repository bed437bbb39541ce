#!/usr/bin/env python
"""Write lnexp and every dependency except torch (and what only torch needs) as wheels into one
folder, for an offline install beside a machine's own torch (a GPU node with its CUDA build):

    python scripts/wheelhouse.py --out wheelhouse                     # Python 3.12, manylinux x86-64
    python scripts/wheelhouse.py --out wh --python-version 3.11 --platform manylinux_2_28_x86_64
    # on the target, with its torch already installed:
    pip install --no-index --find-links wheelhouse lnexp

Why this way: the versions are the ones installed in the running environment (the one the test
suite passed in), so the wheelhouse reproduces a tested set rather than whatever the index holds
today; the dependency walk reads the installed packages' metadata, with each requirement's
environment markers evaluated for the *target* Python and platform, and stops at the packages
left to the target (``--exclude``: torch, and torchaudio, whose build must match torch's). pip then
downloads exactly those versions for the target (``pip download --no-deps``, through pip's cache);
a package published only as a source archive (antlr4-python3-runtime) is built into a wheel here,
which must come out pure Python (``none-any``) to suit another machine. ``--have FILE`` leaves out
packages the target already has (one name per line, ``name==version`` or pip list's columns), to
keep a wheelhouse that must travel small. Rerun into the same folder, it keeps the wheels that are
still wanted and fetches only the rest. ``wheelhouse.json`` in the folder lists what is in it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from (lnexp/configs and lnexp/data/multi30k_corpus are links into these)
SOURCES = ("pyproject.toml", "README.md", "lnexp", "configs", "data/multi30k")
LEFT_TO_TARGET = ("torch", "torchaudio")  # the target's own builds; torchaudio's must match torch's


def target_env(python_version: str, platform_tag: str) -> dict[str, str]:
    """The environment markers of the target (PEP 508), for a CPython on Linux or macOS."""
    machine = next((m for m in ("x86_64", "aarch64", "arm64") if platform_tag.endswith(m)), "x86_64")
    system = "Darwin" if platform_tag.startswith("macosx") else "Linux"
    return {"python_version": python_version, "python_full_version": f"{python_version}.0",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "implementation_version": f"{python_version}.0", "os_name": "posix",
            "sys_platform": "darwin" if system == "Darwin" else "linux", "platform_system": system,
            "platform_machine": machine, "platform_release": "", "platform_version": ""}


def platforms(tag: str) -> list[str]:
    """``tag`` and the older manylinux levels a glibc that new also runs (pip does not widen a
    ``--platform`` the way it widens the running machine's own)."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", tag)
    if not m:
        return [tag]
    glibc, arch = int(m.group(1)), m.group(2)
    out = [f"manylinux_2_{k}_{arch}" for k in range(glibc, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return out + [f"{name}_{arch}" for k, name in legacy.items() if k <= glibc]


def applies(req: Requirement, env: dict[str, str], extras: set[str]) -> bool:
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))


def walk(roots: list[Requirement], env: dict[str, str], exclude: set[str],
         wants: dict[str, SpecifierSet] | None = None) -> tuple[dict[str, str], list[str]]:
    """{name: installed version} of every package the roots need (excluded ones not entered), and
    the requirements that nothing installed here satisfies (downloaded as the newest match).
    ``wants`` collects, per package, what its dependents ask of its version."""
    wants = {} if wants is None else wants
    found: dict[str, str] = {}
    missing: list[str] = []
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = list(roots)
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        wants[name] = wants.get(name, SpecifierSet()) & req.specifier
        if name in exclude or (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            missing.append(str(Requirement(f"{req.name}{req.specifier}")))
            continue
        found[name] = dist.version
        for line in dist.requires or []:
            sub = Requirement(line)
            if applies(sub, env, set(req.extras)):
                todo.append(sub)
    return found, missing


def have_names(path: Path | None) -> set[str]:
    """Package names in a list of what the target has (``name``, ``name==1.2``, ``name  1.2``)."""
    if path is None:
        return set()
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith(("Package", "---")):
            names.add(canonicalize_name(re.split(r"[=<>!~ \t;\[]", line, maxsplit=1)[0]))
    return names


def pip(*args: str, check: bool = True) -> bool:
    cmd = [sys.executable, "-m", "pip", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode and check:
        sys.exit(f"wheelhouse: `pip {' '.join(args[:3])} ...` failed:\n{proc.stderr[-2000:]}")
    return proc.returncode == 0


def top_up(out: Path, wanted: dict[str, str], python_version: str, platform_tag: str) -> set[str]:
    """Keep the wheels already in ``out`` that are a wanted version for the target (a rerun fetches
    only what changed); remove every other wheel, so the folder holds one version of each package."""
    from packaging import tags
    from packaging.utils import parse_wheel_filename

    py = tuple(int(x) for x in python_version.split("."))
    plats = platforms(platform_tag)
    ok = {*tags.cpython_tags(py, platforms=plats), *tags.compatible_tags(py, f"cp{py[0]}{py[1]}", plats)}
    kept = set()
    for whl in out.glob("*.whl"):
        name, version, _, wtags = parse_wheel_filename(whl.name)
        if name == "lnexp":  # built afresh each time
            continue
        if wanted.get(name) == str(version) and wtags & ok:
            kept.add(name)
        else:
            whl.unlink()
    return kept


def build_lnexp(out: Path) -> Path:
    """lnexp's wheel, built from a copy of its sources so that no build/ lands in the checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "lnexp-src"
        for rel in SOURCES:
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            if (REPO / rel).is_dir():
                shutil.copytree(REPO / rel, src / rel, symlinks=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            else:
                shutil.copy2(REPO / rel, src / rel)
        pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src))
    return max(out.glob("lnexp-*.whl"), key=lambda p: p.stat().st_mtime)


def wheel_requires(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the wheelhouse folder (created)")
    p.add_argument("--python-version", default="3.12", help="the target's Python (default: 3.12)")
    p.add_argument("--platform", default="manylinux_2_28_x86_64",
                   help="the target's wheel platform (default: manylinux_2_28_x86_64, i.e. glibc 2.28+; "
                   "pip accepts older manylinux wheels for it)")
    p.add_argument("--extras", default="dev", help="lnexp's extras to include (default: dev; '' = none)")
    p.add_argument("--exclude", default=",".join(LEFT_TO_TARGET),
                   help="packages left to the target, with what only they need (default: torch,torchaudio)")
    p.add_argument("--have", type=Path, default=None,
                   help="file listing packages the target already has: left out of the wheelhouse")
    p.add_argument("--jobs", type=int, default=8, help="pip downloads side by side (default: 8)")
    args = p.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        p.error(f"--python-version {args.python_version!r}: give MAJOR.MINOR, e.g. 3.12")
    if args.have is not None and not args.have.is_file():
        p.error(f"--have {args.have}: no such file")
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    env = target_env(args.python_version, args.platform)
    for old in args.out.glob("lnexp-*.whl"):
        old.unlink()
    lnexp_whl = build_lnexp(args.out)
    extras = {e.strip() for e in args.extras.split(",") if e.strip()}
    roots = [Requirement(r) for r in wheel_requires(lnexp_whl)]
    roots = [r for r in roots if applies(r, env, extras)]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    build = [Requirement(r) for r in pyproject["build-system"]["requires"]]
    exclude = {canonicalize_name(x) for x in args.exclude.split(",") if x.strip()}
    wants: dict[str, SpecifierSet] = {}
    found, missing = walk(roots + build, env, exclude, wants)
    # `pip install -e .` builds lnexp in an isolated environment from the wheelhouse: its build
    # requirements stay in, whatever the target has
    have = have_names(args.have) - {canonicalize_name(r.name) for r in build}
    wanted = {n: v for n, v in found.items() if n not in have}
    kept = top_up(args.out, wanted, args.python_version, args.platform)
    specs = [f"{n}=={v}" for n, v in sorted(wanted.items()) if n not in kept]
    specs += [m for m in missing if canonicalize_name(Requirement(m).name) not in have]
    target = ["--python-version", args.python_version, "--implementation", "cp",
              *[f"--platform={t}" for t in platforms(args.platform)]]
    # one pip per few packages, side by side: pip asks the index about one package at a time, and
    # each question waits on the network more than on the CPU
    chunks = [specs[i::args.jobs] for i in range(min(args.jobs, len(specs)))]
    def fetch(chunk: list[str]) -> list[str]:
        """Download the chunk; a version installed here that the target's Python has no release of
        (scipy 1.18 needs Python 3.12) falls back to the newest one the dependents allow."""
        if pip("download", "--no-deps", "-q", "-d", str(args.out), *target, *chunk, check=False):
            return []
        moved = []
        for spec in chunk:
            if not pip("download", "--no-deps", "-q", "-d", str(args.out), *target, spec, check=False):
                name = canonicalize_name(Requirement(spec).name)
                pip("download", "--no-deps", "-q", "-d", str(args.out), *target, f"{name}{wants[name]}")
                moved.append(name)
        return moved

    with ThreadPoolExecutor(len(chunks) or 1) as pool:
        not_pinned = sorted(n for moved in pool.map(fetch, chunks) for n in moved)
    for sdist in [*args.out.glob("*.tar.gz"), *args.out.glob("*.zip")]:
        with tempfile.TemporaryDirectory() as tmp:
            pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp, str(sdist))
            built = next(Path(tmp).glob("*.whl"))
            if not built.name.endswith("-none-any.whl"):
                sys.exit(f"wheelhouse: {sdist.name} has no wheel for {args.platform} and builds into the "
                         f"platform wheel {built.name}: build it on the target (pip wheel {sdist.name})")
            shutil.move(str(built), args.out / built.name)
        sdist.unlink()
    wheels = sorted(w.name for w in args.out.glob("*.whl"))
    manifest = {"python_version": args.python_version, "platform": args.platform,
                "left_to_target": sorted(exclude), "left_out_target_has": sorted(set(found) & have),
                "not_installed_here": missing, "newest_allowed_not_this_version": not_pinned,
                "wheels": wheels,
                "install": f"pip install --no-index --find-links {args.out} lnexp"}
    (args.out / "wheelhouse.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(w.stat().st_size for w in args.out.glob("*.whl")) / 2**20
    print(f"wheelhouse: {len(wheels)} wheels ({size:.0f} MiB) in {args.out} for Python "
          f"{args.python_version}, {args.platform}, in {time.time() - t0:.0f} s; left to the target: "
          f"{', '.join(sorted(exclude))}"
          + (f"; left out (the target has them): {len(set(found) & have)}" if have else ""))
    if not_pinned:
        print(f"wheelhouse: no release for Python {args.python_version} of the version installed here, "
              f"the newest its dependents allow instead (their own dependencies not re-read): "
              f"{', '.join(not_pinned)}")
    if missing:
        print(f"wheelhouse: not installed here, downloaded as the newest match, their own dependencies "
              f"not followed: {', '.join(missing)}")
    print(f"install on the target: pip install --no-index --find-links {args.out} lnexp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
