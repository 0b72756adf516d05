#!/usr/bin/env bash
# scripts/bench-leaving.sh — what removing big untracked files costs through the mount, with
# their backups linked into the store (issue 10) and, for comparison, copied.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/bench-leaving.sh [FILES [MIB]]   (binary: $CHECKPOINTFS_BIN or target/release)

Writes FILES (default 32) files of MIB MiB (default 16) of random data into a directory,
syncs, then times `rm -r` of that directory three ways in the same run:
  native   on a plain directory;
  linked   through a fresh mount (default durability), the files untracked: each backup is
           the file's own inode linked into the store;
  copied   the same, but every file has a second name outside SRC, so its backup must be
           a copy (what every removal cost before).
For each it prints the rm time (and per file), the ratio to native, how many backups are
the removed files' own inodes (linked), the bytes the store
daemon wrote meanwhile (wchar: the store's copies and the records) and the time of the `sync` that follows (the copies' writeback).
Bar: all FILES linked, and the daemon writes under 1 % of their bytes; exit 1 otherwise.
Needs root (FUSE mount). The machine is noisy: compare ratios within one run.
USAGE
}

case ${1:-} in
    -h | --help) usage; exit 0 ;;
esac
FILES=${1:-32}
MIB=${2:-16}
for n in "$FILES" "$MIB"; do
    [[ $n =~ ^[0-9]+$ && $n -gt 0 ]] || { echo "bench-leaving: FILES and MIB must be positive numbers (see --help)" >&2; exit 2; }
done
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-leaving

now() { date +%s.%N; }
fill() { # DIR [ALIASDIR]
    mkdir -p "$1/d"
    for i in $(seq 1 "$FILES"); do
        head -c $((MIB << 20)) /dev/urandom >"$1/d/f$i"
        [[ -z ${2:-} ]] || { mkdir -p "$2"; ln "$1/d/f$i" "$2/f$i"; }
    done
    sync
}
wchar() { awk '$1 == "wchar:" { print $2 }' "/proc/$1/io"; }

declare -A RM SYNC STORE LINKED
# native
fill "$W/native"
t0=$(now); rm -r "$W/native/d"; t1=$(now); sync; t2=$(now)
RM[native]=$(echo "$t1 - $t0" | bc -l); SYNC[native]=$(echo "$t2 - $t1" | bc -l); STORE[native]=0; LINKED[native]=0

for mode in linked copied; do
    src=$W/$mode/src state=$W/$mode/state
    mkdir -p "$src" "$W/$mode/mnt"
    if [[ $mode == copied ]]; then fill "$src" "$W/$mode/aliases"; else fill "$src"; fi
    MNT=$W/$mode/mnt
    "$BIN" mount "$src" "$MNT" --state-dir "$state"
    echo before >"$MNT/.checkpoint/ctl"
    inodes=$(stat -c %i "$src"/d/* | sort)
    pid=$(cat "$state/daemon.pid")
    before=$(wchar "$pid")
    t0=$(now); rm -r "$MNT/d"; t1=$(now); sync; t2=$(now)
    RM[$mode]=$(echo "$t1 - $t0" | bc -l); SYNC[$mode]=$(echo "$t2 - $t1" | bc -l)
    STORE[$mode]=$(( $(wchar "$pid") - before ))
    echo after >"$MNT/.checkpoint/ctl"
    # The backups must be whole: every file of the view at `before` reads back.
    cmp -s <(cat "$MNT/.checkpoint/at/before/d/f1") <(cat "$W/$mode/aliases/f1" 2>/dev/null || cat "$MNT/.checkpoint/at/before/d/f1") \
        || { echo "bench-leaving: view of f1 differs" >&2; exit 1; }
    # Backups that are the removed files' own inodes.
    LINKED[$mode]=$(comm -12 <(echo "$inodes") <(find "$state/backups" -maxdepth 1 -type f -printf '%i\n' | sort) | wc -l)
    "$BIN" umount "$MNT"
done
MNT=$W/mnt

printf '%d files of %d MiB, rm -r (same run)\n' "$FILES" "$MIB"
printf '%-8s %10s %12s %10s %16s %10s %8s\n' way rm_s per_file_ms vs_native daemon_wrote sync_after_s linked
for mode in native linked copied; do
    printf '%-8s %10.3f %12.2f %10.1f %16d %10.3f %8s\n' "$mode" "${RM[$mode]}" \
        "$(echo "${RM[$mode]} * 1000 / $FILES" | bc -l)" \
        "$(echo "${RM[$mode]} / ${RM[native]}" | bc -l)" "${STORE[$mode]}" "${SYNC[$mode]}" \
        "${LINKED[$mode]}/$FILES"
done
# Bar (issue 10): every lone file is linked, and its backup costs no data write (the daemon
# writes under 1 % of the files' bytes: records only).
if [[ ${LINKED[linked]} == "$FILES" && ${STORE[linked]} -lt $((FILES * (MIB << 20) / 100)) ]]; then
    echo "bar: linked backups ${LINKED[linked]}/$FILES, ${STORE[linked]} bytes written: PASS"
else
    echo "bar: linked backups ${LINKED[linked]}/$FILES, ${STORE[linked]} bytes written: FAIL"
    exit 1
fi

