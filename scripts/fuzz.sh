#!/usr/bin/env bash
# scripts/fuzz.sh — runs the coverage-guided cargo-fuzz targets (fuzz/) for a bounded time
# each, from the committed corpus. Run with --help for usage.
set -euo pipefail

TARGETS=(transcript journal control ctl fuse_decode)
usage() {
    cat <<EOF
usage: scripts/fuzz.sh [TARGET...]   (default: ${TARGETS[*]})

Builds the cargo-fuzz targets in fuzz/ (libFuzzer, coverage-guided; each checks what
tests/fuzz/props.rs says of one input) and runs each for CHECKPOINTFS_FUZZ_SECS seconds
(libFuzzer -max_total_time), starting from a scratch copy of its committed corpus
tests/fuzz-corpus/TARGET/ with the dictionary tests/fuzz-corpus/formats.dict. New inputs the
run finds stay in the scratch copy (removed at the end): the committed corpus is never
written. Needs cargo-fuzz (scripts/install-test-deps.sh installs it) and a C++ compiler, no
nightly toolchain: the build runs with RUSTC_BOOTSTRAP=1, so the stable one takes
cargo-fuzz's -Z flags.

A failing input (a panic, a property that does not hold, a sanitizer report, a hang of more
than 10 s or more than 2 GiB of memory) stops the script with exit 1; libFuzzer keeps it in
fuzz/artifacts/TARGET/ and the message gives the command that replays it alone.

Environment: CHECKPOINTFS_FUZZ_SECS (seconds per target, default 20; 0 skips the whole run,
build included), CHECKPOINTFS_FUZZ_SANITIZER (address, the default, or none: about 4 to 7
times the runs per second and a shorter build, for code with no unsafe in it),
FUZZ_LOG_DIR (libFuzzer's output, one log a target; default target/fuzz-logs).
EOF
}

while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        -*) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [[ $# -gt 0 ]]; then
    for t in "$@"; do
        [[ " ${TARGETS[*]} " == *" $t "* ]] \
            || { echo "fuzz.sh: no fuzz target '$t' (targets: ${TARGETS[*]})" >&2; exit 2; }
    done
    TARGETS=("$@")
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
SECS=${CHECKPOINTFS_FUZZ_SECS:-20}
SAN=${CHECKPOINTFS_FUZZ_SANITIZER:-address}
LOG_DIR=${FUZZ_LOG_DIR:-$ROOT/target/fuzz-logs}
[[ $SECS =~ ^[0-9]+$ ]] || { echo "fuzz.sh: CHECKPOINTFS_FUZZ_SECS must be whole seconds, not '$SECS'" >&2; exit 2; }
[[ $SAN == address || $SAN == none ]] \
    || { echo "fuzz.sh: CHECKPOINTFS_FUZZ_SANITIZER must be address or none, not '$SAN'" >&2; exit 2; }
if [[ $SECS == 0 ]]; then
    echo "fuzz.sh: CHECKPOINTFS_FUZZ_SECS=0: not building or running the cargo-fuzz targets"
    exit 0
fi
cargo fuzz --version >/dev/null 2>&1 \
    || { echo "fuzz.sh: cargo-fuzz is not installed (scripts/install-test-deps.sh installs it)" >&2; exit 2; }
# cargo-fuzz passes -Z flags (-Zsanitizer, ...) that only a nightly rustc takes, or a stable
# one told it may: no other toolchain is needed, or can be had on a fresh machine.
export RUSTC_BOOTSTRAP=1
REPLAY="RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer $SAN"

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", b - a }'; }
SCRATCH=
trap '[[ -z $SCRATCH ]] || rm -rf -- "$SCRATCH"' EXIT
mkdir -p "$LOG_DIR"

t0=$EPOCHREALTIME
echo "fuzz.sh: building the fuzz targets (sanitizer $SAN)"
cargo fuzz build --sanitizer "$SAN" \
    || { echo "fuzz.sh: building the fuzz targets failed" >&2; exit 1; }
echo "fuzz.sh: built in $(secs "$t0" "$EPOCHREALTIME") s"

for t in "${TARGETS[@]}"; do
    SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/cpfs-fuzz-$t.XXXXXX")
    cp -- tests/fuzz-corpus/"$t"/* "$SCRATCH"/
    seeds=$(find "$SCRATCH" -type f | wc -l)
    log=$LOG_DIR/$t.log
    artifacts=$ROOT/fuzz/artifacts/$t
    mkdir -p "$artifacts"
    start=$(($(date +%s) - 1))
    rc=0
    # -timeout: one input running 10 s is a hang, a failure; the outer timeout bounds the
    # whole run in case libFuzzer itself does not stop.
    timeout --kill-after=30 $((SECS + 300)) \
        cargo fuzz run --sanitizer "$SAN" "$t" "$SCRATCH" -- \
        -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
        -dict="$ROOT/tests/fuzz-corpus/formats.dict" -print_final_stats=1 \
        </dev/null >"$log" 2>&1 || rc=$?
    if [[ $rc != 0 ]]; then
        crash=$(find "$artifacts" -type f -newermt "@$start" -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2-)
        # What failed: the panic and where (or the sanitizer's or libFuzzer's report).
        awk '/panicked at|==[0-9]+==ERROR|^ERROR: libFuzzer|^SUMMARY: / { on = 1 }
            on && /^stack backtrace:/ { exit }
            on && n++ < 20' "$log" >&2
        echo >&2
        if [[ -n $crash ]]; then
            echo "fuzz.sh: fuzz target $t FAILED (exit $rc): the input is $crash" >&2
            echo "fuzz.sh: replay it alone with: $REPLAY $t $crash" >&2
            echo "fuzz.sh: (and make it smaller with: RUSTC_BOOTSTRAP=1 cargo fuzz tmin --sanitizer $SAN $t $crash)" >&2
        else
            echo "fuzz.sh: fuzz target $t FAILED (exit $rc) and left no input in $artifacts (a timeout of the whole run?)" >&2
        fi
        echo "fuzz.sh: libFuzzer's output: $log" >&2
        exit 1
    fi
    runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log" | tail -n 1)
    cov=$(grep -E '^#[0-9]+' "$log" | tail -n 1 | sed -n 's/.* cov: \([0-9]*\) .*/\1/p')
    echo "fuzz.sh: $t: ${runs:-?} runs in ${SECS} s, clean; coverage ${cov:-?} edges, corpus $seeds -> $(find "$SCRATCH" -type f | wc -l) inputs (log $log)"
    rm -rf -- "$SCRATCH"
    SCRATCH=
done
echo "fuzz.sh: ${#TARGETS[@]} fuzz targets clean for ${SECS} s each, in $(secs "$t0" "$EPOCHREALTIME") s with the build"
