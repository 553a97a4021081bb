"""Two builds of the runtime image's Python layer from one checkout, compared file by file.

What runtime/Dockerfile's two stages do with Python, run twice here with the same commands, flags
and environment (no container engine, no base image: see docs/supply-chain.md for what only a
registry build shows):

  wheel stage    a venv with every wheel of the lock (pip install --require-hashes --no-deps -r),
                 then `pip wheel --no-deps --no-build-isolation --no-cache-dir` of the runtime and
                 the host side, copied as the Dockerfile copies them (with the native kernels
                 when --kernels is given: `python -m frontier_runtime.ops.build_kernels`)
  runtime stage  `python3 -m venv`, the lock with --require-hashes --no-deps, our two wheels with
                 --no-deps, `pip check`

Both builds read one commit (--commit, default HEAD: `git archive` of runtime/, hostside/ and
requirements/), never the working tree, which may change between them. Each build runs at the same
paths (the image's are fixed too), in a fresh folder, with
PIP_NO_INDEX=1 and PIP_FIND_LINKS=<wheelhouse> as the CPU variant's build has them, and the
Dockerfile's ENV (PYTHONDONTWRITEBYTECODE=1, PIP_NO_CACHE_DIR=1) and SOURCE_DATE_EPOCH, unless
--no-epoch leaves it out to show what it removes. Then every file of both results is compared:
content (sha256), mode, symlink target, and mtime apart (a layer's tar records mtimes; podman's
`build --timestamp` sets them all to one value, which fab image.build passes).

    .venv/bin/python scripts/reproducible_image.py [--commit REV] [--lock image-cpu.txt]
        [--wheelhouse DIR] [--kernels] [--no-epoch] [--json OUT]

With --image it builds the CPU variant itself twice with podman instead, as fab image.build and
tests/e2e/test_runtime_image.py do (the Debian base of scripts/build-debian-base.sh, no network,
--no-cache, --timestamp SOURCE_DATE_EPOCH), and compares the two images layer by layer, and inside
each layer that differs, member by member.

Prints one line per artifact and the differences, grouped by kind; exits 1 when contents differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ("runtime", "hostside", "requirements")
# runtime/Dockerfile's SOURCE_DATE_EPOCH and the files it copies of each context.
SOURCE_DATE_EPOCH = "315532800"
RUNTIME_COPIED = ("pyproject.toml", "frontier_runtime")
HOSTSIDE_COPIED = ("pyproject.toml", "frontier_hostside", "frontier_settings")
IGNORED = ("__pycache__", "*.pyc", "*.egg-info", "build", "dist", "kernels")
WHEELS = ("frontier_runtime-0.1.0-py3-none-any.whl", "frontier_hostside-0.1.0-py3-none-any.whl")
# The runtime stage's ENV that bears on what pip writes.
IMAGE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@dataclass(frozen=True)
class Entry:
    kind: str  # file, dir, link
    sha256: str
    mode: int
    mtime: int
    target: str = ""


@dataclass
class Comparison:
    name: str
    files: int
    same: int
    content: list[str] = field(default_factory=list)
    mode: list[str] = field(default_factory=list)
    only_in_one: list[str] = field(default_factory=list)
    mtime_only: int = 0

    def line(self) -> str:
        return (
            f"{self.name}: {self.files} files, {self.same} identical, {len(self.content)} differ in content, "
            f"{len(self.mode)} in mode, {len(self.only_in_one)} in one build only, "
            f"{self.mtime_only} in mtime only"
        )


def run(command: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:6])} … failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def copy_context(source: Path, names: tuple[str, ...], dest: Path) -> None:
    dest.mkdir(parents=True)
    for name in names:
        path = source / name
        if path.is_dir():
            shutil.copytree(path, dest / name, ignore=shutil.ignore_patterns(*IGNORED))
        else:
            shutil.copy2(path, dest / name)


def snapshot(commit: str, folder: Path) -> Path:
    """runtime/, hostside/ and requirements/ as ``commit`` holds them, in ``folder``."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, *SNAPSHOT], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def build(
    tree: Path, work: Path, lock: Path, wheelhouse: Path, python: str, kernels: bool, epoch: bool
) -> None:
    """One build at fixed paths under ``work`` (emptied first): wheel stage, then runtime stage."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(work / "home"),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheelhouse),
        # This machine's pip configuration (indexes, constraints) is not the image's.
        "PIP_CONFIG_FILE": os.devnull,
        **IMAGE_ENV,
        **({"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH} if epoch else {}),
    }
    build_venv, src, hostside, dist = work / "build", work / "src", work / "hostside", work / "dist"
    run([python, "-m", "venv", str(build_venv)], env)
    run(
        [
            str(build_venv / "bin/pip"),
            "install",
            "--no-cache-dir",
            "--require-hashes",
            "--no-deps",
            "-r",
            str(lock),
        ],
        env,
    )
    copy_context(tree / "runtime", RUNTIME_COPIED, src)
    copy_context(tree / "hostside", HOSTSIDE_COPIED, hostside)
    if kernels:
        run(
            [
                str(build_venv / "bin/python"),
                "-m",
                "frontier_runtime.ops.build_kernels",
                "--out",
                str(work / "kernels"),
            ],
            env,
            cwd=src,
        )
        shutil.copytree(work / "kernels", src / "frontier_runtime/ops/kernels", symlinks=True)
    run(
        [str(build_venv / "bin/pip"), "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
         "--wheel-dir", str(dist), ".", str(hostside)],
        env,
        cwd=src,
    )  # fmt: skip
    venv = work / "venv"
    run([python, "-m", "venv", str(venv)], env)
    run([str(venv / "bin/pip"), "install", "--require-hashes", "--no-deps", "-r", str(lock)], env)
    run([str(venv / "bin/pip"), "install", "--no-deps", *(str(dist / w) for w in WHEELS)], env)
    run([str(venv / "bin/pip"), "check"], env)


def listing(root: Path) -> dict[str, Entry]:
    found = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(info.st_mode):
            found[rel] = Entry("link", "", stat.S_IMODE(info.st_mode), int(info.st_mtime), os.readlink(path))
        elif stat.S_ISDIR(info.st_mode):
            found[rel] = Entry("dir", "", stat.S_IMODE(info.st_mode), int(info.st_mtime))
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[rel] = Entry("file", digest, stat.S_IMODE(info.st_mode), int(info.st_mtime))
    return found


def compare(name: str, first: dict[str, Entry], second: dict[str, Entry]) -> Comparison:
    result = Comparison(name, files=len(set(first) | set(second)), same=0)
    for rel in sorted(set(first) | set(second)):
        a, b = first.get(rel), second.get(rel)
        if a is None or b is None:
            result.only_in_one.append(rel)
        elif (a.kind, a.sha256, a.target) != (b.kind, b.sha256, b.target):
            result.content.append(rel)
        elif a.mode != b.mode:
            result.mode.append(rel)
        else:
            result.same += 1
            result.mtime_only += a.mtime != b.mtime and a.kind != "dir"
    return result


def kind_of(rel: str) -> str:
    """What a differing file is, for the grouped report."""
    if rel.endswith(".pyc"):
        return ".pyc (bytecode)"
    if rel.endswith((".dist-info/RECORD", ".dist-info/direct_url.json")):
        return "install records"
    if rel.endswith(".whl"):
        return "wheels"
    if rel.endswith(".so"):
        return "native libraries"
    return "other"


def wheelhouse_for(lock: Path, folder: Path | None) -> Path:
    """The lock's wheels, each checked against its hashes (the host's pip configuration finds them)."""
    if folder is not None:
        return folder
    folder = Path(tempfile.mkdtemp(prefix="frontier-wheelhouse-"))
    run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--require-hashes", "--no-deps",
         "--dest", str(folder), "-r", str(lock)],
        dict(os.environ),
    )  # fmt: skip
    return folder


# --- the image, built twice -------------------------------------------------------------------------

PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager=cgroupfs")  # this sandbox's (MACHINE-NOTES)


def podman(*args: str, timeout: float = 3600) -> str:
    done = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(
            f"podman {' '.join(args[:2])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return done.stdout


def build_image(tree: Path, lock: Path, wheelhouse: Path, tag: str) -> str:
    base_out = subprocess.run(
        ["bash", str(ROOT / "scripts/build-debian-base.sh")],
        env={**os.environ, "DOCKERFILE": str(tree / "runtime/Dockerfile")},
        capture_output=True,
        text=True,
    )
    if base_out.returncode != 0:
        raise SystemExit(f"build-debian-base.sh failed:\n{base_out.stderr[-3000:]}")
    repository, base = base_out.stdout.strip().splitlines()[-2:]
    podman(
        "build", "--format", "docker", "--no-cache", "--timestamp", SOURCE_DATE_EPOCH, "--network", "none",
        "--build-context", f"hostside={tree / 'hostside'}", "--build-context", f"requirements={lock.parent}",
        "--build-arg", f"CUDA_IMAGE={base}", "--build-arg", f"IMAGE_LOCK={lock.name}",
        "--build-arg", "PIP_NO_INDEX=1", "--build-arg", "PIP_FIND_LINKS=/wheelhouse",
        "--build-arg", "EFA_INSTALLER_VERSION=",
        "--volume", f"{wheelhouse}:/wheelhouse:ro", "--volume", f"{repository}:/debs:ro",
        "--tag", tag, str(tree / "runtime"),
    )  # fmt: skip
    return podman("image", "inspect", "--format", "{{.Id}}", tag).strip()


def saved(image: str, folder: Path) -> tuple[dict, list[Path]]:
    """The image's config and its layer tars, in order, from podman save."""
    import tarfile

    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / "image.tar"
    podman("save", "--format", "docker-archive", "--output", str(archive), image)
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    [manifest] = json.loads((folder / "manifest.json").read_text())
    return json.loads((folder / manifest["Config"]).read_text()), [
        folder / layer for layer in manifest["Layers"]
    ]


