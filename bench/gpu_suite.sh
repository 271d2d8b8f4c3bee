#!/usr/bin/env bash
# The GPU measurements, in one script to run first whenever a GPU machine is at hand (issue 62). Each part has its
# own time limit so that one slow part leaves the others their turn:
#   0. device_tests: the device augmentation's tests on CUDA (same values as on the CPU; nvJPEG vs libjpeg-turbo);
#   1. step_rn50, step_vitb32: the data wait of our trainer at 224 px, batch 512, bf16 (bench_step.py
#      --skip-open-clip: open_clip's step was measured before, results/step_*_h100_*), reading 400x300 photo JPEGs
#      in webdataset shards in img2dataset's layout with 8 and 16 workers, for each of augment_on: workers,
#      augment_on: device, and decode_on: device (nvJPEG), plus a census of the synchronising CUDA calls of a run;
#   2. episode: ProtoCLIP / CLIP time per episode (bench_episode.py, RN50 224 px, m = 16384, batch 512) reading
#      the same kind of shards with 8 workers (the loader reads on across pass boundaries), with the colour
#      augmentation in the workers and on the device, for both passes;
#   3. kmeans: k-means at the paper's episode size (bench_kmeans.py --gpu-only: m = 200k, K = 20k, d = 128, 20
#      iterations): the torch loop on CUDA and faiss on the GPU, same data and initial centroids. faiss with GPU
#      support is not in the lent machines' image and cannot be carried there (the `[gpu]` extra's faiss wheels
#      need CUDA 12's runtime and cuBLAS wheels, hundreds of MB, beside the image's CUDA 13): the part then says
#      "faiss gpu: not installed" and times the torch loop alone (docs/speed.md);
#   4. smoke: the paper smoke on CUDA (gpu_smoke.py: config/paper.yaml + the smoke overlay at RN50 / 224 px, gpu:
#      true, 2000 synthetic pairs, scikit-learn's digits as the evaluation set; prepare -> teacher -> train ->
#      evaluate -> report through Snakemake);
#   5. decode (only when named): the data path, ours vs open_clip_train's webdataset pipeline (bench_decode.py).
# Outputs: bench/results/<part>_<gpu name>_<date>.txt (the GPU as nvidia-smi names it), and a summary line per
# part on stdout. Without a GPU it prints one line and exits 0. `--cpu-smoke` (or GPU_SUITE_CPU_SMOKE=1) runs
# every bench of the suite on the CPU at tiny sizes instead (the step and episode benches on the JPEG shards they
# write, k-means, the decode bench, the smoke overlay's validation), writing under $GPU_SUITE_OUT (default: a
# temporary folder), so that the script cannot rot unnoticed (tests/unit/test_gpu_suite.py).
# GPU_SUITE_PARTS="step_rn50 smoke" runs the parts named only. A device call runs at most 600 s, and the limits
# below add up to more (they come from the H100 runs, results/*_h100_*, with room for the 16-worker rows, which
# have not run yet), so the suite runs as two calls:
#   GPU_SUITE_PARTS="device_tests step_rn50 step_vitb32 kmeans" bash bench/gpu_suite.sh     # <= 500 s
#   GPU_SUITE_PARTS="episode smoke" bash bench/gpu_suite.sh                                 # <= 570 s
#
#   bash bench/gpu_suite.sh              # on the GPU machine, from the repository root (every default part)
#   bash bench/gpu_suite.sh --cpu-smoke  # anywhere: a minute or two
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if [ "${1:-}" = "--cpu-smoke" ] || [ "${GPU_SUITE_CPU_SMOKE:-0}" = "1" ]; then
    out=${GPU_SUITE_OUT:-$(mktemp -d)}
    mkdir -p "$out"
    set -e
    "$PY" bench/bench_decode.py --tiny --root "$out/shards" --out "$out/decode_cpu_smoke.txt" > "$out/decode.log"
    "$PY" bench/bench_step.py --skip-open-clip --batch 8 --steps 2 --repeats 1 --workers 1 --head-hidden 64 \
        --threads 1 > "$out/step_cpu_smoke.txt" 2> "$out/step.log"
    "$PY" bench/bench_episode.py --episode 32 --batch 16 --episodes 2 --head-hidden 64 --data shards --workers 1 \
        --augment-on workers device > "$out/episode_cpu_smoke.txt" 2> "$out/episode.log"
    "$PY" bench/bench_kmeans.py --m 2000 --k 200 --iters 5 --threads 1 > "$out/kmeans_cpu_smoke.txt"
    "$PY" bench/gpu_smoke.py "$out/smoke" --check
    echo "gpu_suite: CPU smoke passed ($out)"
    exit 0
