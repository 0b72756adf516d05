#!/usr/bin/env bash
# scripts/bench.sh — native vs checkpointfs benchmark, one sitting. --help for usage.
set -euo pipefail
export LC_ALL=C

usage() {
    cat <<'EOF'
usage: scripts/bench.sh [--quick] [--strict] [--runs N] [--native-only] [--no-np]
                        [--no-agent] [--as-user USER [--owner]] [--bin PATH] [--out DIR]
                        [--help]

Runs scripts/fsbench.sh (the maintainers' harness: fio sequential 1 GiB write/read,
4 KiB random write/read, 10,000 small files create/stat/read/delete, git add+commit and
status on a 5,000-file tree, untar of a ~50 MB source tarball) twice in one run:
  1. natively in SRC, a fresh directory on the root disk (under $BENCH_DIR, /var/tmp);
  2. through MNT, SRC mounted with `checkpointfs mount` (default mode: kernel passthrough);
then, unless --no-np, the sequential write/read again through a --no-passthrough mount.
Prints each workload with native value, mount value and ratio mount/native (time ratio
for seconds: lower is better; throughput ratio for MB/s and IOPS: higher is better), and
PASS/FAIL against the bars:
  seq_write_1g, seq_read_1g   >= 0.9x native throughput (passthrough mode)
  small_create/stat/read/delete  <= 4x native time
  git_commit_5k               <= 3x native time
  aw_total                    <= 1.10x native time
Each round also runs ../shared/bench/agent-workloads.sh (what an agent does in a real
repository: clone, checkouts across ~60 tags, cargo check, npm ci, venv, cold grep, gc, rm
of the dependency trees) natively and through the mount with AW_CTL set (a checkpoint after
every step); its steps appear as aw_<step>, their sum (checkpoints included) as aw_total.
At the end, scripts/bench-checkpoints.sh (checkpoint costs) and scripts/bench-open-writer.sh
(checkpoints while a 200 MiB file, 64 with --quick, is rewritten without pause: unrelated
appends never stall 0.5 s, no torn view) and scripts/bench-leaving.sh (rm of big untracked
files: their backups are linked, not copied) run with their own bars.

Options:
  --quick        smoke run: 128 MiB seq, 64 MiB/3 s random, 2,000 small files,
                 1,000-file git tree, ~10 MB tarball (bars still printed, indicative only)
  --strict       exit 1 if a bar fails (default: exit 0 regardless of the bars)
  --runs N       N rounds (native and mount, in alternating order, then the no-passthrough
                 mount); each run starts after sync + drop_caches; the table shows
                 per-workload medians (default 1; 3 recommended on a noisy machine)
  --native-only  only the native run (no binary needed)
  --no-np        skip the --no-passthrough sequential run
  --no-agent     skip agent-workloads.sh (it takes minutes per run)
  --as-user USER what a normal user gets: the workloads (native and mount) and the
                 daemon run as USER (setpriv, no supplementary groups), which mounts
                 through fusermount3 — so no kernel passthrough: the "mount" column is
                 the daemon serving reads and writes. The caches are still dropped
                 between phases, by this (root) script on the user's request. Implies
                 --no-np (no passthrough to compare against) and --no-agent
                 (agent-workloads.sh drops the caches itself, which needs root).
  --owner        with --as-user: the mount is made by root for USER (`mount --owner
                 USER`), so USER's workloads get kernel passthrough; the daemon runs as
                 root, the workloads as USER.
  --bin PATH     checkpointfs binary (default $CHECKPOINTFS_BIN or target/release/checkpointfs)
  --out DIR      results dir (default target/bench-results/TIMESTAMP): per round
                 native.R.txt, mount.R.txt, mount-np.R.txt; medians native.txt, mount.txt,
                 mount-np.txt; table.txt, table.md
  -h, --help     this text

Needs root (drop_caches, FUSE mount). Machines are noisy: compare ratios from one run.
Every mount is unmounted on every exit path; no daemon is left running.
EOF
}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CPFS_WHO=bench
# shellcheck source=lib/mounts.sh
source "$ROOT/scripts/lib/mounts.sh"

QUICK=0 STRICT=0 NATIVE_ONLY=0 NP=1 AGENT=1 BIN= OUT= RUNS=1 AS_USER= OWNER=0
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --strict) STRICT=1 ;;
        --native-only) NATIVE_ONLY=1 ;;
        --no-np) NP=0 ;;
        --no-agent) AGENT=0 ;;
        --runs) RUNS=${2:?--runs needs a number}; shift ;;
        --as-user) AS_USER=${2:?--as-user needs a user name}; shift ;;
        --owner) OWNER=1 ;;
        --bin) BIN=${2:?--bin needs a path}; shift ;;
        --out) OUT=${2:?--out needs a dir}; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