def layer_members(layer: Path) -> dict[str, tuple[str, int, int, str]]:
    """name -> (sha256 or link target, mode, mtime, owner) of each member of a layer's tar."""
    import tarfile

    found = {}
    with tarfile.open(layer) as tar:
        for member in tar:
            body = tar.extractfile(member) if member.isfile() else None
            content = hashlib.sha256(body.read()).hexdigest() if body else member.linkname
            found[member.name] = (content, member.mode, int(member.mtime), f"{member.uid}:{member.gid}")
    return found


def compare_images(first: str, second: str, work: Path) -> int:
    configs, layers = {}, {}
    for name, image in (("1", first), ("2", second)):
        shutil.rmtree(work / f"image-{name}", ignore_errors=True)
        configs[name], layers[name] = saved(image, work / f"image-{name}")
    one, two = configs["1"]["rootfs"]["diff_ids"], configs["2"]["rootfs"]["diff_ids"]
    print(f"image ids {first[:12]} / {second[:12]} ({'same' if first == second else 'different'})")
    steps = [h for h in configs["1"]["history"] if not h.get("empty_layer")]
    same = sum(a == b for a, b in zip(one, two, strict=False))
    print(f"  layers: {len(one)} / {len(two)}, {same} identical")
    differing = 0
    for index, (a, b) in enumerate(zip(one, two, strict=False)):
        step = steps[index]["created_by"][-90:] if index < len(steps) else "?"
        if a == b:
            print(f"    layer {index} same    {a[7:19]} {step}")
            continue
        differing += 1
        members = [layer_members(layers[n][index]) for n in ("1", "2")]
        names = set(members[0]) | set(members[1])
        content = sorted(
            n for n in names if (members[0].get(n) or ("",))[0] != (members[1].get(n) or ("",))[0]
        )
        meta = sorted(n for n in names if n not in content and members[0].get(n) != members[1].get(n))
        grouped: dict[str, list[str]] = defaultdict(list)
        for name in content:
            grouped[kind_of(name)].append(name)
        print(f"    layer {index} DIFFERS {a[7:19]} / {b[7:19]} {step}")
        print(
            f"      {len(names)} members, {len(content)} differ in content, {len(meta)} in mode/mtime/owner only"
        )
        for kind, paths in sorted(grouped.items()):
            print(f"        {kind}: {len(paths)}, e.g. {', '.join(paths[:3])}")
    config_keys = sorted(k for k in configs["1"] if configs["1"][k] != configs["2"].get(k))
    print(f"  config fields that differ: {', '.join(config_keys) or 'none'}")
    return 1 if differing else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="the commit both builds read (default HEAD)")
    parser.add_argument("--lock", default="image-cpu.txt", help="the lock file of requirements/ to install")
    parser.add_argument("--wheelhouse", type=Path, help="the lock's wheels (default: pip download them)")
    parser.add_argument("--python", default=f"python{sys.version_info.major}.{sys.version_info.minor}")
    parser.add_argument(
        "--work", type=Path, default=Path(tempfile.gettempdir()) / "frontier-reproducible-image"
    )
    parser.add_argument("--kernels", action="store_true", help="build the native kernels into the wheel too")
    parser.add_argument("--no-epoch", action="store_true", help="leave SOURCE_DATE_EPOCH out of both builds")
    parser.add_argument("--json", type=Path, help="write the comparison here")
    parser.add_argument(
        "--image", action="store_true", help="build the CPU image twice with podman and compare"
    )
    args = parser.parse_args()

    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.commit],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    tree = snapshot(commit, args.work / "tree")
    lock = tree / "requirements" / args.lock
    wheelhouse = wheelhouse_for(lock, args.wheelhouse)
    if args.image:
        ids = []
        for index in (1, 2):
            started = time.monotonic()
            ids.append(build_image(tree, lock, wheelhouse, f"localhost/frontier-reproducible:build-{index}"))
            print(f"build {index}: {ids[-1][:12]} in {time.monotonic() - started:.0f} s", flush=True)
        return compare_images(*ids, work=args.work)
    results: dict[str, dict[str, dict[str, Entry]]] = {}
    seconds = []
    for index in (1, 2):
        started = time.monotonic()
        build(tree, args.work / "build-root", lock, wheelhouse, args.python, args.kernels, not args.no_epoch)
        seconds.append(time.monotonic() - started)
        kept = args.work / f"result-{index}"
        shutil.rmtree(kept, ignore_errors=True)
        (args.work / "build-root").rename(kept)
        results[str(index)] = {"wheels": listing(kept / "dist"), "venv": listing(kept / "venv")}
    comparisons = [compare(part, results["1"][part], results["2"][part]) for part in ("wheels", "venv")]
    epoch = "unset" if args.no_epoch else SOURCE_DATE_EPOCH
    print(f"commit {commit}, lock requirements/{args.lock}, SOURCE_DATE_EPOCH {epoch}, "
          f"kernels {'built' if args.kernels else 'not built'}, builds took {seconds[0]:.0f} s and {seconds[1]:.0f} s")  # fmt: skip
    for wheel in WHEELS:
        digests = {i: results[i]["wheels"][wheel].sha256 for i in ("1", "2")}
        same = "same" if digests["1"] == digests["2"] else "DIFFERENT"
        print(f"  {wheel}: sha256:{digests['1'][:16]}… / sha256:{digests['2'][:16]}… ({same})")
    for comparison in comparisons:
        print("  " + comparison.line())
        grouped: dict[str, list[str]] = defaultdict(list)
        for rel in comparison.content + comparison.mode + comparison.only_in_one:
            grouped[kind_of(rel)].append(rel)
        for kind, paths in sorted(grouped.items()):
            print(f"    {kind}: {len(paths)}, e.g. {', '.join(paths[:3])}")
    if args.json:
        args.json.write_text(json.dumps({"epoch": epoch, "kernels": args.kernels, "seconds": seconds,
                                         "comparisons": [asdict(c) for c in comparisons]}, indent=2))  # fmt: skip
    return 1 if any(c.content or c.only_in_one for c in comparisons) else 0


if __name__ == "__main__":
    sys.exit(main())
