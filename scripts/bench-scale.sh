#!/usr/bin/env bash
# scripts/bench-scale.sh — what checkpointfs costs as the tree and the session grow.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/bench-scale.sh [--quick] [--bin PATH] [--only NAME[,NAME...]] [--rounds N] [--help]

Prints, in one run on the same disk (each figure with what it is compared to):
  transcript_per_checkpoint  transcript bytes added per checkpoint (5 paths changed
                             before each) at 10k and 100k tracked paths;      bar <= 20 KB
  marker_latency             median `echo ID > .checkpoint/ctl` (5 changed) at 1k, 10k
                             and 100k tracked paths;                          bar <= 5 ms
  remount / log              after 1,000 checkpoints at 10k tracked paths:
                             `checkpointfs mount` and `checkpointfs log`;     bars <= 3 s, <= 2 s
  first_write                median first write (append 1 byte) to an existing small
                             file, per --durability mode the binary has, against
                             the same append natively;                        bar <= 15x (default)
  first_write_after_checkpoint
                             1,000 untracked 100-byte files in 10 directories, each
                             appended once (open O_WRONLY|O_APPEND, write a line,
                             close) right after a checkpoint, against the same
                             appends on a plain directory: median per file, in
                             --rounds alternating rounds (native, default mode,
                             strict), the median of the rounds;               bar <= 15x (default)
                             and strict's syncs per backup (daemon log);      bar <= 1
                             and the same with every file hard-linked a second
                             time, inside SRC and outside it (pnpm's store),
                             against the single-link default;                 bar <= 1.2x
  store_bytes                bytes the store allocates against the allocated bytes
                             of the distinct contents it holds: pre-images and the
                             checkpoint's versions (a sparse file included);  bar <= 1.0x
  create_at_depth            median create (O_CREAT, write 1 byte, close) of 200 files at
                             the bottom of a chain of 2,500 and of 5,000 directories (made
                             in SRC directly; both depths interleaved in batches of 10),
                             through the mount and natively, and the transcript bytes
                             per create: depth 5,000 against 2,500;
                                                                              bar <= 2.2x
--quick: 1k/10k tracked paths and 200 checkpoints (the bars are then indicative only).
--only: run only these sections (transcript, long, first_write,
first_write_after_checkpoint, store, depth). --rounds: rounds of first_write_after_checkpoint
(default 3).
Needs root (FUSE mounts). Every mount is unmounted on every exit path.
EOF
}

QUICK=0 ONLY="" ROUNDS=3
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CHECKPOINTFS_BIN:-$ROOT/target/release/checkpointfs}
while [[ $# -gt 0 ]]; do
    case $1 in
        --quick) QUICK=1 ;;
        --bin) BIN=$2; shift ;;
        --only) ONLY=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "bench-scale: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "bench-scale: --rounds must be a positive number" >&2; exit 2; }
for name in ${ONLY//,/ }; do
    case $name in
        transcript | long | first_write | first_write_after_checkpoint | store | depth) ;;
        *) echo "bench-scale: unknown section '$name' (see --help)" >&2; exit 2 ;;
    esac
done
# Whether section $1 runs (all of them without --only). Each section below is one
# `if wanted NAME; then ... fi`, its body not indented (it holds heredocs).
wanted() { [[ -z $ONLY || ,$ONLY, == *,$1,* ]]; }
# shellcheck source=lib/bench-workdir.sh
source "$ROOT/scripts/lib/bench-workdir.sh"
bench_workdir bench-scale
mkdir -p "$MNT"

if [[ $QUICK == 1 ]]; then
    SIZES="1000 10000" LONG_CHECKPOINTS=200
else
    SIZES="1000 10000 100000" LONG_CHECKPOINTS=1000
fi

FAILS=0
row() { printf '%-34s %14s %14s %10s  %s\n' "$@"; }
verdict() { # verdict NAME VALUE OP LIMIT
    if awk -v v="$2" -v l="$4" -v op="$3" 'BEGIN { exit !(op == "<=" ? v <= l : v >= l) }'; then
        echo "bar: $1 $3 $4: PASS ($2)"
    else
        echo "bar: $1 $3 $4: FAIL ($2)"; FAILS=$((FAILS + 1))
    fi
}
secs() { python3 - "$@" <<'PY'
import subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
print(f"{time.perf_counter() - t:.3f}")
PY
}
transcript_bytes() { stat -c %s "$1/transcript.jsonl"; }
# Waits until the background copier has filled every pending version (a checkpoint right
# after creating N files leaves N to copy; unmounting would wait for them).
settle() {
    while ! "$BIN" status "$MNT" | grep -q '^pending copies: 0$'; do sleep 0.5; done
}
fresh() { # fresh NAME: a new SRC and state dir, mounted at $MNT
    SRC=$W/$1-src STATE=$W/$1-state
    mkdir -p "$SRC"
    "$BIN" mount "$SRC" "$MNT" --state-dir "$STATE"
}