die() { echo "bench: ERROR: $*" >&2; exit 2; }
[[ $RUNS =~ ^[1-9][0-9]*$ ]] || die "--runs needs a positive number"
[[ $(id -u) == 0 ]] || die "must run as root (drop_caches, FUSE mount)"
if [[ -n $AS_USER ]]; then
    AS_UID=$(id -u "$AS_USER" 2>/dev/null) || die "--as-user: no such user '$AS_USER'"
    AS_GID=$(id -g "$AS_USER")
    [[ $AS_UID != 0 ]] || die "--as-user needs a normal user, not root"
    command -v setpriv >/dev/null || die "missing tool: setpriv (util-linux)"
    command -v fusermount3 >/dev/null || die "--as-user: a normal user mounts through fusermount3, which is missing"
    NP=0 AGENT=0
fi
[[ $OWNER == 0 || -n $AS_USER ]] || die "--owner needs --as-user USER"
for t in fio jq python3 git tar; do command -v "$t" >/dev/null || die "missing tool: $t"; done
if [[ $NATIVE_ONLY == 0 ]]; then
    [[ -n $BIN ]] || BIN=$(cpfs_find_bin "$ROOT")
    [[ -x $BIN ]] || die "checkpointfs binary not found at $BIN — run 'cargo build --release' (or --native-only)"
fi

if [[ $QUICK == 1 ]]; then
    export FSBENCH_SEQ_SIZE=128M FSBENCH_RAND_SIZE=64M FSBENCH_RUNTIME=3
    export FSBENCH_SMALL_DIRS=20 FSBENCH_SMALL_FILES=100 FSBENCH_GIT_MODS=10 FSBENCH_TARBALL_MB=10
fi
SEQ_SIZE=${FSBENCH_SEQ_SIZE:-1G}

OUT=${OUT:-$ROOT/target/bench-results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PARENT=${BENCH_DIR:-/var/tmp}
case $(stat -f -c %T "$PARENT") in
    tmpfs | ramfs) die "$PARENT is on tmpfs; set BENCH_DIR to a dir on the root disk" ;;
esac
BASE=$(mktemp -d "$PARENT/cpfs-bench.XXXXXX")
SRC=$BASE/src MNT=$BASE/mnt STATE=$BASE/state
mkdir -p "$SRC" "$MNT"
DAEMON_LOG=$OUT/daemon.log
: > "$DAEMON_LOG"
# AS: the prefix that runs a workload as --as-user's USER (empty: as root).
AS=()
DROP_PID=

cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    cd /
    cpfs_kill_child
    [[ $NATIVE_ONLY == 1 ]] || cpfs_cleanup_all "$BIN" "$DAEMON_LOG"
    [[ -z $DROP_PID ]] || kill "$DROP_PID" 2>/dev/null || true
    if cpfs_any_mount_under "$BASE"; then
        echo "bench: warning: something is still mounted under $BASE; not removing it" >&2
    else
        rm -rf -- "$BASE" 2>/dev/null || echo "bench: warning: could not fully remove $BASE" >&2
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

FSBENCH=$ROOT/scripts/fsbench.sh
if [[ -n $AS_USER ]]; then
    # The user's tree: BASE is traversable, SRC/MNT/HOME and the state dirs the user's own
    # (the daemon refuses a state dir another user owns).
    chmod 0755 "$BASE"
    mkdir -p "$BASE/home"
    chown "$AS_UID:$AS_GID" "$SRC" "$MNT" "$BASE/home"
    # The tarball comes from root's ~/.cargo; build it now, world-readable.
    FSBENCH_PREPARE_ONLY=1 "$FSBENCH" "$BASE" || die "could not build fsbench's tarball"
    # Cache drops on the user's request: a root loop answers each line written to
    # drop.req with sync + drop_caches and a line on drop.ack.
    mkfifo -m 0600 "$BASE/drop.req" "$BASE/drop.ack"
    chown "$AS_UID:$AS_GID" "$BASE/drop.req" "$BASE/drop.ack"
    (
        exec 3<>"$BASE/drop.req"   # held open: the loop never sees EOF between requests
        while read -r _ <&3; do
            sync; echo 3 > /proc/sys/vm/drop_caches
            echo done > "$BASE/drop.ack"
        done
    ) &
    DROP_PID=$!
    AS=(setpriv --reuid "$AS_UID" --regid "$AS_GID" --clear-groups
        env "HOME=$BASE/home" "USER=$AS_USER"
        "FSBENCH_DROP_CMD=echo drop > '$BASE/drop.req' && read -r _ < '$BASE/drop.ack'")
    # The daemon and `checkpointfs umount` run as the user too (the wrapper execs the
    # binary, so the daemon's command line still starts with it) — unless root mounts for
    # the user (--owner).
    if [[ $NATIVE_ONLY == 0 && $OWNER == 0 ]]; then
        mkdir -p "$BASE/bin"
        printf '#!/bin/sh\nexec setpriv --reuid %s --regid %s --clear-groups env HOME=%q %q "$@"\n' \
            "$AS_UID" "$AS_GID" "$BASE/home" "$BIN" > "$BASE/bin/checkpointfs"
        chmod 0755 "$BASE/bin/checkpointfs"
        REAL_BIN=$BIN BIN=$BASE/bin/checkpointfs
    fi
