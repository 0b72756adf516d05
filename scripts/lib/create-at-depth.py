#!/usr/bin/env python3
"""Creates at the bottom of deep trees (issue 28: a create's cost must not grow faster than
the depth). Used by scripts/bench-scale.sh (--only depth) and tests/it/depth.rs.

  create-at-depth.py chain TOP DEPTH
      makes a chain of DEPTH directories "d" under TOP, each step relative to the last
      (no path string longer than one name, so past PATH_MAX too).
  create-at-depth.py create BATCHES SHALLOW SHALLOW_DEPTH DEEP DEEP_DEPTH [PID PID]
      walks down both chains, then creates BATCHES x 10 files (O_CREAT, write 1 byte,
      close) at the bottom of each, in alternating batches of 10 (so both see the same
      machine load). Prints, for each chain: the median ms of a create, the daemon's CPU
      ms per create (all its threads, /proc/PID/task/*/schedstat; 0 without pids) and the
      number of files then listed at the bottom.
"""
import glob
import os
import statistics
import sys
import time


def chain(top, depth):
    fd = os.open(top, os.O_PATH | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        nfd = os.open("d", os.O_PATH | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)


def bottom(top, depth):
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def cpu_ns(pid):
    if pid is None:
        return 0
    return sum(int(open(f).read().split()[0]) for f in glob.glob(f"/proc/{pid}/task/*/schedstat"))


def create(batches, runs):
    lat = [[] for _ in runs]
    cpu = [0 for _ in runs]
    for batch in range(batches):
        for n, (fd, pid) in enumerate(runs):
            before = cpu_ns(pid)
            for i in range(batch * 10, batch * 10 + 10):
                t = time.perf_counter()
                f = os.open(f"f{i:04d}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
                os.write(f, b"x")
                os.close(f)
                lat[n].append((time.perf_counter() - t) * 1000)
            cpu[n] += cpu_ns(pid) - before
    out = []
    for n, (fd, _) in enumerate(runs):
        listed = len([name for name in os.listdir(fd) if name.startswith("f")])
        out += [f"{statistics.median(lat[n]):.3f}", f"{cpu[n] / (batches * 10) / 1e6:.3f}", str(listed)]
    print(" ".join(out))


if __name__ == "__main__":
    if sys.argv[1] == "chain":
        chain(sys.argv[2], int(sys.argv[3]))
    else:
        batches = int(sys.argv[2])
        shallow, shallow_depth, deep, deep_depth = sys.argv[3:7]
        pids = sys.argv[7:9] or [None, None]
        runs = [(bottom(shallow, int(shallow_depth)), pids[0]), (bottom(deep, int(deep_depth)), pids[1])]
        create(batches, runs)