# Creates N files through the mount (so all are tracked), in directories of 1,000.
populate='import os, sys
base, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(base, f"d{i // 1000:03d}")
    if i % 1000 == 0:
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i:06d}"), "w") as f:
        f.write(f"file {i}\n")'
# Runs C checkpoints, each after changing 5 files; prints the median and p90 marker
# latency in ms (the ctl write alone).
checkpoints='import os, statistics, sys, time
mnt, n, c, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ctl = os.path.join(mnt, ".checkpoint/ctl")
lat = []
for k in range(c):
    for j in range(5):
        i = (k * 5 + j) * 7919 % n
        with open(os.path.join(mnt, f"d{i // 1000:03d}", f"f{i:06d}"), "a") as f:
            f.write(f"change {k}\n")
    fd = os.open(ctl, os.O_WRONLY)
    t = time.perf_counter()
    os.write(fd, f"{tag}-{k}\n".encode())
    lat.append((time.perf_counter() - t) * 1000)
    os.close(fd)
lat.sort()
print(f"{statistics.median(lat):.2f} {lat[int(len(lat) * 0.9)]:.2f}")'

if wanted transcript; then
echo "== transcript and marker as the tree grows (5 paths changed per checkpoint)"
row "workload" "value" "compared to" "ratio" "note"
for n in $SIZES; do
    fresh "t$n"
    python3 -c "$populate" "$MNT" "$n"
    echo "base" > "$MNT/.checkpoint/ctl"
    settle
    "$BIN" umount "$MNT"
    before=$(transcript_bytes "$STATE")
    "$BIN" mount "$SRC" "$MNT" --state-dir "$STATE"
    read -r med p90 < <(python3 -c "$checkpoints" "$MNT" "$n" 50 c)
    settle
    "$BIN" umount "$MNT"
    per=$(( ($(transcript_bytes "$STATE") - before) / 50 ))
    row "transcript_per_checkpoint_$n" "$per B" "20000 B" "$(awk -v a="$per" 'BEGIN { printf "%.2fx", a / 20000 }')" "(incl. the 5 Layer 1 records)"
    row "marker_latency_$n" "$med ms" "5 ms" "-" "(p90 $p90 ms)"
    [[ $n -ge 10000 ]] && verdict "transcript_per_checkpoint_$n" "$per" "<=" 20000
    verdict "marker_latency_$n" "$med" "<=" 5
    rm -rf "$SRC" "$STATE"
done
fi

if wanted long; then
echo
echo "== a long session: $LONG_CHECKPOINTS checkpoints at 10k tracked paths"
fresh long
python3 -c "$populate" "$MNT" 10000
python3 -c "$checkpoints" "$MNT" 10000 "$LONG_CHECKPOINTS" s >/dev/null
settle
"$BIN" umount "$MNT"
tbytes=$(transcript_bytes "$STATE")
mount_s=$(secs "$BIN" mount "$SRC" "$MNT" --state-dir "$STATE")
log_s=$(secs "$BIN" log "$MNT")
"$BIN" umount "$MNT"
row "transcript_after_$LONG_CHECKPOINTS" "$tbytes B" "-" "-" "(10k tracked, 5 changed per checkpoint)"
row "remount_after_$LONG_CHECKPOINTS" "$mount_s s" "3 s" "-" "(checkpointfs mount: replay, until the mount is live)"
row "log_after_$LONG_CHECKPOINTS" "$log_s s" "2 s" "-" "(checkpointfs log, text)"
verdict "remount" "$mount_s" "<=" 3
verdict "log" "$log_s" "<=" 2
rm -rf "$SRC" "$STATE"
fi

