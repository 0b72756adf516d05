#!/usr/bin/env bash
# scripts/bench-open-writer.sh — checkpoints while a big file is rewritten without pause.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-open-writer.sh [MIB]   (binary: $CHECKPOINTFS_BIN or target/release)

Mounts a fresh SRC (kernel passthrough, default durability) holding a file of MIB MiB
(default 200). One thread rewrites it whole, over and over, in 4 MiB pwrites through one
fd, never pausing; each round writes its round number into every 4 MiB block. Meanwhile 10
checkpoints are taken 0.2 s apart, and another thread appends a byte to another file every
2 ms (its first write after each checkpoint is a Layer 1 backup, which waits for the epoch
lock a checkpoint holds). Prints the checkpoint marker latency (median/max), the unrelated
append latency (p50/p99/max), and checks every checkpoint's view of the big file: it must
be a content the file had (blocks of round r+1 then blocks of round r, as a rewrite in
order leaves it), never a mix. Bar (issue 10): the unrelated append's max stays under 0.5 s
(a copy of the big file must not stall unrelated writers), and no view is torn.
Needs root (FUSE mount).
USAGE
}

case ${1:-} in
    -h | --help) usage; exit 0 ;;
    '' | *[!0-9]*) [[ -z ${1:-} ]] || { echo "bench-open-writer: MIB must be a number (see --help)" >&2; exit 2; } ;;
esac
MIB=${1:-200}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-open-writer

mkdir -p "$W/src" "$MNT"
"$BIN" mount "$W/src" "$MNT" --state-dir "$W/state"
python3 - "$MNT" "$MIB" <<'PY'
import os, statistics, sys, threading, time

mnt, mib = sys.argv[1], int(sys.argv[2])
BLOCK = 4 << 20
blocks = max(1, (mib << 20) // BLOCK)
big = os.path.join(mnt, "big.bin")
other = os.path.join(mnt, "other.log")


def block(round_no):
    return round_no.to_bytes(8, "little") * (BLOCK // 8)


with open(big, "wb") as f:
    for _ in range(blocks):
        f.write(block(0))
open(other, "wb").close()
stop = threading.Event()
rounds = [0]


def writer():
    fd = os.open(big, os.O_WRONLY)
    r = 0
    while not stop.is_set():
        r += 1
        data = block(r)
        for i in range(blocks):
            os.pwrite(fd, data, i * BLOCK)
        rounds[0] = r
    os.close(fd)


appends = []


def appender():
    while not stop.is_set():
        t = time.perf_counter()
        fd = os.open(other, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"x")
        os.close(fd)
        appends.append((time.perf_counter() - t) * 1000)
        time.sleep(0.002)


threads = [threading.Thread(target=writer), threading.Thread(target=appender)]
for t in threads:
    t.start()
time.sleep(0.5)
markers = []
for k in range(10):
    t = time.perf_counter()
    with open(os.path.join(mnt, ".checkpoint/ctl"), "w") as f:
        f.write(f"ow{k}\n")
    markers.append((time.perf_counter() - t) * 1000)
    time.sleep(0.2)
stop.set()
for t in threads:
    t.join()

torn = 0
for k in range(10):
    with open(os.path.join(mnt, f".checkpoint/at/ow{k}/big.bin"), "rb") as f:
        seen = []
        while chunk := f.read(BLOCK):
            first = int.from_bytes(chunk[:8], "little")
            if chunk != first.to_bytes(8, "little") * (len(chunk) // 8):
                seen = None  # a block mixing two writes
                break
            seen.append(first)
    # A content the file had: one round, or round r+1 up to some block and round r after.
    ok = seen is not None and len(seen) == blocks and (
        len(set(seen)) == 1
        or (len(set(seen)) == 2 and seen == sorted(seen, reverse=True) and seen[0] == seen[-1] + 1)
    )
    torn += not ok

appends.sort()
p = lambda q: appends[min(len(appends) - 1, int(q * len(appends)))]
print(f"file {blocks * 4} MiB, {rounds[0]} rewrites in the run")
print(f"checkpoint marker ms: median {statistics.median(markers):.0f}, max {max(markers):.0f}")
print(f"unrelated append ms: p50 {p(0.5):.2f}, p99 {p(0.99):.1f}, max {appends[-1]:.0f} ({len(appends)} appends)")
print(f"torn views: {torn} of 10")
stall_ok = appends[-1] < 500
print(f"bar: unrelated append max < 500 ms: {'PASS' if stall_ok else 'FAIL'}; no torn view: {'PASS' if torn == 0 else 'FAIL'}")
sys.exit(0 if stall_ok and torn == 0 else 1)
PY
rc=$?
grep -i "warn" "$W/state/daemon.log" | head -5 || true
exit "$rc"
