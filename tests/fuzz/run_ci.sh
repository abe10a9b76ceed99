#!/usr/bin/env bash
# run_ci.sh [SECONDS]: build the libFuzzer harnesses with
# clang -fsanitize=fuzzer,address,undefined and run each for SECONDS
# (default 60) on a copy of its checked-in seed corpus. Installs clang from
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
make -s all
mkdir -p build/crashes
status=0
for h in json_resolver store attn dlpack; do
    work=build/corpus-$h
    rm -rf "$work"; mkdir -p "$work"; cp corpus/$h/* "$work"/
    log=build/fuzz_$h.log
    set +e
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
        ./build/fuzz_$h -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 \
        -artifact_prefix=build/crashes/$h- "$work" >"$log" 2>&1
    rc=$?
    set -e
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
    if [ $rc -ne 0 ]; then
        status=1
        echo "fuzz_$h: CRASH after ${runs:-?} inputs (rc $rc); see tests/fuzz/$log"
        grep -E 'ERROR|SUMMARY|runtime error' "$log" | head -5
    else
        echo "fuzz_$h: ${runs:-?} inputs in ${secs}s, 0 crashes"
    fi
done
exit $status