fi
echo "bench: $(nproc) cores, kernel $(uname -r), $(findmnt -n -o SOURCE,FSTYPE -T "$BASE" | tr -s ' ' ' ')$([[ $QUICK == 1 ]] && echo ', QUICK sizes')$([[ -n $AS_USER ]] && { [[ $OWNER == 1 ]] && echo ", as user $AS_USER (mounted by root --owner $AS_USER: kernel passthrough)" || echo ", as user $AS_USER (fusermount3, no kernel passthrough)"; }); results $OUT"

# ---- checkpoint-specific benchmarks ---------------------------------------------------
# Layer 1 first-write cost, marker latency vs a shadow-git commit, rewind time and store size
# are measured by scripts/bench-checkpoints.sh, run at the end of this script (it needs its
# own 10,000-file tree and mount); nothing to add inside the fsbench rounds.
checkpoint_benchmarks() { :; }   # checkpoint_benchmarks MNT OUTFILE

# agent-workloads.sh DIR [CTL] >> OUTFILE as aw_<step> lines plus aw_total.
AW=$ROOT/../shared/bench/agent-workloads.sh
if [[ $AGENT == 1 && ! -x $AW && ! -f $AW ]]; then
    echo "bench: $AW not found: agent workloads skipped" >&2
    AGENT=0
fi
agent_workloads() {   # agent_workloads DIR OUTFILE [CTL]
    [[ $AGENT == 1 ]] || return 0
    local raw=$OUT/aw.raw
    settle
    AW_CTL=${3:-} cpfs_run bash "$AW" "$1" > "$raw" || die "agent-workloads.sh failed in $1"
    awk '$3 == "s" { print "aw_" $1, $2, "s"; t += $2 } END { printf "aw_total %.3f s\n", t }' \
        "$raw" >> "$2"
}

# Same fio jobs as fsbench.sh's seq_write_1g / seq_read_1g, for the --no-passthrough mount.
np_seq() {   # np_seq DIR OUTFILE
    local npw j=$OUT/np-fio.json
    npw=$(mktemp -d "$1/np.XXXXXX")
    fio_seq() {
        cpfs_run fio --output-format=json --output="$j" --ioengine=psync --numjobs=1 \
            --direct=0 --randrepeat=0 --name=job --filename="$npw/seq.dat" --bs=1M \
            --size="$SEQ_SIZE" "$@" >/dev/null
    }
    : > "$2"
    fio_seq --rw=write --end_fsync=1
    echo "seq_write_1g $(jq -r '.jobs[0].write.bw_bytes / 1e6 | . * 10 | round / 10' "$j") MB/s" >> "$2"
    sync; echo 3 > /proc/sys/vm/drop_caches
    fio_seq --rw=read
    echo "seq_read_1g $(jq -r '.jobs[0].read.bw_bytes / 1e6 | . * 10 | round / 10' "$j") MB/s" >> "$2"
    rm -rf -- "$npw"
    cat "$2"
}