if wanted first_write; then
echo
echo "== first write to an existing small file (open, append 1 byte, close), median of 2000"
first_write='import os, statistics, sys, time
base = sys.argv[1]
lat = []
for i in range(2000):
    p = os.path.join(base, f"f{i:04d}")
    t = time.perf_counter()
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"x")
    os.close(fd)
    lat.append((time.perf_counter() - t) * 1000)
print(f"{statistics.median(lat):.4f}")'
make_files='import os, sys
for i in range(2000):
    with open(os.path.join(sys.argv[1], f"f{i:04d}"), "w") as f:
        f.write("small file\n" * 10)'
mkdir -p "$W/native"
python3 -c "$make_files" "$W/native"
sync
native=$(python3 -c "$first_write" "$W/native")
row "first_write_native" "$native ms" "-" "-" "(plain directory on the same disk)"
# The modes `mount --help` lists ("- strict: ..." lines under --durability), default last.
modes=$("$BIN" mount --help | awk '/--durability/ { on = 1; next } on && /^ *--/ { on = 0 }
    on && /^ *- [a-z]+:/ { sub(/^ *- /, ""); sub(/:.*/, ""); printf "%s ", $0 }')
modes="${modes}default"
for mode in $modes; do
    SRC=$W/fw-$mode-src STATE=$W/fw-$mode-state
    mkdir -p "$SRC"
    python3 -c "$make_files" "$SRC"
    sync
    if [[ $mode == default ]]; then
        "$BIN" mount "$SRC" "$MNT" --state-dir "$STATE"
    else
        "$BIN" mount "$SRC" "$MNT" --state-dir "$STATE" --durability "$mode"
    fi
    m=$(python3 -c "$first_write" "$MNT")
    "$BIN" umount "$MNT"
    r=$(awk -v a="$m" -v b="$native" 'BEGIN { printf "%.1f", a / b }')
    row "first_write_$mode" "$m ms" "$native ms" "${r}x" "(Layer 1 backup before the append)"
    [[ $mode == default ]] && verdict "first_write_default" "$r" "<=" 15
    rm -rf "$SRC" "$STATE"
done
fi

if wanted first_write_after_checkpoint; then
echo
echo "== first write right after a checkpoint: 1,000 untracked 100-byte files in 10 directories, $ROUNDS alternating rounds"
# Ten directories of 100 files of 100 bytes, all different (each backup stores new content),
# made in SRC directly: untracked, and unknown to the kernel's caches, as a checkout or an
# unpacked tree is before the agent's first edits.
# With a second argument, every file also gets a second hard link in that directory, as
# pnpm's content-addressed store gives each file in node_modules (issue 28: first writes
# on such a tree cost <= 1.2x the single-link case).
make_tree='import os, sys
for d in range(10):
    os.makedirs(os.path.join(sys.argv[1], f"d{d}"))
    for i in range(100):
        p = os.path.join(sys.argv[1], f"d{d}", f"f{i:03d}")
        with open(p, "w") as f:
            f.write(f"{d}/{i} ".ljust(99, "x") + "\n")
        if len(sys.argv) > 2:
            os.makedirs(sys.argv[2], exist_ok=True)
            os.link(p, os.path.join(sys.argv[2], f"{d}-{i:03d}"))'
# The median microseconds of one append per file: open O_WRONLY|O_APPEND, write a line, close.
append_once='import os, statistics, sys, time
lat = []
for d in range(10):
    for i in range(100):
        p = os.path.join(sys.argv[1], f"d{d}", f"f{i:03d}")
        t = time.perf_counter()
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"appended\n")
        os.close(fd)
        lat.append((time.perf_counter() - t) * 1e6)