fi

if ! command -v nvidia-smi > /dev/null 2>&1 || \
        ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
    echo "gpu_suite: no GPU here (nvidia-smi or torch.cuda.is_available() missing): nothing measured"
    exit 0
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -c 'A-Za-z0-9\n' '_' | tr -s '_' | sed 's/_$//')
day=$(date -u +%Y-%m-%d)
res=bench/results
mkdir -p "$res"
status=0

part() {  # part <name> <time limit s> <command...>: run it, keep its output under bench/results, say how it ended
    local name=$1 limit=$2
    shift 2
    case " ${GPU_SUITE_PARTS:-device_tests step_rn50 step_vitb32 kmeans episode smoke} " in *" $name "*) ;; *) return 0 ;; esac  # GPU_SUITE_PARTS="smoke ...": those only
    local file="$res/${name}_${gpu}_${day}.txt"
    { echo "# $*"; echo "# $(date -u '+%Y-%m-%d %H:%M') UTC, $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1), $(nproc) CPUs, commit $(git rev-parse --short HEAD 2> /dev/null)"; } > "$file"
    local t0=$SECONDS
    timeout --signal=INT --kill-after=20 "$limit" "$@" >> "$file" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && status=1
    echo "gpu_suite: $name: exit $rc after $((SECONDS - t0)) s (limit $limit s) -> $file"
    tail -n 4 "$file" | sed 's/^/    /'
}

part device_tests 60 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_data_device_augment.py
part step_rn50 170 "$PY" bench/bench_step.py --model RN50 --batch 512 --steps 6 --repeats 1 --workers 8 16 \
    --head-hidden 2048 --skip-open-clip
part step_vitb32 150 "$PY" bench/bench_step.py --model ViT-B-32 --batch 512 --steps 6 --repeats 1 --workers 8 16 \
    --head-hidden 2048 --skip-open-clip
part kmeans 40 "$PY" bench/bench_kmeans.py --m 200000 --d 128 --k 20000 --iters 20 --gpu-only
part decode 45 "$PY" bench/bench_decode.py --workers 8 --batch 32 --batches 6 --images 2048 --shards 8 \
    --micro 64 --note "GPU machine's CPUs; images/s per worker, interleaved rounds"
part episode 240 "$PY" bench/bench_episode.py --model RN50 --image-size 224 --episode 16384 --batch 512 \
    --episodes 2 --workers 8 --head-hidden 2048 --data shards --augment-on workers device
smoke=$(mktemp -d)/gpu-smoke
# GPU_SUITE_TEACHER_FILES: the packaged teacher's folder without its weights, where the package is not installed
# (gpu_smoke.py --teacher-files: random weights); the greedy scheduler: Snakemake's ILP one needs pulp's solver
teacher=${GPU_SUITE_TEACHER_FILES:+--teacher-files '$GPU_SUITE_TEACHER_FILES'}
part smoke 330 bash -c "'$PY' bench/gpu_smoke.py '$smoke' --pairs 2000 $teacher && cd '$smoke' && \
    PATH='$PWD/.venv/bin':\$PATH snakemake --configfile config/paper.yaml smoke.yaml --profile workflow/profiles/gpu \
    --cores all --resources gpu=4 --scheduler greedy && ls results/tables results/figures"
echo "gpu_suite: done (any part that did not exit 0 is marked above); outputs in $res/*_${gpu}_${day}.txt"
exit $status
