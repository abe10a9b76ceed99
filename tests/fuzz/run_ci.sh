#!/usr/bin/env bash
# run_ci.sh [SECONDS]: build the libFuzzer harnesses with
# clang -fsanitize=fuzzer,address,undefined and run each for SECONDS
# (default 60) on a copy of its checked-in seed corpus, FUZZ_JOBS (default:
# the CPU count) at a time. Installs clang from
# apt when it is missing. Prints, per harness, the inputs tried and the
# crashes; exits 1 when any harness crashed (the crash input is kept under
# tests/fuzz/build/crashes/).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
if ! command -v clang >/dev/null 2>&1; then
    echo "clang missing: installing it from apt"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev) >/dev/null \
        || { echo "!!! could not install clang: fuzzing NOT run"; exit 1; }
fi
jobs=${FUZZ_JOBS:-$(nproc)}
make -s -j"$jobs" all
mkdir -p build/crashes
# one harness: SECONDS of fuzzing on a copy of its corpus; its one-line verdict goes to build/verdict_<h>
fuzz_one() {
    local h=$1 work=build/corpus-$1 log=build/fuzz_$1.log rc runs
    rm -rf "$work"; mkdir -p "$work"; cp corpus/"$h"/* "$work"/
    set +e
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ./build/fuzz_"$h" -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
        -artifact_prefix=build/crashes/"$h"- "$work" >"$log" 2>&1
    rc=$?
    set -e
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1 || true)
    if [ $rc -ne 0 ]; then
        { echo "fuzz_$h: CRASH after ${runs:-?} inputs (rc $rc); see tests/fuzz/$log"
          grep -E 'ERROR|SUMMARY|runtime error' "$log" | head -5; } >build/verdict_"$h"
        return 1
    fi
    echo "fuzz_$h: ${runs:-?} inputs in ${secs}s, 0 crashes" >build/verdict_"$h"
}
# the harnesses run $jobs at a time (one core each: each harness is single-threaded)
harnesses=(json_resolver store attn dlpack)
rm -f build/verdict_*
for h in "${harnesses[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    fuzz_one "$h" &
done
wait || true
# the verdict files decide (a harness without one did not finish: a failure too)
status=0
for h in "${harnesses[@]}"; do
    if [ -f build/verdict_"$h" ]; then cat build/verdict_"$h"; else echo "fuzz_$h: no verdict"; status=1; fi
    if grep -q CRASH build/verdict_"$h" 2>/dev/null; then status=1; fi
done
exit $status