print(f"{statistics.median(lat):.1f}")'
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
declare -A fwc=() fwc_ratios=()
strict_max=0
SRC=$W/fwc-src STATE=$W/fwc-state
for round in $(seq "$ROUNDS"); do
    for mode in native default linked_in linked_out strict; do
        rm -rf "$SRC" "$STATE" "$W/fwc-store"
        mkdir -p "$SRC"
        case $mode in
            # The second names inside SRC (a store in the project), never looked up.
            linked_in) python3 -c "$make_tree" "$SRC" "$SRC/.store" ;;
            # The second names outside SRC (pnpm's global store), never seen by the mount.
            linked_out) python3 -c "$make_tree" "$SRC" "$W/fwc-store" ;;
            *) python3 -c "$make_tree" "$SRC" ;;
        esac
        sync
        if [[ $mode == native ]]; then
            us=$(python3 -c "$append_once" "$SRC")
            native_us=$us
        else
            args=()
            [[ $mode == strict ]] && args=(--durability strict)
            "$BIN" mount "$SRC" "$MNT" --state-dir "$STATE" "${args[@]}"
            echo "before-the-edits" > "$MNT/.checkpoint/ctl"
            us=$(python3 -c "$append_once" "$MNT")
            # The kernel sends the last RELEASEs after close() returns: retry a busy unmount.
            for try in 1 2 3 4 5; do
                "$BIN" umount "$MNT" 2>/dev/null && break
                [[ $try == 5 ]] && "$BIN" umount "$MNT"
                sleep 0.5
            done
            fwc_ratios[$mode]+="$(awk -v a="$us" -v b="$native_us" 'BEGIN { printf "%.1fx ", a / b }')"
            if [[ $mode == strict ]]; then
                stats=$(grep -o 'layer 1 ([a-z]* durability):.*' "$STATE/daemon.log" | tail -1)
                m=$(sed -n 's/.* at most \([0-9]*\) per backup.*/\1/p' <<<"$stats")
                (( ${m:-99} > strict_max )) && strict_max=${m:-99}
                fwc[strict_stats]=${stats#*: }
            fi
        fi
        fwc[$mode]+="$us "
    done
done
rm -rf "$SRC" "$STATE" "$W/fwc-store"
native_med=$(median <<<"${fwc[native]}")
row "first_write_ckpt_native" "$native_med us" "-" "-" "(plain directory; rounds: ${fwc[native]% })"
for mode in default strict; do
    med=$(median <<<"${fwc[$mode]}")
    r=$(awk -v a="$med" -v b="$native_med" 'BEGIN { printf "%.1f", a / b }')
    row "first_write_ckpt_$mode" "$med us" "$native_med us" "${r}x" "(rounds: ${fwc[$mode]% }; ratios ${fwc_ratios[$mode]% })"
    [[ $mode == default ]] && verdict "first_write_ckpt_default" "$r" "<=" 15
done
default_med=$(median <<<"${fwc[default]}")
for mode in linked_in linked_out; do
    med=$(median <<<"${fwc[$mode]}")
    r=$(awk -v a="$med" -v b="$default_med" 'BEGIN { printf "%.2f", a / b }')
    row "first_write_ckpt_$mode" "$med us" "$default_med us" "${r}x" "(every file with a second link ${mode#linked_}side SRC, against the single-link default; rounds: ${fwc[$mode]% })"
    verdict "first_write_ckpt_${mode}_vs_single_link" "$r" "<=" 1.2
done
row "first_write_ckpt_strict_syncs" "$strict_max" "1" "-" "(most syncs one backup made; last round: ${fwc[strict_stats]})"
verdict "first_write_ckpt_strict_syncs_per_backup" "$strict_max" "<=" 1
fi

if wanted store; then
echo
echo "== store bytes against the distinct contents it holds"
SRC=$W/store-src STATE=$W/store-state
mkdir -p "$SRC" "$W/pre"
python3 - "$SRC" <<'PY'
import os, sys
base = sys.argv[1]
for i in range(200):
    with open(os.path.join(base, f"f{i:03d}"), "wb") as f:
        f.write(os.urandom(16384) if i % 2 else b"same content\n" * 1000)
with open(os.path.join(base, "sparse"), "wb") as f:
    f.truncate(256 << 20)
    f.seek(128 << 20)
    f.write(b"data")
PY
cp -a --sparse=always "$SRC/." "$W/pre/"
"$BIN" mount "$SRC" "$MNT" --state-dir "$STATE"
python3 - "$MNT" <<'PY'
import os, sys
base = sys.argv[1]
for i in range(200):
    with open(os.path.join(base, f"f{i:03d}"), "ab") as f:
        f.write(b"!")
with open(os.path.join(base, "sparse"), "r+b") as f:
    f.seek(64 << 20)
    f.write(b"x")
PY
echo store > "$MNT/.checkpoint/ctl"
"$BIN" umount "$MNT"
# The history holds each file's pre-image (W/pre) and its content at the checkpoint (SRC now):
# the distinct contents of both are what the store must hold, and no more.
read -r store_alloc unique_alloc < <(python3 - "$STATE/backups" "$W/pre" "$SRC" <<'PY'
import hashlib, os, re, sys
store, dirs = sys.argv[1], sys.argv[2:]
# Object files and packs (scripts/lib/store-objects.py lists what they hold).
alloc = sum(os.stat(os.path.join(store, n)).st_blocks * 512
            for n in os.listdir(store) if re.fullmatch(r"[0-9a-f]{64}|pack-[0-9]{8}", n))
seen, unique = set(), 0
for p in (os.path.join(d, n) for d in dirs for n in sorted(os.listdir(d))):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.digest() not in seen:
        seen.add(h.digest())
        unique += os.stat(p).st_blocks * 512
print(alloc, unique)
PY
)
r=$(awk -v a="$store_alloc" -v b="$unique_alloc" 'BEGIN { printf "%.2f", a / b }')
row "store_bytes" "$store_alloc B" "$unique_alloc B" "${r}x" "(allocated, against the distinct pre-images and checkpointed contents; 200 files, half identical, + a 256 MiB sparse file)"
verdict "store_bytes" "$r" "<=" 1.0
fi

if wanted depth; then
echo
echo "== a create at the bottom of a deep tree: depth 5,000 against 2,500 (200 creates each, interleaved)"
# scripts/lib/create-at-depth.py makes the chains and times the creates.
deep_py=$ROOT/scripts/lib/create-at-depth.py
for depth in 2500 5000; do
    mkdir -p "$W/deep-native-$depth" "$W/deep-$depth-src" "$W/deep-$depth-mnt"
    python3 "$deep_py" chain "$W/deep-native-$depth" "$depth"
    python3 "$deep_py" chain "$W/deep-$depth-src" "$depth"
done
read -r native_2500 _ _ native_5000 _ _ < <(python3 "$deep_py" create 20 "$W/deep-native-2500" 2500 "$W/deep-native-5000" 5000)
for depth in 2500 5000; do
    "$BIN" mount "$W/deep-$depth-src" "$W/deep-$depth-mnt" --state-dir "$W/deep-$depth-state"
done
read -r mnt_2500 cpu_2500 _ mnt_5000 cpu_5000 _ < <(python3 "$deep_py" create 20 \
    "$W/deep-2500-mnt" 2500 "$W/deep-5000-mnt" 5000 \
    "$(cat "$W/deep-2500-state/daemon.pid")" "$(cat "$W/deep-5000-state/daemon.pid")")
for depth in 2500 5000; do
    "$BIN" umount "$W/deep-$depth-mnt"
done
bytes_2500=$(( $(transcript_bytes "$W/deep-2500-state") / 200 ))
bytes_5000=$(( $(transcript_bytes "$W/deep-5000-state") / 200 ))
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
row "create_at_depth_2500" "$mnt_2500 ms" "$native_2500 ms" "$(ratio "$mnt_2500" "$native_2500")x" "(against native at the same depth; daemon CPU $cpu_2500 ms, $bytes_2500 B of transcript per create)"
row "create_at_depth_5000" "$mnt_5000 ms" "$native_5000 ms" "$(ratio "$mnt_5000" "$native_5000")x" "(against native at the same depth; daemon CPU $cpu_5000 ms, $bytes_5000 B of transcript per create)"
time_ratio=$(ratio "$mnt_5000" "$mnt_2500")
cpu_ratio=$(ratio "$cpu_5000" "$cpu_2500")
bytes_ratio=$(ratio "$bytes_5000" "$bytes_2500")
row "create_depth_5000_vs_2500" "${time_ratio}x" "2.2x" "-" "(median wall time; native: $(ratio "$native_5000" "$native_2500")x)"
row "create_cpu_depth_5000_vs_2500" "${cpu_ratio}x" "2.2x" "-" "(the daemon's CPU time per create)"
row "transcript_depth_5000_vs_2500" "${bytes_ratio}x" "2.2x" "-" "(the record names the path: linear)"
verdict "create_depth_5000_vs_2500" "$time_ratio" "<=" 2.2
verdict "create_cpu_depth_5000_vs_2500" "$cpu_ratio" "<=" 2.2
verdict "transcript_depth_5000_vs_2500" "$bytes_ratio" "<=" 2.2
rm -rf "$W"/deep-*
fi

echo
[[ $QUICK == 1 ]] && echo "bench-scale: --quick sizes: the bars are indicative only"
echo "bench-scale: $FAILS bar(s) failed"
