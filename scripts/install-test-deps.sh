#!/usr/bin/env bash
# scripts/install-test-deps.sh — installs what the tests need when it is missing
# (Debian packages, pjdfstest and fsx, pjdfstest's second user, a git identity).
# Idempotent; called by scripts/test.sh, so the README's test command is all the set-up
# a fresh machine needs. Needs root for apt-get and useradd.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: scripts/install-test-deps.sh   (installs missing test prerequisites; idempotent)"
    exit 0
fi
T0=$EPOCHREALTIME
say() { echo "deps: $* ($(awk -v a="$T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }') s)"; }
: "${HOME:=$(getent passwd "$(id -u)" | cut -d: -f6)}"
export HOME
export PATH="$HOME/.cargo/bin:$PATH"

export DEBIAN_FRONTEND=noninteractive
say "checking test prerequisites on $(uname -r), $(nproc) cores, $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"

# ---- Debian packages (only when something is missing) ---------------------------------
# package -> a command it provides
declare -A PKG_CMD=(
    [fio]=fio [btrfs-progs]=mkfs.btrfs [xfsprogs]=mkfs.xfs [fuse3]=fusermount3
    [jq]=jq [git]=git [python3]=python3 [e2fsprogs]=mkfs.ext4
)
missing=()
for p in "${!PKG_CMD[@]}"; do
    command -v "${PKG_CMD[$p]}" >/dev/null 2>&1 || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    say "installing Debian packages (missing: ${missing[*]})"
    apt-get update -q || say "warning: apt-get update failed"
    apt-get install -y -q fio btrfs-progs xfsprogs fuse3 jq git python3 e2fsprogs \
        || say "warning: apt-get install failed"
    for p in "${!PKG_CMD[@]}"; do
        command -v "${PKG_CMD[$p]}" >/dev/null 2>&1 \
            || { echo "ci: ERROR: ${PKG_CMD[$p]} (package $p) is still missing" >&2; exit 1; }
    done
fi
command -v cargo >/dev/null || { echo "ci: ERROR: cargo not found (PATH=$PATH)" >&2; exit 1; }
[[ -c /dev/fuse ]] || modprobe fuse 2>/dev/null || true
[[ -c /dev/fuse ]] || { echo "ci: ERROR: /dev/fuse is missing" >&2; exit 1; }

# ---- external POSIX suites (pinned versions) -------------------------------------------
PJDFSTEST_VERSION=0.2.2
FSX_VERSION=0.3.2
for spec in "pjdfstest:$PJDFSTEST_VERSION" "fsx:$FSX_VERSION"; do
    crate=${spec%%:*} ver=${spec#*:}
    if [[ ! -x $HOME/.cargo/bin/$crate ]]; then
        say "cargo install --locked $crate@$ver"
        cargo install --locked "$crate@$ver"
    fi
done

# ---- pjdfstest's second dummy user ------------------------------------------------------
if ! getent passwd pjdtests >/dev/null; then
    getent group pjdtests >/dev/null || groupadd --system pjdtests
    useradd --system --no-create-home --gid pjdtests --shell /usr/sbin/nologin pjdtests
fi

# ---- git identity for tests that commit ------------------------------------------------
# Env vars for git(1); a global config too, only when none is set (libgit2 reads no env).
export GIT_AUTHOR_NAME=${GIT_AUTHOR_NAME:-checkpointfs-ci}
export GIT_AUTHOR_EMAIL=${GIT_AUTHOR_EMAIL:-ci@checkpointfs.invalid}
export GIT_COMMITTER_NAME=${GIT_COMMITTER_NAME:-$GIT_AUTHOR_NAME}
export GIT_COMMITTER_EMAIL=${GIT_COMMITTER_EMAIL:-$GIT_AUTHOR_EMAIL}
git config --global user.name >/dev/null 2>&1 || git config --global user.name "$GIT_AUTHOR_NAME"
git config --global user.email >/dev/null 2>&1 || git config --global user.email "$GIT_AUTHOR_EMAIL"

