#!/usr/bin/env python3
"""scripts/bench-roundtrip.py — what each FUSE request costs: native vs one or more
checkpointfs binaries (and optionally libfuse's passthrough_hp), in one sitting (the
machine is noisy: compare within a run).

usage: scripts/bench-roundtrip.py [--rounds N] [--files N] [--git-files N] [--enable-uring]
                                  [--reference PASSTHROUGH_HP]
                                  NAME=BIN[,MOUNT_ARG...] [NAME=BIN[,MOUNT_ARG...] ...]

Per round (the order of the configurations rotates between rounds), on a fresh SRC under
$BENCH_DIR (default /var/tmp) mounted with `BIN mount [MOUNT_ARG...]` (default mode plus
the arguments after BIN, comma-separated: `devfuse=BIN,--no-io-uring`); each mount's
transport (from `BIN status`) is printed with its results. Workloads, in this order:
  getxattr     µs per getxattr(2) of a missing attribute (one round trip, never cached)
  lookup       s to lstat N files never looked up before (one LOOKUP each)
  create       s to create + write 1 KiB + close N new files (in 100 directories)
  stat         s to stat those N files again, warm (right after creating them)
  read         s to open + read + close them, warm
  unlink       s to unlink them (and rmdir the 100 directories)
  first_unlink s to unlink N files that existed before the mount (Layer 1 backs each up)
  git_status   s for `git status` on a repository of --git-files files committed before
               the mount: the first run (cold) and the median of 3 more (warm)
  rm_rf        s to `rm -rf` that repository
For each checkpointfs mount, the FUSE requests each workload sent (from `status --json`,
`io.requests`) are printed per opcode, with the floor the issue sets for a workload whose
requests the kernel must send: native time + requests x the mount's own getxattr round
trip; `ratio to floor` = mount time / floor.

--reference PATH adds libfuse's passthrough_hp (the C reference: kernel passthrough) as
two more configurations, `hp` (/dev/fuse) and `hp-uring` (-o io_uring).
`--enable-uring` switches the fuse module's enable_uring on for the run and puts it back
on every exit path. Prints the median of each workload over the rounds and its ratio to
native; with two or more FUSE configurations, each one's getxattr round trip as a ratio to
the first's (`devfuse=BIN,--no-io-uring ring=BIN --enable-uring`: the ring's to /dev/fuse's).
Needs root (mount). Every mount is unmounted on every exit path.
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

KEYS = ["getxattr", "lookup", "create", "stat", "read", "unlink", "first_unlink",
        "git_status_cold", "git_status_warm", "rm_rf"]
UNITS = {k: "s" for k in KEYS}
UNITS["getxattr"] = "µs"
GIT = ["git", "-c", "core.untrackedCache=false", "-c", "gc.auto=0"]


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Counter:
    """FUSE requests a checkpointfs daemon served, by opcode, and the CPU time its threads
    used (`_cpu_ns`, from /proc/PID/task/*/schedstat); nothing for another filesystem."""

    def __init__(self, binary, mnt):
        self.binary, self.mnt, self.pid = binary, mnt, None

    def now(self):
        if self.binary is None:
            return {}
        out = subprocess.run([self.binary, "status", "--json", self.mnt],
                             capture_output=True, text=True).stdout
        status = json.loads(out)
        counts = dict(status.get("io", {}).get("requests", {}))
        self.pid = status.get("daemon_pid")
        counts["_cpu_ns"] = daemon_cpu_ns(self.pid)
        return counts

    @staticmethod
    def delta(before, after):
        return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0}


def daemon_cpu_ns(pid):
    """Nanoseconds the daemon's threads have run on a CPU (schedstat's first field)."""
    total = 0
    task_dir = f"/proc/{pid}/task"
    for tid in os.listdir(task_dir):
        try:
            with open(f"{task_dir}/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # a thread that ended meanwhile
    return total


def measure(root, files, counter):
    res, reqs = {}, {}

    def step(name, fn):
        before = counter.now()
        res[name] = fn()
        reqs[name] = Counter.delta(before, counter.now())

    probe = os.path.join(root, "probe")
    with open(probe, "w") as f:
        f.write("x")
    n = 20000

    def getxattr():
        t = time.perf_counter()
        for _ in range(n):
            try:
                os.getxattr(probe, "user.missing")
            except OSError:
                pass
        return (time.perf_counter() - t) / n * 1e6
    step("getxattr", getxattr)
    old = os.path.join(root, "old")
    step("lookup", lambda: timed(lambda: [os.lstat(os.path.join(old, f"f{i}")) for i in range(files)]))

    new = os.path.join(root, "new")
    dirs = 100
    per = max(1, files // dirs)
    names = [os.path.join(new, str(d), str(i)) for d in range(dirs) for i in range(per)]
    payload = b"y" * 1024

    def create():
        os.mkdir(new)
        for d in range(dirs):
            os.mkdir(os.path.join(new, str(d)))
        for p in names:
            with open(p, "wb") as f:
                f.write(payload)

    def read():
        for p in names:
            with open(p, "rb") as f:
                f.read()

    def unlink():
        for p in names:
            os.unlink(p)
        for d in range(dirs):
            os.rmdir(os.path.join(new, str(d)))
    step("create", lambda: timed(create))
    step("stat", lambda: timed(lambda: [os.stat(p) for p in names]))
    step("read", lambda: timed(read))
    step("unlink", lambda: timed(unlink))
    step("first_unlink", lambda: timed(lambda: [os.unlink(os.path.join(old, f"f{i}")) for i in range(files)]))

    repo = os.path.join(root, "repo")

    def status():
        subprocess.run(GIT + ["-C", repo, "status", "--porcelain"], check=True,
                       stdout=subprocess.DEVNULL)
    step("git_status_cold", lambda: timed(status))
    step("git_status_warm", lambda: statistics.median(timed(status) for _ in range(3)))
    step("rm_rf", lambda: timed(lambda: subprocess.run(["rm", "-rf", repo], check=True)))
    return res, reqs


def fresh_src(base, files, git_files):
    src = tempfile.mkdtemp(prefix="src.", dir=base)
    old = os.path.join(src, "old")
    os.mkdir(old)
    for i in range(files):
        with open(os.path.join(old, f"f{i}"), "wb") as f:
            f.write(b"z" * 100)
    repo = os.path.join(src, "repo")
    for i in range(git_files):
        d = os.path.join(repo, f"d{i // 100}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.txt"), "w") as f:
            f.write(f"line {i}\n" * 20)
    subprocess.run(GIT + ["init", "-q", repo], check=True)
    subprocess.run(GIT + ["-C", repo, "add", "-A"], check=True)
    subprocess.run(GIT + ["-C", repo, "-c", "user.name=b", "-c", "user.email=b@b", "commit",
                          "-qm", "tree"], check=True)
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    return src


def transport(binary, mnt):
    out = subprocess.run([binary, "status", mnt], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("transport:"):
            return line.split(":", 1)[1].strip()
    return "(not reported)"


def is_mounted(mnt):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == mnt for line in f)


def run_mounted(spec, base, a):
    binary, *args = spec.split(",")
    src = fresh_src(base, a.files, a.git_files)
    mnt = tempfile.mkdtemp(prefix="mnt.", dir=base)
    state = tempfile.mkdtemp(prefix="state.", dir=base)
    os.rmdir(state)
    try:
        subprocess.run([binary, "mount", src, mnt, "--state-dir", state, *args], check=True)
        print(f"  {spec}: transport {transport(binary, mnt)}", flush=True)
        return measure(mnt, a.files, Counter(binary, mnt))
    finally:
        r = subprocess.run([binary, "umount", mnt], capture_output=True, timeout=60)
        if r.returncode != 0:
            subprocess.run(["umount", "-l", mnt])
        for d in (src, mnt, state):
            shutil.rmtree(d, ignore_errors=True)


def run_reference(hp_args, base, a):
    src = fresh_src(base, a.files, a.git_files)
    mnt = tempfile.mkdtemp(prefix="mnt.", dir=base)
    # passthrough_hp keeps a descriptor per inode it knows (2 × --files + 100 here): up to
    # the hard limit (checked in main).
    def raise_fd_limit():
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    proc = subprocess.Popen([*hp_args, src, mnt], preexec_fn=raise_fd_limit)
    try:
        deadline = time.monotonic() + 10
        while not is_mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{hp_args} did not mount {mnt}")
            time.sleep(0.05)
        return measure(mnt, a.files, Counter(None, mnt))
    finally:
        subprocess.run(["umount", mnt])
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            subprocess.run(["umount", "-l", mnt])
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(mnt, ignore_errors=True)


def run_native(base, a):
    src = fresh_src(base, a.files, a.git_files)
    try:
        return measure(src, a.files, Counter(None, src))
    finally:
        shutil.rmtree(src, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--git-files", type=int, default=5000)
    ap.add_argument("--enable-uring", action="store_true")
    ap.add_argument("--reference", metavar="PASSTHROUGH_HP")
    ap.add_argument("binaries", nargs="+", metavar="NAME=BIN")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench-roundtrip: needs root (FUSE mounts)")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if a.reference and 2 * a.files + 1000 > hard:
        sys.exit(f"bench-roundtrip: passthrough_hp keeps a descriptor per inode: --files "
                 f"{a.files} needs ~{2 * a.files + 1000}, the hard limit is {hard}; use "
                 f"--files {(hard - 1000) // 2} or less")
    configs = {}
    for b in a.binaries:
        name, spec = b.split("=", 1)
        configs[name] = ("checkpointfs", spec)
    if a.reference:
        configs["hp"] = ("reference", [a.reference, "--foreground"])
        configs["hp-uring"] = ("reference", [a.reference, "--foreground", "-o", "io_uring"])
    base = tempfile.mkdtemp(prefix="cpfs-rt.", dir=os.environ.get("BENCH_DIR", "/var/tmp"))
    names = ["native"] + list(configs)
    results = {n: [] for n in names}
    requests = {n: [] for n in names}
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
                if n == "native":
                    res, req = run_native(base, a)
                elif configs[n][0] == "reference":
                    res, req = run_reference(configs[n][1], base, a)
                else:
                    res, req = run_mounted(configs[n][1], base, a)
                results[n].append(res)
                requests[n].append(req)
                print(f"round {r + 1} {n}: " + ", ".join(f"{k} {v:.3f}" for k, v in res.items()), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if param_was is not None:
            with open(param, "w") as f:
                f.write(param_was)
    med = {n: {k: statistics.median(x[k] for x in results[n]) for k in KEYS} for n in names}
    print(f"\nmedians of {a.rounds} rounds, {a.files} files, git repository of {a.git_files} "
          "files (ratio to native):")
    print("| workload | " + " | ".join(names) + " |")
    print("|---|" + "---:|" * len(names))
    for k in KEYS:
        cells = [f"{med['native'][k]:.3f} {UNITS[k]}"]
        for n in names[1:]:
            cells.append(f"{med[n][k]:.3f} {UNITS[k]} ({med[n][k] / med['native'][k]:.2f}×)")
        print(f"| {k} | " + " | ".join(cells) + " |")
    for n in names[1:]:
        if configs[n][0] != "checkpointfs":
            continue
        rtt = med[n]["getxattr"] / 1e6
        print(f"\n{n}: FUSE requests per workload (last round), the floor "
              f"(native + requests × {med[n]['getxattr']:.1f} µs), and the daemon's CPU time "
              "per request (median of the rounds)")
        print("| workload | requests | floor | ratio to floor | daemon CPU per request |")
        print("|---|---|---:|---:|---:|")
        for k in KEYS:
            req = dict(requests[n][-1][k])
            req.pop("_cpu_ns", None)
            total = sum(req.values())
            cpu = statistics.median(
                r[k].get("_cpu_ns", 0) / max(1, sum(v for op, v in r[k].items() if op != "_cpu_ns"))
                for r in requests[n]) / 1e3
            detail = ", ".join(f"{op} {c}" for op, c in sorted(req.items(), key=lambda x: -x[1]))
            if k == "getxattr":  # per call already: the round trip itself
                print(f"| {k} | {total}: {detail} | – | – | {cpu:.1f} µs |")
                continue
            floor = med["native"][k] + total * rtt
            print(f"| {k} | {total}: {detail} | {floor:.3f} s | {med[n][k] / floor:.2f}× | {cpu:.1f} µs |")
    fuse = names[1:]
    if len(fuse) > 1:
        first = fuse[0]
        for n in fuse[1:]:
            print(f"getxattr round trip: {n} {med[n]['getxattr']:.2f} µs, {first} "
                  f"{med[first]['getxattr']:.2f} µs: {med[n]['getxattr'] / med[first]['getxattr']:.2f}× {first}'s")


if __name__ == "__main__":
    main()
