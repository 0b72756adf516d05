#!/usr/bin/env bash
# scripts/stress-drop-caches.sh — issue 28, item 1: nothing fails under memory pressure.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: scripts/stress-drop-caches.sh [SECS]

Runs tests/it/memory_pressure.rs for SECS seconds (default 60) per fd budget: appends, creates
and stats through the mount by 4 threads on a 10,000-file tree while
`echo 2 > /proc/sys/vm/drop_caches` runs every 50 ms, with the inode fd budget at 8, then
64, then the default (at RLIMIT_NOFILE 1024: 448). Prints one line per budget (operations,
errors by kind, fds given back and reopened) and exits with the test's status: 0 when no
operation failed and SRC holds every byte written. CI runs the same test for 10 s a budget.
Needs root (FUSE mounts, drop_caches) and SRC's temporary directory on ext4.
USAGE
}

case ${1:-} in
    -h | --help) usage; exit 0 ;;
esac
SECS=${1:-60}
[[ $SECS =~ ^[0-9]+$ && $SECS -gt 0 ]] || { echo "stress-drop-caches: SECS must be a positive number (see --help)" >&2; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
CPFS_PRESSURE_SECS=$SECS cargo test --release --test it memory_pressure:: -- --nocapture \
    >"$log" 2>&1 || status=$?
grep -E '^budget [0-9]+:' "$log" || true
if [[ $status -ne 0 ]]; then
    tail -n 40 "$log" >&2
fi
exit "$status"
