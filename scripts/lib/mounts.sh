# shellcheck shell=bash
# scripts/lib/mounts.sh — mount/unmount helpers shared by test.sh, posix-suites.sh
# and bench.sh. Source it; do not execute it.
#
# Guarantees the scripts rely on:
#   * cpfs_mount registers the mount point BEFORE mounting, so a cleanup trap
#     also covers a half-finished mount.
#   * cpfs_unmount tries `checkpointfs umount` first (bounded by a timeout), then
#     aborts the FUSE connection and lazily unmounts (`umount -l`), then waits for
#     the daemon and, only if it is still alive, kills it by pid. The pids are the
#     checkpointfs processes whose command line names that exact mount point
#     (always a fresh mktemp path), so nothing else is ever signalled.
#   * cpfs_cleanup_all unmounts everything registered (for EXIT traps).
#   * cpfs_cleanup_under ROOT unmounts every mount below ROOT and stops every
#     checkpointfs process whose command line mentions a path below ROOT
#     (safety net for test.sh: covers mounts made by cargo test / sub-scripts).
#
# Knobs: CPFS_MOUNT_TIMEOUT (60 s), CPFS_UMOUNT_TIMEOUT (60 s),
#        CPFS_DAEMON_EXIT_WAIT (15 s, how long a daemon may take to exit).

CPFS_MOUNTS=()
CPFS_CHILD=

# cpfs_run CMD... — run CMD in the background and wait for it. bash defers trap handlers
# while a foreground command runs, but `wait` is interrupted at once, so a TERM/INT
# reaches our cleanup trap immediately; cpfs_kill_child (in that trap) then stops CMD.
# (Wrap long commands in timeout(1): it forwards TERM to its whole process group.)
cpfs_run() {
    local rc=0
    "$@" &
    CPFS_CHILD=$!
    wait "$CPFS_CHILD" || rc=$?
    CPFS_CHILD=
    return "$rc"
}

