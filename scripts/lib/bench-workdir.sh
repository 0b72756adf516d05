# shellcheck shell=bash
# scripts/lib/bench-workdir.sh — the work directory of a one-mount benchmark script. Source it
# after BIN is set; do not execute it.
#
# bench_workdir NAME: checks that $BIN is executable (exit 2 naming NAME if not), makes
# W=$(mktemp -d ${BENCH_DIR:-/var/tmp}/NAME.XXXXXX) and MNT=$W/mnt, and installs EXIT/INT/TERM
# traps that unmount MNT if it is still mounted and remove W.
bench_workdir() {
    local name=$1
    [[ -x $BIN ]] || { echo "$name: no binary at $BIN (cargo build --release)" >&2; exit 2; }
    W=$(mktemp -d "${BENCH_DIR:-/var/tmp}/$name.XXXXXX")
    MNT=$W/mnt
    trap bench_workdir_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

bench_workdir_cleanup() {
    local rc=$?
    if mountpoint -q "$MNT" 2>/dev/null; then
        "$BIN" umount "$MNT" >/dev/null 2>&1 || umount -l "$MNT" 2>/dev/null || true
    fi
    rm -rf -- "$W"
    exit "$rc"
}