# ---- rounds: native and mount (alternating order), mount --no-passthrough; --runs times ---
# Every run starts from a settled disk (`settle`: sync, then drop the caches), so none pays
# for the writeback of the run before it; and the order of native and mount alternates
# between rounds (odd: native first; even: mount first), so an order effect cancels in the
# medians instead of always falling on the same side.
settle() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; }
run_fsbench() {   # run_fsbench DIR OUTFILE — as --as-user's USER if given (OUT is root's)
    if [[ -z $AS_USER ]]; then
        cpfs_run "$FSBENCH" "$1" "$2"
        return
    fi
    cpfs_run "${AS[@]}" "$FSBENCH" "$1" "$BASE/home/fsbench.out"
    cp "$BASE/home/fsbench.out" "$2"
}
native_round() {   # native_round R TAG
    echo "bench: native run in $SRC$2"
    settle
    run_fsbench "$SRC" "$OUT/native.$1.txt"
    agent_workloads "$SRC" "$OUT/native.$1.txt"
}
mount_round() {    # mount_round R TAG
    # A fresh state dir per round keeps the rounds independent.
    echo "bench: mount run in $MNT (default mode)$2"
    local extra=()
    if [[ $OWNER == 1 ]]; then
        extra=(--owner "$AS_USER")
    elif [[ -n $AS_USER ]]; then
        mkdir -m 0700 "$STATE.$1" && chown "$AS_UID:$AS_GID" "$STATE.$1"
    fi
    cpfs_mount "$BIN" "$SRC" "$MNT" "$STATE.$1" "$DAEMON_LOG" "${extra[@]}" || die "mount failed"
    settle
    run_fsbench "$MNT" "$OUT/mount.$1.txt"
    checkpoint_benchmarks "$MNT" "$OUT/checkpoint.$1.txt"
    agent_workloads "$MNT" "$OUT/mount.$1.txt" "$MNT/.checkpoint/ctl"
    cpfs_unmount "$BIN" "$MNT" "$DAEMON_LOG" || echo "bench: warning: unmount needed a fallback" >&2
}
for ((r = 1; r <= RUNS; r++)); do
    tag=""; if [[ $RUNS -gt 1 ]]; then tag=" (round $r/$RUNS)"; fi
    if [[ $NATIVE_ONLY == 1 ]]; then
        native_round "$r" "$tag"
        continue
    fi
    if ((r % 2 == 1)); then
        native_round "$r" "$tag"
        mount_round "$r" "$tag"
    else
        mount_round "$r" "$tag"
        native_round "$r" "$tag"
    fi

    if [[ $NP == 1 ]]; then
        echo "bench: --no-passthrough sequential run in $MNT$tag"
        cpfs_mount "$BIN" "$SRC" "$MNT" "$STATE.np.$r" "$DAEMON_LOG" --no-passthrough \
            || die "mount --no-passthrough failed"
        np_seq "$MNT" "$OUT/mount-np.$r.txt"
        cpfs_unmount "$BIN" "$MNT" "$DAEMON_LOG" || echo "bench: warning: unmount needed a fallback" >&2
    fi
    CPFS_MOUNTS=()
done

