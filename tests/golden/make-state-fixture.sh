#!/usr/bin/env bash
# Writes tests/golden/state-8a7cd74.tar.gz: a state dir (and its SRC, unmounted) as the
# build at 8a7cd74 leaves it after the session below. Kept for the record of how the
# fixture was made; tests/golden.rs mounts it with the current build and checks that it
# logs, diffs, browses and rewinds exactly as before. Run as root:
#   tests/golden/make-state-fixture.sh path/to/checkpointfs-at-8a7cd74
set -euo pipefail
BIN=$(realpath "$1")
OUT=$(cd "$(dirname "$0")" && pwd)/state-8a7cd74.tar.gz
W=$(mktemp -d)
trap '"$BIN" umount "$W/mnt" 2>/dev/null || true; rm -rf "$W"' EXIT
mkdir -p "$W/src/sub/deep" "$W/mnt"
mkdir -m 700 "$W/state"
cd "$W/src"
printf 'alpha\nbeta\n' > a.txt
printf 'x\ny\n' > old.txt
printf '\000\001\002\003' > bin.dat
printf 'echo hi\n' > run.sh
printf 'unchanged\n' > sub/keep.txt
printf 'deep\n' > sub/deep/d.txt
head -c 300000 /dev/zero | tr '\0' 'z' > big.txt   # too big for a pack: a loose object
ln -s a.txt link
mkfifo fifo
cd "$W"
export XDG_CONFIG_HOME=$W/config
"$BIN" mount "$W/src" "$W/mnt" --state-dir "$W/state"
cd "$W/mnt"
echo m1 > .checkpoint/ctl
printf 'ALPHA\nbeta\ngamma\n' > a.txt
rm old.txt
chmod 755 run.sh
ln -sfn sub/keep.txt link
printf '\000\001\002\003\004\005' > bin.dat
mkdir newdir && printf 'new\n' > newdir/n.txt
mv sub/deep sub/moved
echo zz >> big.txt
echo m2 > .checkpoint/ctl
sed -i 's/beta/BETA/' a.txt
rm -r newdir
truncate -s 10 big.txt
echo m3 > .checkpoint/ctl
printf 'after m3\n' >> a.txt
cd "$W"
"$BIN" rewind "$W/mnt" m2 -- a.txt
printf 'live\n' > "$W/mnt/live.txt"
"$BIN" umount "$W/mnt"
rm -f "$W/state/daemon.log"
tar -czf "$OUT" --numeric-owner -C "$W" state src
echo "wrote $OUT"
