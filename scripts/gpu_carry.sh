#!/usr/bin/env bash
# Builds .carry/: the wheels kbsweep's runtime (the CLI, sweeps, the MLflow store, the grader) needs on a GPU machine
# that has CUDA torch and Triton but lacks the rest and reaches no package registry.
#
#   scripts/gpu_carry.sh [HOST_PACKAGES]
#
# HOST_PACKAGES is that machine's `python3 -m pip freeze` (default docs/data/gpu_pip_freeze.txt, else the image's
# package list docs/data/h200_image_packages_2026-11-17.txt); a line naming a package without `==version` counts as
# installed at a version that fits. The resolved list is the closure of pyproject's dependencies and build
# requirements over this checkout's .venv (the versions its tests pass with), markers read for Linux x86_64 and the machine's Python:
# what the host lacks, or has at a version outside a requirement, is carried at the .venv's version, one wheel
# each with --no-deps (.carry/carry.txt); torch and Triton never. Wheels for Python $PYVER (3.12), manylinux
# x86_64; antlr4's runtime built here (it publishes no wheel); bubblewrap as a .deb. The total must stay within
# $LIMIT_MIB (50: a device call carries 64 MiB, the working tree included). On the GPU machine, from the repo's root:
#   for f in .carry/*.deb; do dpkg -x "$f" /; done
#   python3 -m pip install -q --no-index --no-deps --no-build-isolation .carry/*.whl -e .
# (into the interpreter, not --target: the grader's sandbox passes no PYTHONPATH). scripts/gpu_sweep.py does both.
set -euo pipefail
cd "$(dirname "$0")/.."
host=${1:-docs/data/gpu_pip_freeze.txt}
[[ -f $host || $# -gt 0 ]] || host=docs/data/h200_image_packages_2026-11-17.txt
carry=${CARRY:-.carry} pyver=${PYVER:-3.12} limit=${LIMIT_MIB:-50}
rm -rf "$carry" && mkdir -p "$carry"

# Not carried, nor what only they need. litellm (42 MiB with its Rust core; boto3 and openai after it): it calls
# model providers, which a machine without a registry cannot reach either; the scripted and replay models need
# none. mlflow's tracking server and its UI's (Flask, gunicorn, graphene, huey, docker, skops): the sqlite store
# and traces are mlflow-skinny's (and cryptography's: the store's model registry imports it), read back with `mlflow ui`
# where the full mlflow is.
CUT=(litellm flask flask-cors graphene gunicorn huey docker skops)
# Members dropped from a carried wheel (its RECORD rewritten to match): mlflow's UI build (7 MiB; the rest of the
# wheel is mlflow-skinny's files and the `mlflow` distribution that kbsweep's store cache reads the version of).
SLIM=("mlflow mlflow/server/js/")

.venv/bin/python - "$host" "$pyver" "${CUT[@]}" >"$carry/carry.txt" <<'EOF'
import sys
import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
from packaging.version import Version

host_file, pyver, cut = sys.argv[1], sys.argv[2], {canon(n) for n in sys.argv[3:]}
NEVER = {"torch", "triton"}  # the host's CUDA builds: a host whose versions miss kbsweep's bounds is refused
marker_env = {"python_version": pyver, "python_full_version": f"{pyver}.0", "sys_platform": "linux", "platform_system": "Linux",
              "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}
host = {}
for line in open(host_file):
    line = line.split("#")[0].strip()
    if line and not line.startswith("-"):
        name, _, version = line.partition("==")
        host[canon(name)] = Version(version.split("+")[0]) if version else None
installed = {canon(d.metadata["Name"]): d for d in metadata.distributions()}
needs, followed = {}, set()
pyproject = tomllib.load(open("pyproject.toml", "rb"))  # the build's requirements too: kbsweep installs -e there, unisolated
pending = [Requirement(spec) for spec in pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]]
while pending:  # over the .venv's installed metadata, each (package, extra) once
    req = pending.pop()
    name = canon(req.name)
    needs.setdefault(name, []).append(req)
    for extra in {""} | set(req.extras):
        if name in cut or (name, extra) in followed:
            continue
        followed.add((name, extra))
        for spec in installed[name].requires or []:
            child = Requirement(spec)
            if child.marker is None or child.marker.evaluate({**marker_env, "extra": extra}):
                child.marker = None
                pending.append(child)
carried, replaced = [], []
for name, reqs in sorted(needs.items()):
    version = host.get(name, False)
    fits = version is None or (version is not False and all(r.specifier.contains(version, prereleases=True) for r in reqs))
    if name in NEVER and not fits:
        sys.exit(f"gpu_carry: the host's {name} {version or '(absent)'} misses {sorted({str(r) for r in reqs})}; kbsweep never replaces it")
    if name in cut or name in NEVER or fits:
        continue
    carried.append(f"{installed[name].metadata['Name']}=={installed[name].version}")
    if version is not False:
        replaced.append(f"{name} {version}")
print("\n".join(carried))
if replaced:
    print(f"gpu_carry: replaces the host's {', '.join(replaced)} (outside a requirement)", file=sys.stderr)
EOF

platforms=(--platform any --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for n in $(seq 5 39); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
antlr=$(grep '^antlr4-python3-runtime==' "$carry/carry.txt" || true)
grep -v '^antlr4-python3-runtime==' "$carry/carry.txt" \
  | xargs python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp "${platforms[@]}" -d "$carry" 2> >(grep -v "^WARNING: Location" >&2)
[[ -z $antlr ]] || python3 -m pip wheel -q --no-deps -w "$carry" "$antlr" 2> >(grep -v "^WARNING: Location" >&2)
for entry in "${SLIM[@]}"; do
  read -r package prefix <<<"$entry"
  for wheel in "$carry/$package"-[0-9]*.whl; do
    [[ -f $wheel ]] || continue
    python3 - "$wheel" "$prefix" <<'EOF'
import os, sys, zipfile
wheel, prefix = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(wheel + ".part", "w", zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        data = src.read(info)
        if info.filename.startswith(prefix):
            continue
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"".join(line for line in data.splitlines(keepends=True) if not line.startswith(prefix.encode()))
        dst.writestr(info, data)
os.replace(wheel + ".part", wheel)
EOF
  done
done
(cd "$carry" && apt-get download bubblewrap >/dev/null 2>&1) || echo "gpu_carry: no bubblewrap .deb (apt-get download failed): grades there run as gpu_common.py says" >&2
count=$(wc -l <"$carry/carry.txt") files=$(find "$carry" -name '*.whl' | wc -l)
[[ $files -eq $count ]] || { echo "gpu_carry: $files wheels for the $count packages of $carry/carry.txt" >&2; exit 1; }
kib=$(du -sk --apparent-size "$carry" | cut -f1)
echo "gpu_carry: $count wheels and bubblewrap, $((kib / 1024)) MiB in $carry (limit $limit MiB; host packages: $host)"
(( kib <= limit * 1024 )) || { echo "gpu_carry: over the limit; the largest:" >&2; ls -S -s --block-size=K "$carry" | sed -n 2,11p >&2; exit 1; }
