#!/usr/bin/env python3
"""scripts/bench-roundtrip.py — FUSE round-trip microbenchmarks, native vs one or more
checkpointfs binaries, in one sitting (the machine is noisy: compare within a run).

usage: scripts/bench-roundtrip.py [--rounds N] [--files N] [--enable-uring]
                                  NAME=BIN[,MOUNT_ARG...] [NAME=BIN[,MOUNT_ARG...] ...]

Per round (the order of native and the binaries rotates between rounds), on a fresh SRC
under $BENCH_DIR (default /var/tmp) mounted with `BIN mount [MOUNT_ARG...]` (default mode
plus the arguments after BIN, comma-separated: `devfuse=BIN,--no-io-uring`); each mount's
transport (from `BIN status`) is printed with its results:
  getxattr   µs per getxattr(2) of a missing attribute (one round trip, never cached)
  stat       s to lstat N files never looked up before (one LOOKUP each)
  create     s to create + write 1 KiB + close N new files
  unlink     s to unlink N files (each a first change: Layer 1 records it)
Prints the median of each over the rounds, and its ratio to native; with two or more
binaries, also each one's getxattr round trip as a ratio to the first's (e.g. the ring's
to /dev/fuse's: `devfuse=BIN,--no-io-uring ring=BIN --enable-uring`). `--enable-uring`
switches the fuse module's enable_uring on for the run and puts it back on every exit path.
Needs root (mount).
Every mount is unmounted on every exit path (`BIN umount`, then `umount -l`).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def measure(root, files):
    probe = os.path.join(root, "probe")
    with open(probe, "w") as f:
        f.write("x")
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        try:
            os.getxattr(probe, "user.missing")
        except OSError:
            pass
    getxattr_us = (time.perf_counter() - t) / n * 1e6

    t = time.perf_counter()
    for i in range(files):
        os.lstat(os.path.join(root, "old", f"f{i}"))
    stat_s = time.perf_counter() - t

    new = os.path.join(root, "new")
    os.mkdir(new)
    payload = b"y" * 1024
    t = time.perf_counter()
    for i in range(files):
        with open(os.path.join(new, f"f{i}"), "wb") as f:
            f.write(payload)
    create_s = time.perf_counter() - t

    t = time.perf_counter()
    for i in range(files):
        os.unlink(os.path.join(root, "old", f"f{i}"))
    unlink_s = time.perf_counter() - t
    return {"getxattr": getxattr_us, "stat": stat_s, "create": create_s, "unlink": unlink_s}


def fresh_src(base, files):
    src = tempfile.mkdtemp(prefix="src.", dir=base)
    old = os.path.join(src, "old")
    os.mkdir(old)
    for i in range(files):
        with open(os.path.join(old, f"f{i}"), "wb") as f:
            f.write(b"z" * 100)
    subprocess.run(["sync"], check=True)
    return src


def transport(binary, mnt):
    out = subprocess.run([binary, "status", mnt], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("transport:"):
            return line.split(":", 1)[1].strip()
    return "(not reported)"


def run_mounted(spec, base, files):
    binary, *args = spec.split(",")
    src = fresh_src(base, files)
    mnt = tempfile.mkdtemp(prefix="mnt.", dir=base)
    state = tempfile.mkdtemp(prefix="state.", dir=base)
    os.rmdir(state)
    try:
        subprocess.run([binary, "mount", src, mnt, "--state-dir", state, *args], check=True)
        print(f"  {spec}: transport {transport(binary, mnt)}", flush=True)
        return measure(mnt, files)
    finally:
        r = subprocess.run([binary, "umount", mnt], capture_output=True, timeout=60)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", mnt])
        for d in (src, mnt, state):
            shutil.rmtree(d, ignore_errors=True)


def run_native(base, files):
    src = fresh_src(base, files)
    try:
        return measure(src, files)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--enable-uring", action="store_true")
    ap.add_argument("binaries", nargs="+", metavar="NAME=BIN")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-roundtrip: needs root (FUSE mounts)")
    bins = [b.split("=", 1) for b in a.binaries]
    base = tempfile.mkdtemp(prefix="cpfs-rt.", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    names = ["native"] + [n for n, _ in bins]
    results = {n: [] for n in names}
    param = "/sys/module/fuse/parameters/enable_uring"
    param_was = None
    try:
        if a.enable_uring:
            with open(param) as f:
                param_was = f.read().strip()
            with open(param, "w") as f:
                f.write("Y")
        for r in range(a.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for n in order:
                res = run_native(base, a.files) if n == "native" else run_mounted(dict(bins)[n], base, a.files)
                results[n].append(res)
                print(f"round {r + 1} {n}: " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if param_was is not None:
            with open(param, "w") as f:
                f.write(param_was)
    keys = ["getxattr", "stat", "create", "unlink"]
    units = {"getxattr": "µs", "stat": "s", "create": "s", "unlink": "s"}
    med = {n: {k: statistics.median(x[k] for x in results[n]) for k in keys} for n in names}
    print(f"\nmedians of {a.rounds} rounds, {a.files} files (ratio to native):")
    print("| workload | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for k in keys:
        cells = [f"{med['native'][k]:.3f} {units[k]}"]
        for n in names[1:]:
            cells.append(f"{med[n][k]:.3f} {units[k]} ({med[n][k] / med['native'][k]:.1f}×)")
        print(f"| {k} | " + " | ".join(cells) + " |")
    if len(names) > 2:
        first = names[1]
        for n in names[2:]:
            print(f"getxattr round trip: {n} {med[n]['getxattr']:.2f} µs, {first} "
                  f"{med[first]['getxattr']:.2f} µs: {med[n]['getxattr'] / med[first]['getxattr']:.2f}× {first}'s")


if __name__ == "__main__":
    main()
