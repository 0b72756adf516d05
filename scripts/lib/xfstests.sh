# shellcheck shell=bash
# scripts/lib/xfstests.sh — xfstests (generic/quick) through checkpointfs, and through plain
# ext4 as the baseline, in the same run. Sourced by scripts/posix-suites.sh, which provides
# ROOT, BASE, RES, MODE, BIN, fail(), secs() and the cpfs_* helpers (scripts/lib/mounts.sh).
# Do not execute it.
#
# Layout (all below $BASE/x, on the root disk; four sparse ext4 images of the same size):
#   cpfs:  TEST_DEV=$XB/ct/s  SCRATCH_DEV=$XB/cs/s  (SRC dirs on ext4 loop images mounted at
#          $XB/ct and $XB/cs), TEST_DIR=$XB/mt, SCRATCH_MNT=$XB/ms, state dirs $XB/st, $XB/ss
#          (root disk: the store does not eat the images' space); FSTYP=fuse,
#          FUSE_SUBTYP=.checkpointfs, mounted by mount(8) through mount.fuse.checkpointfs.
#   ext4:  TEST_DEV, SCRATCH_DEV = the other two loop devices; TEST_DIR=$XB/et, SCRATCH_MNT=$XB/es.
# Results: $RES/xfstests-{ext4,cpfs}/ (xfstests' RESULT_BASE) and $RES/xfstests-*.log.
#
# Knobs: XFSTESTS_DIR (build cache, /var/tmp/checkpointfs-xfstests), XFSTESTS_GROUP
#   (generic/quick), XFSTESTS_TESTS (explicit test list instead of the group, e.g.
#   "generic/001 generic/013"), XFSTESTS_IMG_SIZE (4G), XFSTESTS_TIMEOUT (s per file system,
#   3000).

XFSTESTS_REV=63a29724
XT=${XFSTESTS_DIR:-/var/tmp/checkpointfs-xfstests}/$XFSTESTS_REV/xfstests
XFS_EXCEPTIONS=$ROOT/tests/posix/xfstests-exceptions.txt
XFS_HELPER=/sbin/mount.fuse.checkpointfs
XFS_HELPER_MARK="# checkpointfs posix-suites.sh temporary mount helper"
XFS_LOOPS=()        # loop devices we attached (detached in xfs_cleanup)
XFS_HELPER_OURS=0   # we installed $XFS_HELPER (removed in xfs_cleanup)
XFS_BASE=

# Preconditions, checked before anything runs. Prints the problem and returns 1.
xfs_check_ready() {
    if [[ ! -x $XT/check || ! -f $XT/.cpfs-built ]]; then
        echo "xfstests is not built at $XT — run scripts/install-test-deps.sh (it builds it from ../shared/xfstests)" >&2
        return 1
    fi
    if [[ ! -f $XT/.cpfs-patched ]] \
        || [[ $(cat "$XT/.cpfs-patched") != $(sha256sum < "$ROOT/tests/posix/xfstests-fuse.patch" | cut -d' ' -f1) ]]; then
        echo "$XT does not carry the current tests/posix/xfstests-fuse.patch — run scripts/install-test-deps.sh" >&2
        return 1
    fi
    local c
    for c in losetup mkfs.ext4 findmnt; do
        command -v "$c" >/dev/null || { echo "xfstests needs $c" >&2; return 1; }
    done
    if [[ -e $XFS_HELPER ]] && ! grep -qxF "$XFS_HELPER_MARK" "$XFS_HELPER" 2>/dev/null; then
        echo "$XFS_HELPER exists and is not this script's temporary helper; remove it (or move it aside) for the run: xfstests must mount this build ($BIN)" >&2
        return 1
    fi
}

