#!/usr/bin/env bash
# scripts/bench-build-latency.sh — p99 latency of a stat and of a first write through the
# mount, idle and while `cargo build -j2` runs in the mount, on both transports (issue 26).
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-build-latency.sh [--secs S] [--files N]
       (binary: $CHECKPOINTFS_BIN or target/release/checkpointfs; needs root)

For each transport (io_uring, with the fuse module's enable_uring switched on for the run
and put back on every exit path; then /dev/fuse, `--no-io-uring`): mounts a fresh SRC
holding 2 x N small untracked files (default N = 12,000) and a copy of this repository's
sources (no target/), checkpoints it, then probes for S seconds (default 10), first idle,
then while `cargo build -j2 --offline` builds that copy inside the mount (its
target/ inside the mount too):
  stat          lstat of a name never looked up before (one LOOKUP that reaches the daemon)
  first_write   open(O_APPEND) + 10-byte write + close of an untracked file not written
                since the checkpoint (a Layer 1 backup each: the syscall waits for it)
The probes are paced (one of each every 2 ms), each phase using its own half of the files.
Prints per transport, probe and phase the samples and p50/p99/max in ms, and the ratio of
the build's p99 to the idle p99 (the issue's bar: <= 3x). The build is started before the
loaded phase and stopped (by pid) after it; it need not finish.
USAGE
}

SECS=10 FILES=12000
while [[ $# -gt 0 ]]; do
    case $1 in
        --secs) SECS=${2:?}; shift ;;
        --files) FILES=${2:?}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-build-latency: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
[[ -x $BIN ]] || { echo "bench-build-latency: no binary at $BIN" >&2; exit 2; }
command -v cargo >/dev/null || { echo "bench-build-latency: cargo not found" >&2; exit 2; }
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-build-latency

PARAM=/sys/module/fuse/parameters/enable_uring
PARAM_WAS=
BUILD_PID=
# Replaces bench_workdir's EXIT trap: stops the build, unmounts both mounts, restores
# enable_uring, removes W.
cleanup() {
    local rc=$? m
    [[ -z $BUILD_PID ]] || kill -- -"$BUILD_PID" 2>/dev/null || true
    for m in "$W"/mnt-*; do
        if mountpoint -q "$m" 2>/dev/null; then
            "$BIN" umount "$m" >/dev/null 2>&1 || umount -l "$m" 2>/dev/null || true
        fi
    done
    [[ -z $PARAM_WAS ]] || echo "$PARAM_WAS" > "$PARAM"
    rm -rf -- "$W"
    exit "$rc"
}
trap cleanup EXIT
if [[ -w $PARAM ]]; then
    PARAM_WAS=$(cat "$PARAM")
    echo Y > "$PARAM"
fi

probe() {   # probe MNT PHASE: prints "PHASE stat|first_write n p50 p99 max"
    python3 - "$1" "$2" "$SECS" "$FILES" <<'PY'
import os, sys, time
mnt, phase, secs, files = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
# Each phase uses its own half of the files, so every stat is a first lookup and every
# write a first write since the checkpoint.
half = files // 2
start = 0 if phase == "idle" else half
# Paced (one stat and one first write every 2 ms) so that each phase lasts `secs` seconds
# whatever the latency, and samples the whole build rather than its first moments.
lat = {"stat": [], "first_write": []}
i, end = start, time.monotonic() + secs
while time.monotonic() < end and i < start + half:
    t = time.perf_counter()
    os.lstat(os.path.join(mnt, "s", f"f{i}"))
    t1 = time.perf_counter()
    with open(os.path.join(mnt, "w", f"f{i}"), "a") as f:
        f.write("0123456789")
    t2 = time.perf_counter()
    lat["stat"].append((t1 - t) * 1e3)
    lat["first_write"].append((t2 - t1) * 1e3)
    i += 1
    time.sleep(0.002)
for name, xs in lat.items():
    xs.sort()
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]
    print(f"{phase} {name} {len(xs)} {q(0.5):.3f} {q(0.99):.3f} {xs[-1]:.3f}", flush=True)
PY
}

for transport in io_uring dev-fuse; do
    src=$W/src-$transport mnt=$W/mnt-$transport state=$W/state-$transport
    mkdir -p "$src/s" "$src/w" "$mnt"
    python3 - "$src" "$FILES" <<'PY'
import os, sys
src, files = sys.argv[1], int(sys.argv[2])
for i in range(files):
    for d in ("s", "w"):
        with open(os.path.join(src, d, f"f{i}"), "w") as f:
            f.write("x" * 100)
PY
    mkdir -p "$src/proj"
    cp -r "$ROOT/Cargo.toml" "$ROOT/Cargo.lock" "$ROOT/src" "$src/proj/"
    [[ ! -d $ROOT/benches ]] || cp -r "$ROOT/benches" "$src/proj/"
    sync
    args=()
    [[ $transport == dev-fuse ]] && args=(--no-io-uring)
    "$BIN" mount "$src" "$mnt" --state-dir "$state" "${args[@]}"
    echo "bench-build-latency: $transport: $("$BIN" status "$mnt" | grep '^transport:' | tr -s ' ')"
    echo base > "$mnt/.checkpoint/ctl"
    probe "$mnt" idle | tee "$W/$transport.txt"
    # The build in its own process group, so that stopping it stops rustc too.
    (cd "$mnt/proj" && exec setsid cargo build -j2 --offline --quiet > "$W/build.log" 2>&1) &
    BUILD_PID=$!
    # Measure only once rustc runs (cargo's own start is quick): wait for a target dir.
    for _ in $(seq 100); do [[ -d $mnt/proj/target ]] && break; sleep 0.1; done
    probe "$mnt" build | tee -a "$W/$transport.txt"
    kill -- -"$BUILD_PID" 2>/dev/null || kill "$BUILD_PID" 2>/dev/null || true
    wait "$BUILD_PID" 2>/dev/null || true
    BUILD_PID=
    "$BIN" umount "$mnt"
    awk -v T="$transport" '{ p99[$1, $2] = $5; n[$1, $2] = $3 }
        END { split("stat first_write", names, " ")
              for (k = 1; k <= 2; k++) { x = names[k]
                  printf "%s %s: idle p99 %.3f ms (%d samples), during cargo build p99 %.3f ms (%d samples): %.2fx idle\n",
                      T, x, p99["idle", x], n["idle", x], p99["build", x], n["build", x],
                      p99["build", x] / p99["idle", x] } }' "$W/$transport.txt"
done
