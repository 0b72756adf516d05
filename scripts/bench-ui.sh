#!/usr/bin/env bash
# scripts/bench-ui.sh — what the queries of `checkpointfs ui` cost on a large history.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-ui.sh [--checkpoints N] [--paths K]   (binary: $CHECKPOINTFS_BIN or target/release)

Mounts a fresh SRC, changes K files (default 100000) through the mount after a first
checkpoint, then takes N checkpoints (default 10000) in all, each after a one-file change;
then times, over the control socket as the UI asks them, REPS (default 20) of each: browse-head (the
once-a-second poll), a timeline page (100 rows, newest first), a page of the checkpoint with
K paths (100 rows, unfiltered and filtered), and one file's diff. Prints the median and p95
of each. The UI answers keys from what it holds (the per-key cost is the unit test
cli::ui::view::tests::each_keypress_redraws_within_50_ms_...); these are the waits for a page
to fill in. Needs root (FUSE mount).
USAGE
}

CHECKPOINTS=10000
PATHS=100000
while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help) usage; exit 0 ;;
        --checkpoints) CHECKPOINTS=$2; shift 2 ;;
        --paths) PATHS=$2; shift 2 ;;
        *) echo "bench-ui: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-ui
mkdir -p "$W/src" "$MNT"
"$BIN" mount "$W/src" "$MNT" --state-dir "$W/state" >/dev/null

start=$(date +%s)
python3 - "$MNT" "$CHECKPOINTS" "$PATHS" <<'PY'
import os, sys
mnt, n, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def ctl(i):
    fd = os.open(os.path.join(mnt, ".checkpoint/ctl"), os.O_WRONLY)
    os.write(fd, f"c{i}\n".encode())
    os.close(fd)
ctl(0)
for d in range(100):
    os.makedirs(os.path.join(mnt, f"d{d}"), exist_ok=True)
for i in range(k):
    with open(os.path.join(mnt, f"d{i % 100}", f"f{i}.txt"), "w") as f:
        f.write(f"line {i}\n")
for i in range(1, n):
    ctl(i)
    with open(os.path.join(mnt, "one.txt"), "w") as f:
        f.write(f"version {i}\n")
PY
echo "built $CHECKPOINTS checkpoints, $PATHS paths changed after c0, in $(( $(date +%s) - start )) s"

python3 - "$W/state/control.sock" "$CHECKPOINTS" "${REPS:-20}" <<'PY'
import json, socket, statistics, sys, time
sock, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def ask(req):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    s.sendall((json.dumps(req) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    s.close()
    r = json.loads(data)
    assert r["ok"], r
    return json.loads(r["output"]) if r["output"].startswith("{") else r["output"]
cases = [
    ("browse-head", {"cmd": "browse-head"}),
    ("timeline page 0", {"cmd": "browse-timeline", "offset": 0, "limit": 100}),
    ("timeline last page", {"cmd": "browse-timeline", "offset": n - 100, "limit": 100}),
    ("100k-path page", {"cmd": "browse-changes", "id": "c0", "offset": 0, "limit": 100, "filter": ""}),
    ("100k-path filtered", {"cmd": "browse-changes", "id": "c0", "offset": 0, "limit": 100, "filter": "f999"}),
    ("file diff", {"cmd": "browse-diff", "id": "c0", "path": "d1/f1.txt", "against": {"kind": "next"}}),
]
head = ask({"cmd": "browse-head"})
assert head["checkpoints"] == n, head
page = ask(cases[3][1])
assert page["total"] >= 100000 or page["total"] > 0, page["total"]
print(f"{'request':<22} {'median ms':>10} {'p95 ms':>10}")
for name, req in cases:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        ask(req)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    print(f"{name:<22} {statistics.median(times):>10.1f} {times[max(0, -(-len(times) * 95 // 100) - 1)]:>10.1f}")
PY
"$BIN" umount "$MNT" >/dev/null