# Unmount and detach everything xfs_setup made (idempotent; for the EXIT trap).
xfs_cleanup() {
    [[ -n $XFS_BASE ]] || return 0
    local m i
    # checkpointfs mounts first (their SRCs live on the loop images), deepest first
    while read -r m; do
        cpfs_unmount "$BIN" "$m" "$RES/xfstests-daemon.log" || true
    done < <(awk -v r="$XFS_BASE/" '{ for (i = 7; i < NF && $i != "-"; i++); }
        $(i + 1) ~ /^fuse/ && index($5, r) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
    while read -r m; do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || cpfs_warn "could not unmount $m"
    done < <(cpfs_mountpoints | awk -v r="$XFS_BASE/" 'index($0, r) == 1' | sort -r)
    for ((i = ${#XFS_LOOPS[@]} - 1; i >= 0; i--)); do
        losetup -d "${XFS_LOOPS[i]}" 2>/dev/null || cpfs_warn "could not detach ${XFS_LOOPS[i]}"
    done
    XFS_LOOPS=()
    if [[ $XFS_HELPER_OURS == 1 ]]; then
        rm -f -- "$XFS_HELPER"
        XFS_HELPER_OURS=0
    fi
}

# xfs_img VAR NAME — a fresh ext4 image on a new loop device; sets VAR to the device.
# (Not a command substitution: XFS_LOOPS must be updated in this shell for the cleanup.)
xfs_img() {
    local img=$XFS_BASE/$2.img dev
    truncate -s "${XFSTESTS_IMG_SIZE:-4G}" "$img"
    dev=$(losetup -f --show "$img") || { echo "losetup failed for $img" >&2; return 1; }
    XFS_LOOPS+=("$dev")
    printf -v "$1" '%s' "$dev"
    mkfs.ext4 -q -F "$dev" >/dev/null || { echo "mkfs.ext4 $dev failed" >&2; return 1; }
}

xfs_setup() {
    XFS_BASE=$BASE/x
    mkdir -p "$XFS_BASE"
    local XB=$XFS_BASE d
    xfs_img XFS_E_TEST et && xfs_img XFS_E_SCRATCH es \
        && xfs_img XFS_C_TEST ct && xfs_img XFS_C_SCRATCH cs || return 1
    for d in et es mt ms ct cs st ss; do mkdir -p "$XB/$d"; done
    mount "$XFS_C_TEST" "$XB/ct" && mount "$XFS_C_SCRATCH" "$XB/cs" || return 1
    mkdir -p "$XB/ct/s" "$XB/cs/s"
    chmod 0755 "$XB" "$XB"/{et,es,mt,ms,ct,cs} "$XB/ct/s" "$XB/cs/s"
    # mount(8) finds helpers in /sbin only: install a wrapper that runs this tree's helper
    # with this build's binary (removed on exit).
    XFS_HELPER_OURS=1
    printf '#!/bin/sh\n%s\nCHECKPOINTFS=%q\nexport CHECKPOINTFS\nexec %q "$@"\n' "$XFS_HELPER_MARK" "$BIN" \
        "$ROOT/mount-scripts/mount.fuse.checkpointfs" > "$XFS_HELPER"
    chmod 0755 "$XFS_HELPER"
    local np=
    [[ $MODE == no-passthrough ]] && np=,no_passthrough
    cat > "$RES/xfstests-cpfs.config" <<EOF
export FSTYP=fuse
export FUSE_SUBTYP=.checkpointfs
export TEST_DEV=$XB/ct/s
export TEST_DIR=$XB/mt
export SCRATCH_DEV=$XB/cs/s
export SCRATCH_MNT=$XB/ms
export TEST_FS_MOUNT_OPTS="-o state_dir=$XB/st,allow_other$np"
export MOUNT_OPTIONS="-o state_dir=$XB/ss,allow_other$np"
EOF
    cat > "$RES/xfstests-ext4.config" <<EOF
export FSTYP=ext4
export TEST_DEV=$XFS_E_TEST
export TEST_DIR=$XB/et
export SCRATCH_DEV=$XFS_E_SCRATCH
export SCRATCH_MNT=$XB/es
EOF
}

# xfs_run LABEL — ./check on the LABEL config; writes $RES/xfstests-LABEL.{log,pass,fail,notrun}
# and sets XFS_RC. Pass = ran and not in "Failures:".
xfs_run() {
    local label=$1 log=$RES/xfstests-$1.log t0 t1 tests=()
    if [[ -n ${XFSTESTS_TESTS:-} ]]; then
        read -r -a tests <<<"$XFSTESTS_TESTS"
    else
        tests=(-g "${XFSTESTS_GROUP:-generic/quick}")
    fi
    XFS_RC=0
    t0=$EPOCHREALTIME
    cpfs_run env -C "$XT" HOST_OPTIONS="$RES/xfstests-$label.config" \
        RESULT_BASE="$RES/xfstests-$label" timeout --kill-after=30 "${XFSTESTS_TIMEOUT:-3000}" \
        ./check "${tests[@]}" </dev/null > "$log" 2>&1 || XFS_RC=$?
    t1=$EPOCHREALTIME
    awk -v P="$RES/xfstests-$label.pass" -v F="$RES/xfstests-$label.fail" \
        -v N="$RES/xfstests-$label.notrun" -v C="$RES/xfstests-$label.counts" '
        # "Ran:" lists every test tried, the not-run ones included
        /^Ran: /     { for (i = 2; i <= NF; i++) ran[$i] = 1; seen = 1 }
        /^Not run: / { for (i = 3; i <= NF; i++) nr[$i] = 1 }
        /^Failures: / { for (i = 2; i <= NF; i++) bad[$i] = 1 }
        END {
            printf "" > P; printf "" > F; printf "" > N
            for (t in ran) if (t in bad) { print t > F; f++ } else if (!(t in nr)) { print t > P; p++ }
            for (t in nr) { print t > N; n++ }
            printf "passed %d failed %d notrun %d complete %d\n", p, f, n, seen > C
        }' "$log"
    local f
    for f in pass fail notrun; do sort -o "$RES/xfstests-$label.$f" "$RES/xfstests-$label.$f"; done
    XFS_SECS=$(secs "$t0" "$t1")
    echo "xfstests $label: $(cat "$RES/xfstests-$label.counts") (rc=$XFS_RC, $XFS_SECS s, log $log)" >&2
}

read_xfs_exceptions() {   # test names from xfstests-exceptions.txt (comments ignored)
    [[ -f $XFS_EXCEPTIONS ]] || return 0
    sed -e 's/#.*//' -e 's/[[:space:]]//g' "$XFS_EXCEPTIONS" | awk 'NF' | sort -u
}

# xfs_suite — the whole xfstests part; sets XFS_* counts and calls fail() on regressions.
xfs_suite() {
    XFS_E_PASS=0 XFS_E_FAIL=0 XFS_E_NOTRUN=0 XFS_C_PASS=0 XFS_C_FAIL=0 XFS_C_NOTRUN=0 XFS_REG=0
    if ! xfs_setup; then
        fail "xfstests: could not set up the loop images and mounts under $BASE/x"
        return
    fi
    local c complete
    for c in ext4 cpfs; do
        xfs_run "$c"
        read -r _ p _ f _ n _ complete < "$RES/xfstests-$c.counts"
        if [[ $c == ext4 ]]; then XFS_E_PASS=$p XFS_E_FAIL=$f XFS_E_NOTRUN=$n XFS_E_SECS=$XFS_SECS
        else XFS_C_PASS=$p XFS_C_FAIL=$f XFS_C_NOTRUN=$n XFS_C_SECS=$XFS_SECS; fi
        if [[ $complete != 1 ]]; then
            fail "xfstests on $c did not complete (rc=$XFS_RC: timeout after ${XFSTESTS_TIMEOUT:-3000}s or crash); see $RES/xfstests-$c.log"
        fi
    done
    local R=$RES
    read_xfs_exceptions > "$R/xfstests-exceptions.list"
    # passes on ext4, fails through checkpointfs (not run through checkpointfs is xfstests'
    # own verdict that a feature is absent, e.g. no reflink on FUSE: reported, not failed)
    comm -12 "$R/xfstests-ext4.pass" "$R/xfstests-cpfs.fail" > "$R/xfstests-not-passing"
    comm -23 "$R/xfstests-not-passing" "$R/xfstests-exceptions.list" > "$R/xfstests-regressions"
    comm -12 "$R/xfstests-not-passing" "$R/xfstests-exceptions.list" > "$R/xfstests-excepted"
    comm -23 "$R/xfstests-cpfs.fail" "$R/xfstests-ext4.pass" > "$R/xfstests-also-fail-on-ext4"
    comm -12 "$R/xfstests-exceptions.list" "$R/xfstests-cpfs.pass" > "$R/xfstests-stale-exceptions"
    comm -12 "$R/xfstests-ext4.pass" "$R/xfstests-cpfs.notrun" > "$R/xfstests-notrun-on-cpfs"
    XFS_REG=$(wc -l < "$R/xfstests-regressions")
    echo "xfstests ${XFSTESTS_TESTS:-${XFSTESTS_GROUP:-generic/quick}} ($MODE): checkpointfs passed $XFS_C_PASS failed $XFS_C_FAIL not run $XFS_C_NOTRUN (${XFS_C_SECS} s); ext4 passed $XFS_E_PASS failed $XFS_E_FAIL not run $XFS_E_NOTRUN (${XFS_E_SECS} s)"
    [[ -s $R/xfstests-excepted ]] \
        && echo "xfstests: $(wc -l < "$R/xfstests-excepted") listed exception(s) failed through checkpointfs: $(tr '\n' ' ' < "$R/xfstests-excepted")"
    [[ -s $R/xfstests-also-fail-on-ext4 ]] \
        && echo "xfstests: failing through checkpointfs and not passing on ext4 either (tolerated): $(tr '\n' ' ' < "$R/xfstests-also-fail-on-ext4")"
    [[ -s $R/xfstests-notrun-on-cpfs ]] \
        && echo "xfstests: $(wc -l < "$R/xfstests-notrun-on-cpfs") test(s) pass on ext4 and are not run through checkpointfs (reasons in $R/xfstests-cpfs/generic/*.notrun)"
    [[ -s $R/xfstests-stale-exceptions ]] \
        && echo "xfstests: note: now passing, could be removed from xfstests-exceptions.txt: $(tr '\n' ' ' < "$R/xfstests-stale-exceptions")"
    if [[ $XFS_REG -gt 0 ]]; then
        local t
        echo "xfstests: $XFS_REG REGRESSION(S) vs ext4 (pass on ext4, fail through checkpointfs, not in xfstests-exceptions.txt):"
        while read -r t; do
            echo "  $t — $R/xfstests-cpfs/$t.out.bad, $R/xfstests-cpfs/$t.full"
        done < "$R/xfstests-regressions"
        fail "$XFS_REG xfstests test(s) pass on ext4 but fail through checkpointfs ($MODE); list: $R/xfstests-regressions"
    else
        echo "xfstests: no regressions vs ext4"
    fi
    xfs_cleanup
}
