#!/bin/bash
# Profile every broker run_e2e.py starts with py-spy (200 Hz, raw collapsed stacks).
#
#   bench/pyspy_e2e.sh OUT_PREFIX [run_e2e.py options...]
#
# Writes OUT_PREFIX.log (the benchmark's output) and OUT_PREFIX.N.raw, one per broker started,
# in run order; summarise with bench/pyspy_summary.py. Run from the repository root.
set -u
out=$1
shift
.venv/bin/python bench/run_e2e.py "$@" >"$out.log" 2>&1 &
bench=$!
seen=" "
n=0
while kill -0 "$bench" 2>/dev/null; do
    for pid in $(pgrep -P "$bench"); do
        if grep -q standalone "/proc/$pid/cmdline" 2>/dev/null && [[ $seen != *" $pid "* ]]; then
            seen="$seen$pid "
            n=$((n + 1))
            .venv/bin/py-spy record --pid "$pid" -r 200 --format raw --nonblocking \
                -o "$out.$n.raw" >"$out.$n.spylog" 2>&1 &
        fi
    done
    sleep 0.05
done
wait
