#!/usr/bin/env bash
# scripts/bench-gc-pause.sh — how long `gc` holds up writes through the mount (issue 28:
# "gc's pause of mutations is bounded: measure it").
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-gc-pause.sh [--files N] [--checkpoints C] [--changed K]
       (binary: $CHECKPOINTFS_BIN or target/release/checkpointfs; needs root)

Mounts a fresh SRC holding N files of 4 KiB (default 20,000) and takes C checkpoints
(default 200), each after rewriting K of the files (default 200) with new content, so the
store holds C x K objects gc can drop. Then a probe writes through the mount without pause
(open, append 10 bytes, close of a file it rewrote before: no Layer 1 work of its own) while
`checkpointfs gc MNT --keep 1` runs, and prints how long gc took, the probe's p50, p99 and
longest write during it, and the same figures idle. The longest write is gc's pause: every
mutation waits while gc runs quiesced.
USAGE
}

FILES=20000 CHECKPOINTS=200 CHANGED=200
while [[ $# -gt 0 ]]; do
    case $1 in
        --files) FILES=${2:?}; shift ;;
        --checkpoints) CHECKPOINTS=${2:?}; shift ;;
        --changed) CHANGED=${2:?}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-gc-pause: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-gc-pause
mkdir -p "$W/src" "$MNT"
python3 - "$W/src" "$FILES" <<'PY'
import os, sys
src, files = sys.argv[1], int(sys.argv[2])
for d in range(files // 100 + 1):
    os.makedirs(f"{src}/d{d}", exist_ok=True)
for i in range(files):
    with open(f"{src}/d{i // 100}/f{i}", "wb") as f:
        f.write(os.urandom(4096))
PY
sync
"$BIN" mount "$W/src" "$MNT" --state-dir "$W/state" >/dev/null
python3 - "$MNT" "$FILES" "$CHECKPOINTS" "$CHANGED" <<'PY'
import os, sys
mnt, files, checkpoints, changed = sys.argv[1], *map(int, sys.argv[2:])
for c in range(checkpoints):
    for k in range(changed):
        i = (c * changed + k) % files
        with open(f"{mnt}/d{i // 100}/f{i}", "wb") as f:
            f.write(os.urandom(4096))
    with open(f"{mnt}/.checkpoint/ctl", "w") as f:
        f.write(f"c{c}\n")
with open(f"{mnt}/probe", "w") as f:
    f.write("probe\n")
with open(f"{mnt}/.checkpoint/ctl", "w") as f:
    f.write("ready\n")
PY
echo "bench-gc-pause: $FILES files, $CHECKPOINTS checkpoints of $CHANGED changed files; store: $(du -sh "$W/state/backups" | cut -f1)"
python3 - "$MNT" "$BIN" <<'PY'
import os, subprocess, sys, threading, time
mnt, binary = sys.argv[1], sys.argv[2]
def probe(stop, out):
    while not stop.is_set():
        t = time.perf_counter()
        with open(f"{mnt}/probe", "a") as f:
            f.write("0123456789")
        out.append((time.perf_counter() - t) * 1e3)
def summary(xs):
    xs = sorted(xs)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]
    return f"{len(xs)} writes, p50 {q(0.5):.3f} ms, p99 {q(0.99):.3f} ms, longest {xs[-1]:.1f} ms"
idle, stop = [], threading.Event()
t = threading.Thread(target=probe, args=(stop, idle))
t.start(); time.sleep(3); stop.set(); t.join()
print(f"idle: {summary(idle)}")
during, stop = [], threading.Event()
t = threading.Thread(target=probe, args=(stop, during))
t.start()
start = time.perf_counter()
r = subprocess.run([binary, "gc", mnt, "--keep", "1", "--json"], capture_output=True, text=True)
took = time.perf_counter() - start
stop.set(); t.join()
if r.returncode != 0:
    sys.exit(f"gc failed: {r.stderr}")
import json
rep = json.loads(r.stdout)
print(f"gc --keep 1: {took:.2f} s, dropped {len(rep['dropped'])} checkpoints, removed "
      f"{rep['objects_removed']} objects ({rep['bytes_freed']} bytes)")
print(f"during gc: {summary(during)}")
PY
"$BIN" umount "$MNT"
# The daemon's own account: how long mutations were held, and the packs' rewrite after.
grep -o 'gc: .*' "$W/state/daemon.log" || true
