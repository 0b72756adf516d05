#!/usr/bin/env bash
# scripts/bench-checkpoints.sh — what checkpoints cost, next to a shadow-git checkpoint.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/bench-checkpoints.sh [--files N] [--changed K] [--bin PATH] [--help]

Measures, in one run on the same disk:
  layer1_first_write_1m / _100m   first write to an untracked 1 MiB / 100 MiB file through
                                  the mount (the blocking Layer 1 backup) vs the same
                                  write natively
  marker_latency                  `echo ID > .checkpoint/ctl` with N tracked paths of which
                                  K changed, vs a shadow-git checkpoint of the same change
                                  (`git add -A && git commit`, GIT_DIR apart, work tree =
                                  SRC, as Gemini CLI and Cline checkpoint)
  rewind                          `checkpointfs rewind` undoing the K changes, vs
                                  `git checkout -f` of the shadow commit
  branch_create_at / _now / drop  `checkpointfs branch create --at ID`, without --at (a
                                  checkpoint first), and `branch drop` on the N-file tree, vs
                                  `git worktree add` of the shadow repository
  store_bytes                     bytes in the store vs the unique content it holds
Bars: marker at least 10x faster than the shadow-git commit; branch create --at within
50 ms; store no larger than the unique content it holds. For issue 27's figure run with
--files 100000. Defaults: N=10000, K=100. Needs root (FUSE mount).
EOF
}

FILES=10000 CHANGED=100
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
while [[ $# -gt 0 ]]; do
    case $1 in
        --files) FILES=$2; shift ;;
        --changed) CHANGED=$2; shift ;;
        --bin) BIN=$2; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-checkpoints: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-checkpoints

export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@localhost
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@localhost

now() { python3 -c 'import time; print(time.perf_counter())'; }
# ms CMD...: runs CMD, prints its wall time in milliseconds
ms() { python3 - "$@" <<'PY'
import subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(f"{(time.perf_counter() - t) * 1000:.2f}")
PY
}
row() { printf '%-26s %12s %12s %10s %s\n' "$@"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "-" }'; }

mkdir -p "$W/src" "$MNT" "$W/native"
# ---- Layer 1: first write to a big untracked file ---------------------------------------
for size in 1 100; do
    head -c $((size << 20)) /dev/urandom > "$W/src/big$size"
    cp "$W/src/big$size" "$W/native/big$size"
done
"$BIN" mount "$W/src" "$MNT" --state-dir "$W/state"
sync
first_write='import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, b"x", 0)
os.close(fd)'
echo "workload                        native        mount      ratio"
for size in 1 100; do
    n=$(ms python3 -c "$first_write" "$W/native/big$size")
    m=$(ms python3 -c "$first_write" "$MNT/big$size")
    row "layer1_first_write_${size}m" "${n} ms" "${m} ms" "$(ratio "$m" "$n")" "(includes python start-up on both sides)"
done
rm -f "$MNT/big1" "$MNT/big100"

# ---- the tree: FILES files, all tracked ----------------------------------------------------
python3 - "$MNT/tree" "$FILES" <<'PY'
import os, sys
base, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(base, f"d{i // 100:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:05d}.txt"), "w") as f:
        f.write(f"file {i}\n" * 20)
PY
echo base > "$MNT/.checkpoint/ctl"
# change every file once so all are tracked, then checkpoint
python3 - "$MNT/tree" <<'PY'
import os, sys
for root, _, files in os.walk(sys.argv[1]):
    for f in files:
        with open(os.path.join(root, f), "a") as fh:
            fh.write("tracked\n")
PY
echo tracked > "$MNT/.checkpoint/ctl"
sleep 1   # let the background copier settle
change_k='import os, sys
base, k = sys.argv[1], int(sys.argv[2])
for i in range(k):
    p = os.path.join(base, f"d{i // 100:03d}", f"f{i:05d}.txt")
    with open(p, "a") as f:
        f.write("changed\n")'
python3 -c "$change_k" "$MNT/tree" "$CHANGED"
marker=$(ms sh -c "echo marker > '$MNT/.checkpoint/ctl'")

# shadow git of the same tree (in SRC, GIT_DIR elsewhere), same change
G=$W/shadow.git
git --git-dir="$G" --work-tree="$W/src/tree" init -q
git --git-dir="$G" --work-tree="$W/src/tree" add -A
git --git-dir="$G" --work-tree="$W/src/tree" commit -qm base
python3 -c "$change_k" "$MNT/tree" "$CHANGED"
shadow=$(ms sh -c "git --git-dir='$G' --work-tree='$W/src/tree' add -A && git --git-dir='$G' --work-tree='$W/src/tree' commit -qm cp")
row "marker_latency" "${shadow} ms" "${marker} ms" "$(ratio "$shadow" "$marker")" "(shadow-git / marker: $FILES tracked, $CHANGED changed; bar >= 10x)"

# ---- rewind ------------------------------------------------------------------------------
python3 -c "$change_k" "$MNT/tree" "$CHANGED"
rw=$(ms "$BIN" rewind "$MNT" marker)
python3 -c "$change_k" "$MNT/tree" "$CHANGED"
gitrw=$(ms git --git-dir="$G" --work-tree="$W/src/tree" checkout -qf HEAD -- .)
row "rewind" "${gitrw} ms" "${rw} ms" "$(ratio "$rw" "$gitrw")" "(git checkout -f / checkpointfs rewind of $CHANGED files)"

# ---- branches: creation is O(1) in the tree ---------------------------------------------------
bat=$(ms "$BIN" branch create "$MNT" bench-at --at marker)
bnow=$(ms "$BIN" branch create "$MNT" bench-now)
bdrop=$(ms "$BIN" branch drop "$MNT" bench-at)
"$BIN" branch drop "$MNT" bench-now >/dev/null
gitwt=$(ms git --git-dir="$G" worktree add -q --detach "$W/worktree" HEAD)
row "branch_create_at" "${gitwt} ms" "${bat} ms" "$(ratio "$gitwt" "$bat")" "(git worktree add / branch create --at, $FILES files; bar <= 50 ms)"
row "branch_create_now" "${gitwt} ms" "${bnow} ms" "$(ratio "$gitwt" "$bnow")" "(git worktree add / branch create with its checkpoint)"
row "branch_drop" "-" "${bdrop} ms" "-" "(gc frees the storage later)"

# ---- store size vs unique content -----------------------------------------------------------
"$BIN" umount "$MNT"
objects_list=$(python3 "$ROOT/scripts/lib/store-objects.py" "$W/state/backups")
store=$(awk '{ s += $2 } END { print s + 0 }' <<<"$objects_list")
unique=$(awk '{ print $3 }' <<<"$objects_list" | sort -u | wc -l)
objects=$(grep -c . <<<"$objects_list" || true)
row "store_bytes" "-" "$store" "-" "($objects objects, $unique distinct contents: the store holds each content once)"
awk -v s="$shadow" -v m="$marker" 'BEGIN { exit !(s >= 10 * m) }' \
    && echo "bar: marker >= 10x faster than shadow git: PASS" \
    || echo "bar: marker >= 10x faster than shadow git: FAIL"
awk -v b="$bat" 'BEGIN { exit !(b <= 50) }' \
    && echo "bar: branch create --at within 50 ms: PASS" \
    || echo "bar: branch create --at within 50 ms: FAIL"
[[ $objects == "$unique" ]] && echo "bar: store holds no duplicate content: PASS" || echo "bar: store holds no duplicate content: FAIL"