# cpfs_kill_child — stop a command started by cpfs_run that is still running.
cpfs_kill_child() {
    local pid=$CPFS_CHILD i
    [[ -n $pid ]] || return 0
    CPFS_CHILD=
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

cpfs_warn() { echo "${CPFS_WHO:-checkpointfs-scripts}: $*" >&2; }

# cpfs_find_bin ROOT — print the release binary path (CHECKPOINTFS_BIN overrides).
cpfs_find_bin() {
    local root=$1 tdir
    if [[ -n ${CHECKPOINTFS_BIN:-} ]]; then
        echo "$CHECKPOINTFS_BIN"
        return
    fi
    tdir=${CARGO_TARGET_DIR:-target}
    [[ $tdir == /* ]] || tdir=$root/$tdir
    echo "$tdir/release/checkpointfs"
}

# Mount points from /proc/self/mountinfo (no stat(): a dead FUSE daemon can't hang us).
cpfs_mountpoints() { awk '{ print $5 }' /proc/self/mountinfo; }

cpfs_is_mounted() {
    local m
    while read -r m; do
        [[ $m == "$1" ]] && return 0
    done < <(cpfs_mountpoints)
    return 1
}

# cpfs_daemon_pids MNT — pids of checkpointfs processes with MNT as an exact argument.
cpfs_daemon_pids() {
    local want=$1 p arg0 arg hit
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [[ $p == "$$" || $p == "$BASHPID" ]] && continue
        hit=0 arg0=
        while IFS= read -r -d '' arg; do
            if [[ -z $arg0 ]]; then arg0=${arg##*/}; continue; fi
            if [[ $arg == "$want" ]]; then hit=1; break; fi
        done 2>/dev/null < "/proc/$p/cmdline" || true
        [[ $hit == 1 && $arg0 == checkpointfs* ]] && echo "$p"
    done
    return 0
}

# cpfs_pids_under ROOT — pids of checkpointfs processes with an argument below ROOT.
cpfs_pids_under() {
    local root=${1%/} p arg0 arg hit
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [[ $p == "$$" || $p == "$BASHPID" ]] && continue
        hit=0 arg0=
        while IFS= read -r -d '' arg; do
            if [[ -z $arg0 ]]; then arg0=${arg##*/}; continue; fi
            if [[ $arg == "$root"/* || $arg == "$root" ]]; then hit=1; break; fi
        done 2>/dev/null < "/proc/$p/cmdline" || true
        [[ $hit == 1 && $arg0 == checkpointfs* ]] && echo "$p"
    done
    return 0
}

# cpfs_stop_pids SECONDS PID... — wait for the pids to exit; TERM, then KILL stragglers.
cpfs_stop_pids() {
    local wait_s=$1 p alive i
    shift
    [[ $# -gt 0 ]] || return 0
    for ((i = 0; i < wait_s * 10; i++)); do
        alive=()
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        [[ ${#alive[@]} -eq 0 ]] && return 0
        sleep 0.1
    done
    cpfs_warn "daemon pid(s) ${alive[*]} still running ${wait_s}s after unmount; sending SIGTERM"
    kill -TERM "${alive[@]}" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        local still=()
        for p in "${alive[@]}"; do kill -0 "$p" 2>/dev/null && still+=("$p"); done
        [[ ${#still[@]} -eq 0 ]] && return 1
        sleep 0.1
    done
    cpfs_warn "daemon pid(s) ${still[*]} ignored SIGTERM; sending SIGKILL"
    kill -KILL "${still[@]}" 2>/dev/null || true
    return 1
}

# Abort the FUSE connection of MNT (unblocks anything stuck on a hung daemon).
cpfs_abort_conn() {
    local mnt=$1 dev minor
    dev=$(awk -v m="$mnt" '$5 == m { d = $3 } END { print d }' /proc/self/mountinfo)
    [[ -n $dev ]] || return 0
    minor=${dev#*:}
    if [[ -w /sys/fs/fuse/connections/$minor/abort ]]; then
        echo 1 > "/sys/fs/fuse/connections/$minor/abort" 2>/dev/null || true
    fi
}

# cpfs_mount BIN SRC MNT STATE_DIR LOGFILE [extra mount args...]
# Returns once the mount is live (per `checkpointfs mount` contract + mountinfo check).
cpfs_mount() {
    local bin=$1 src=$2 mnt=$3 state=$4 log=$5 rc=0 i
    shift 5
    CPFS_MOUNTS+=("$mnt")
    mkdir -p "$mnt" "$state"
    # stdin/stdout/stderr of the detached daemon go to LOG, never to our pipes.
    cpfs_run timeout --kill-after=5 "${CPFS_MOUNT_TIMEOUT:-60}" \
        "$bin" mount "$src" "$mnt" --state-dir "$state" "$@" </dev/null >>"$log" 2>&1 || rc=$?
    if [[ $rc != 0 ]]; then
        cpfs_warn "'checkpointfs mount $src $mnt $*' failed (exit $rc); log $log:"
        tail -n 30 "$log" >&2 || true
        return 1
    fi
    # The contract says mount returns once the mount is live; allow a short grace anyway.
    for ((i = 0; i < 50; i++)); do
        cpfs_is_mounted "$mnt" && return 0
        sleep 0.1
    done
    cpfs_warn "'checkpointfs mount' returned 0 but $mnt is not in /proc/self/mountinfo; log $log:"
    tail -n 30 "$log" >&2 || true
    return 1
}

# cpfs_unmount BIN MNT [LOGFILE] — 0 if `checkpointfs umount` worked and the daemon
# exited by itself; 1 if a fallback (umount -l / signals) was needed.
cpfs_unmount() {
    local bin=$1 mnt=$2 log=${3:-/dev/null} rc=0 pids
    mapfile -t pids < <(cpfs_daemon_pids "$mnt")
    if cpfs_is_mounted "$mnt"; then
        if [[ -x $bin ]]; then
            cpfs_run timeout --kill-after=5 "${CPFS_UMOUNT_TIMEOUT:-60}" "$bin" umount "$mnt" \
                </dev/null >>"$log" 2>&1 || {
                rc=1
                cpfs_warn "'checkpointfs umount $mnt' failed or timed out (see $log)"
            }
        else
            rc=1
        fi
        if cpfs_is_mounted "$mnt"; then
            rc=1
            cpfs_warn "$mnt still mounted; aborting FUSE connection and lazy-unmounting"
            cpfs_abort_conn "$mnt"
            umount -l "$mnt" 2>/dev/null || fusermount3 -uz "$mnt" 2>/dev/null \
                || cpfs_warn "could not unmount $mnt"
        fi
    fi
    # `checkpointfs umount` waits for the daemon; anything left is a leak.
    local more
    mapfile -t more < <(cpfs_daemon_pids "$mnt")
    pids+=("${more[@]}")
    if [[ ${#pids[@]} -gt 0 ]]; then
        cpfs_stop_pids "${CPFS_DAEMON_EXIT_WAIT:-15}" "${pids[@]}" || rc=1
    fi
    return $rc
}

# Unmount everything registered through cpfs_mount (idempotent; for EXIT traps).
cpfs_cleanup_all() {
    local bin=$1 i
    for ((i = ${#CPFS_MOUNTS[@]} - 1; i >= 0; i--)); do
        cpfs_unmount "$bin" "${CPFS_MOUNTS[i]}" "${2:-/dev/null}" || true
    done
    CPFS_MOUNTS=()
}

# cpfs_cleanup_under BIN ROOT — unmount all mounts below ROOT (deepest first) and stop
# every checkpointfs process that names a path below ROOT. Returns 1 if it found any.
cpfs_cleanup_under() {
    local bin=$1 root=${2%/} found=0 m pids
    while read -r m; do
        found=1
        cpfs_warn "leftover mount $m; unmounting"
        cpfs_unmount "$bin" "$m" || true
    done < <(cpfs_mountpoints | awk -v r="$root/" 'index($0, r) == 1' | sort -r)
    mapfile -t pids < <(cpfs_pids_under "$root")
    if [[ ${#pids[@]} -gt 0 ]]; then
        found=1
        cpfs_warn "leftover checkpointfs process(es) ${pids[*]} under $root; stopping them"
        cpfs_stop_pids 5 "${pids[@]}" || true
    fi
    return $((found))
}

# Is any mount at or below DIR still present?
cpfs_any_mount_under() {
    cpfs_mountpoints | awk -v r="${1%/}" '$0 == r || index($0, r "/") == 1 { f = 1 } END { exit !f }'
}