# Per workload: the median over the rounds (the value itself for one round).
median_of() {   # median_of OUTFILE INFILES...
    local out=$1
    shift
    [[ $# -gt 0 ]] || { : > "$out"; return; }
    awk '{ if (!($1 in unit)) { order[++n] = $1; unit[$1] = $3 } v[$1, ++c[$1]] = $2 }
        END { for (i = 1; i <= n; i++) { w = order[i]; k = c[w]
                for (a = 1; a <= k; a++) x[a] = v[w, a] + 0
                for (a = 2; a <= k; a++) { t = x[a]; b = a - 1
                    while (b >= 1 && x[b] > t) { x[b + 1] = x[b]; b-- } x[b + 1] = t }
                m = (k % 2) ? x[(k + 1) / 2] : (x[k / 2] + x[k / 2 + 1]) / 2
                print w, m, unit[w] } }' "$@" > "$out"
}
shopt -s nullglob
median_of "$OUT/native.txt" "$OUT"/native.[0-9]*.txt
median_of "$OUT/mount.txt" "$OUT"/mount.[0-9]*.txt
median_of "$OUT/mount-np.txt" "$OUT"/mount-np.[0-9]*.txt
shopt -u nullglob
[[ $RUNS -gt 1 ]] && echo "bench: table values are medians of $RUNS rounds (per-round files in $OUT)"
[[ -f $OUT/mount.txt ]] || : > "$OUT/mount.txt"
[[ -f $OUT/mount-np.txt ]] || : > "$OUT/mount-np.txt"

# ---- table -------------------------------------------------------------------------------
awk -v QUICK="$QUICK" -v TXT="$OUT/table.txt" -v MD="$OUT/table.md" -v VERDICT="$OUT/verdict" '
    FILENAME == ARGV[1] { order[++n] = $1; nat[$1] = $2; unit[$1] = $3; next }
    FILENAME == ARGV[2] { mnt[$1] = $2; next }
    FILENAME == ARGV[3] { np[$1] = $2; next }
    function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "" : sprintf("%.2f", a / b) }
    END {
        bar["seq_write_1g"] = ">=0.9"; bar["seq_read_1g"] = ">=0.9"
        bar["small_create"] = "<=4"; bar["small_stat"] = "<=4"
        bar["small_read"] = "<=4";   bar["small_delete"] = "<=4"
        bar["git_commit_5k"] = "<=3"; bar["aw_total"] = "<=1.10"
        hdr = sprintf("%-16s %-5s %10s %10s %7s %10s %7s %7s  %s", "workload", "unit", "native", \
            "mount", "ratio", "mount-np", "ratio", "bar", "verdict")
        print hdr > TXT; print hdr
        print "| workload | unit | native | mount | ratio | mount --no-passthrough | ratio | bar | verdict |" > MD
        print "|---|---|---:|---:|---:|---:|---:|---|---|" > MD
        fails = 0
        for (i = 1; i <= n; i++) {
            w = order[i]; m = (w in mnt) ? mnt[w] : ""; p = (w in np) ? np[w] : ""
            r = ratio(m, nat[w]); rn = ratio(p, nat[w]); v = "-"
            if ((w in bar) && r != "") {
                lim = substr(bar[w], 3) + 0
                ok = (substr(bar[w], 1, 2) == ">=") ? (r + 0 >= lim) : (r + 0 <= lim)
                v = ok ? "PASS" : "FAIL"; if (!ok) fails++
            } else if (w in bar) v = "pending"
            line = sprintf("%-16s %-5s %10s %10s %7s %10s %7s %7s  %s", w, unit[w], nat[w], \
                m != "" ? m : "-", r != "" ? r "x" : "-", p != "" ? p : "-", \
                rn != "" ? rn "x" : "-", (w in bar) ? bar[w] "x" : "-", v)
            print line > TXT; print line
            printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w, unit[w], nat[w], \
                m != "" ? m : "pending", r != "" ? r "x" : "-", p != "" ? p : "-", \
                rn != "" ? rn "x" : "-", (w in bar) ? bar[w] "x" : "-", v > MD
        }
        print fails > VERDICT
    }' "$OUT/native.txt" "$OUT/mount.txt" "$OUT/mount-np.txt"
FAILS=$(cat "$OUT/verdict")
echo "bench: ratio = mount/native (seconds: time ratio, lower is better; MB/s, IOPS: throughput ratio, higher is better)"
[[ $QUICK == 1 ]] && echo "bench: --quick sizes: the bars are indicative only"
if [[ $NATIVE_ONLY == 1 ]]; then
    echo "bench: native only; bars pending. Markdown table: $OUT/table.md"
    exit 0
fi
echo "bench: $FAILS bar(s) failed. Markdown table: $OUT/table.md"
echo
echo "bench: checkpoint costs (scripts/bench-checkpoints.sh)"
if ! CHECKPOINTFS_BIN=${REAL_BIN:-$BIN} "$ROOT/scripts/bench-checkpoints.sh" $([[ $QUICK == 1 ]] && echo --files 1000 --changed 10) | tee "$OUT/checkpoints.txt"; then
    echo "bench: bench-checkpoints.sh failed" >&2
    FAILS=$((FAILS + 1))
fi
grep -q ': FAIL' "$OUT/checkpoints.txt" 2>/dev/null && FAILS=$((FAILS + 1))
echo
echo "bench: checkpoints while a big file is rewritten (scripts/bench-open-writer.sh)"
if ! CHECKPOINTFS_BIN=${REAL_BIN:-$BIN} "$ROOT/scripts/bench-open-writer.sh" $([[ $QUICK == 1 ]] && echo 64) | tee "$OUT/open-writer.txt"; then
    echo "bench: bench-open-writer.sh failed its bars" >&2
    FAILS=$((FAILS + 1))
fi
echo
echo "bench: removing big untracked files (scripts/bench-leaving.sh)"
if ! CHECKPOINTFS_BIN=${REAL_BIN:-$BIN} "$ROOT/scripts/bench-leaving.sh" $([[ $QUICK == 1 ]] && echo 8 8) | tee "$OUT/leaving.txt"; then
    echo "bench: bench-leaving.sh failed its bar" >&2
    FAILS=$((FAILS + 1))
fi
if [[ $STRICT == 1 && $FAILS -gt 0 ]]; then exit 1; fi
exit 0
