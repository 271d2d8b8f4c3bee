#!/usr/bin/env bash
# Two commits' `make run` side by side on this machine, from clean clones, started together (issue 44's A/B: these
# machines differ by a third in speed from one to the next, so only a ratio measured side by side means anything).
#
#     bash bench/make_run_ab.sh A_REV B_REV DIR [STOP_MINUTES]
#
# DIR/A and DIR/B: clones of this repository at A_REV and B_REV (DIR/shared links to this checkout's ../shared),
# each set up by `make .venv/.installed`, then `/usr/bin/time -v make run` in both at once. When one side ends
# first, its results/, benchmarks/ and logs/ move to DIR/<side>.done/ and its DAG runs again as a filler load until
# the other ends, so that the later side does not get the machine to itself (which would favour it). With
# STOP_MINUTES, both sides are stopped then (a partial A/B: compare_make_runs.py compares the jobs both finished).
# STOP_AT_RATIO=0.7: when one side ends after T, the other is stopped once it has run T / 0.7 without ending; that
# it was still running then shows the first side's wall < 0.7x the other's, without waiting for the other's end
# (T is read when the loop sees the end, up to 30 s late: that only makes the bound stricter).
# At the end: each side's exit code, wall, CPU seconds, peak RSS and `du -sh results`, compare_make_runs.py's table
# per rule, and how many of results/tables' files differ; all also in DIR/ab.txt. Run nothing heavy beside it.
# SETUP_ONLY=1: clone and install only (a later call with the same arguments starts the runs).
set -euo pipefail
[ $# -ge 3 ] || { sed -n 5p "$0" | sed 's/^# *//'; exit 2; }
a_rev=$1 b_rev=$2 dir=$3 stop_min=${4:-0} ratio=${STOP_AT_RATIO:-}
repo=$(git rev-parse --show-toplevel)
shared=$(realpath "$repo/../shared")
mkdir -p "$dir" && dir=$(realpath "$dir")
ln -sfn "$shared" "$dir/shared"

installs=()
for side in A B; do
    rev=$a_rev; [ $side = B ] && rev=$b_rev
    if [ -e "$dir/$side" ]; then  # a clone set up before (SETUP_ONLY=1) is used as it is, if it ran nothing yet
        [ "$(git -C "$dir/$side" rev-parse HEAD)" = "$(git -C "$repo" rev-parse "$rev")" ] \
            && [ ! -e "$dir/$side/results/runs" ] && [ ! -e "$dir/$side.log" ] \
            || { echo "make_run_ab: $dir/$side is not a fresh clone of $rev" >&2; exit 2; }
    else
        git clone -q "$repo" "$dir/$side" && git -C "$dir/$side" checkout -q "$rev"
    fi
    echo "$side $(git -C "$dir/$side" log --oneline -1)"
    (cd "$dir/$side" && make -s .venv/.installed > "$dir/$side.install.log" 2>&1) &
    installs+=($!)
done
for pid in "${installs[@]}"; do
    wait "$pid" || { echo "make_run_ab: set-up failed (DIR/*.install.log)" >&2; exit 1; }
done
[ -z "${SETUP_ONLY:-}" ] || exit 0

start() {  # start <side> <what> <log>: in its own session, so that one kill ends its make, Snakemake and jobs
    setsid bash -c "cd '$dir/$1' && $2 > '$3' 2>&1; echo \$? > '$3.rc'" &
    echo $! > "$3.pgid"
}
stop() { [ -f "$1.pgid" ] && kill -TERM -- "-$(cat "$1.pgid")" 2>/dev/null || true; }
trap 'stop "$dir/A.log"; stop "$dir/B.log"; stop "$dir/filler.log"; exit 130' INT TERM

t0=$(date +%s)
echo "started $(date -u +%FT%TZ); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$dir/ab.txt"
for side in A B; do start $side "/usr/bin/time -v -o '$dir/$side.time' make run" "$dir/$side.log"; done
filler="" deadline=""
while :; do
    sleep 30
    if [ -f "$dir/A.log.rc" ] && [ -f "$dir/B.log.rc" ]; then break; fi
    elapsed=$(( $(date +%s) - t0 ))
    if [ -n "$deadline" ] && [ "$elapsed" -ge "$deadline" ]; then
        other=A; [ "$filler" = A ] && other=B
        echo "$other still running $elapsed s in ($(date -u +%FT%TZ)), past $filler's end" \
             "($first_s s) / $ratio: $filler's wall < ${ratio}x $other's; $other stopped" | tee -a "$dir/ab.txt"
        stop "$dir/$other.log"; sleep 5; break
    fi
    if [ "$stop_min" != 0 ] && [ "$elapsed" -ge $(( stop_min * 60 )) ]; then
        echo "stopped both after $stop_min min $(date -u +%FT%TZ)" | tee -a "$dir/ab.txt"
        stop "$dir/A.log"; stop "$dir/B.log"; sleep 5; break
    fi
    for side in A B; do
        if [ -z "$filler" ] && [ -f "$dir/$side.log.rc" ]; then
            filler=$side
            du -sh "$dir/$side/results" > "$dir/$side.du"
            mkdir -p "$dir/$side.done" && mv "$dir/$side"/{results,benchmarks,logs} "$dir/$side.done/"
            echo "$side ended $(date -u +%FT%TZ) (rc $(cat "$dir/$side.log.rc")); its DAG reruns as the filler" \
                | tee -a "$dir/ab.txt"
            start "$side" "make run" "$dir/filler.log"
            first_s=$(( $(date +%s) - t0 ))
            [ -z "$ratio" ] || deadline=$(awk -v t="$first_s" -v r="$ratio" 'BEGIN { printf "%d", t / r + 1 }')
        fi
    done
done
[ -n "$filler" ] && stop "$dir/filler.log"

project() { if [ -d "$dir/$1.done" ]; then echo "$dir/$1.done"; else echo "$dir/$1"; fi; }
{
    for side in A B; do
        [ -f "$dir/$side.du" ] || du -sh "$dir/$side/results" > "$dir/$side.du" 2>/dev/null || true
        t="$dir/$side.time"
        echo "$side rc $(cat "$dir/$side.log.rc" 2>/dev/null || echo stopped)" \
             "wall $(grep -s 'Elapsed (wall' "$t" | sed 's/.*: //')" \
             "user+sys $(grep -s -E 'User time|System time' "$t" | awk -F': ' '{s += $2} END {printf "%.0f s", s}')" \
             "peak RSS $(grep -s 'Maximum resident' "$t" | awk -F': ' '{printf "%.2f GB", $2 / 1e6}')" \
             "results $(cut -f1 "$dir/$side.du" 2>/dev/null)"
    done
    "$dir/B/.venv/bin/python" "$repo/bench/compare_make_runs.py" "$(project A)" "$(project B)"
    missing=""
    for side in A B; do [ -d "$(project $side)/results/tables" ] || missing="$missing $side"; done
    if [ -n "$missing" ]; then
        echo "results/tables not compared: none in${missing} (stopped before its report)"
    else
        echo "results/tables files that differ: $(diff -rq "$(project A)/results/tables" "$(project B)/results/tables" \
            2>&1 | wc -l) of $(find "$(project B)/results/tables" -type f | wc -l)"
    fi
} | tee -a "$dir/ab.txt"
