#!/usr/bin/env bash
# scripts/bench-latency.sh — does a burst of first writes (and checkpoints) hold up unrelated
# requests? p50/p99/max latency of view lookups and of unrelated writes, idle vs under load.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-latency.sh [--durability MODE]   (default: the binary's own default)
       [--writers N] [--files N] [--secs S]
       (binary: $CHECKPOINTFS_BIN or target/release/checkpointfs; needs root)

Mounts a fresh SRC holding WRITERS directories of FILES small files each (default 8 x 1500),
plus an already-modified file `hot.txt`, and checkpoints it (`base`). Then, in one Python
process, two probes run for S seconds (default 4) each, first with the mount idle, then
during a burst:
  view_lookup   stat of a fresh, never-looked-up name under .checkpoint/at/base/ (a LOOKUP
                that reaches the daemon and asks the history every time; ENOENT)
  other_write   open+append+close of hot.txt (already backed up: no Layer 1 work)
The burst: WRITERS threads each make the first write to their own files, one after the
other (a Layer 1 backup each: copy, journal record, and in --durability strict a syncfs),
while a thread takes a checkpoint every 100 ms through .checkpoint/ctl.
Prints per probe and phase the number of samples and p50/p99/max in ms, and the ratio of
the burst's p99 to the idle p99. What it shows: whether a lookup or an unrelated write waits
behind another request's copy or sync (issue 12: no lock held across IO).
USAGE
}

MODE= WRITERS=8 FILES=1500 SECS=4
while [[ $# -gt 0 ]]; do
    case $1 in
        --durability) MODE=${2:?}; shift ;;
        --writers) WRITERS=${2:?}; shift ;;
        --files) FILES=${2:?}; shift ;;
        --secs) SECS=${2:?}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-latency: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-latency

python3 - "$W/src" "$WRITERS" "$FILES" <<'PY'
import os, sys
base, writers, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for w in range(writers):
    d = os.path.join(base, f"w{w}")
    os.makedirs(d)
    for i in range(files):
        with open(os.path.join(d, f"f{i:05d}.txt"), "w") as f:
            f.write(f"writer {w} file {i}\n" * 64)
with open(os.path.join(base, "hot.txt"), "w") as f:
    f.write("hot\n")
PY
sync
mkdir -p "$MNT"
"$BIN" mount "$W/src" "$MNT" --state-dir "$W/state" ${MODE:+--durability "$MODE"}
echo "hot again" >> "$MNT/hot.txt"   # backed up now: later appends do no Layer 1 work
echo base > "$MNT/.checkpoint/ctl"
echo "bench-latency: $(nproc) cores, durability ${MODE:-default}, $WRITERS writers x $FILES first writes, ${SECS} s per phase"
python3 - "$MNT" "$WRITERS" "$FILES" "$SECS" <<'PY'
import itertools, os, sys, threading, time
mnt, writers, files, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
view = os.path.join(mnt, ".checkpoint", "at", "base")
hot = os.path.join(mnt, "hot.txt")
ctl = os.path.join(mnt, ".checkpoint", "ctl")
fresh = itertools.count()

def view_lookup():
    try:
        os.stat(os.path.join(view, f"nothing-{next(fresh)}"))
    except FileNotFoundError:
        pass

def other_write():
    fd = os.open(hot, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"x\n")
    os.close(fd)

PROBES = {"view_lookup": view_lookup, "other_write": other_write}

def sample(probe, until):
    out = []
    while time.monotonic() < until:
        t = time.perf_counter()
        probe()
        out.append((time.perf_counter() - t) * 1000)
        time.sleep(0.001)  # pacing: a probe, not a load
    return out

def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]

def run_phase(load):
    stop = threading.Event()
    done = []
    threads = []
    if load:
        def writer(w):
            n = 0
            for i in range(files):
                if stop.is_set():
                    break
                fd = os.open(os.path.join(mnt, f"w{w}", f"f{i:05d}.txt"), os.O_WRONLY | os.O_APPEND)
                os.write(fd, b"changed\n")
                os.close(fd)
                n += 1
            done.append(n)
        def checkpointer():
            k = 0
            while not stop.wait(0.1):
                with open(ctl, "w") as f:
                    f.write(f"burst-{os.getpid()}-{k}\n")
                k += 1
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
        threads.append(threading.Thread(target=checkpointer))
        for t in threads:
            t.start()
    results = {}
    for name, probe in PROBES.items():
        results[name] = sample(probe, time.monotonic() + secs)
    stop.set()
    for t in threads:
        t.join()
    return results, sum(done)

idle, _ = run_phase(False)
burst, first_writes = run_phase(True)
print(f"{'probe':<12} {'phase':<6} {'n':>6} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}  p99 burst/idle")
for name in PROBES:
    for phase, res in (("idle", idle), ("burst", burst)):
        xs = res[name]
        extra = ""
        if phase == "burst":
            extra = f"  {pct(xs, 0.99) / pct(idle[name], 0.99):.1f}x"
        print(f"{name:<12} {phase:<6} {len(xs):>6} {pct(xs, 0.5):>9.3f} {pct(xs, 0.99):>9.3f} {max(xs):>9.3f}{extra}")
print(f"burst: {first_writes} first writes during the probes")
PY
"$BIN" umount "$MNT"
