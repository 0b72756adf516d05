#!/usr/bin/env bash
# scripts/install-test-deps.sh — installs what the tests need when it is missing
# (Debian packages, pjdfstest, fsx and cargo-fuzz, xfstests built from the pinned source in
# ../shared/xfstests, the suites' dummy users, a git identity).
# Idempotent; called by scripts/test.sh, so the README's test command is all the set-up
# a fresh machine needs. Needs root for apt-get and useradd.
set -euo pipefail
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    cat <<'EOF'
usage: scripts/install-test-deps.sh   (installs missing test prerequisites; idempotent)

Environment: XFSTESTS_TARBALL (default: the first of ../shared/xfstests/xfstests-63a29724.tar.gz
  and ../../shared/... relative to the repo; without it and without a built cache the script
  fails unless CPFS_XFSTESTS=0, as scripts/test.sh then skips xfstests), XFSTESTS_DIR (build cache, default
  /var/tmp/checkpointfs-xfstests; the built tree is $XFSTESTS_DIR/63a29724/xfstests).
EOF
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
    [jq]=jq [git]=git [python3]=python3 [e2fsprogs]=mkfs.ext4 [man-db]=man [tmux]=tmux
    [attr]=setfattr [acl]=setfacl [libcap2-bin]=setcap [linux-perf]=perf
)
missing=()
for p in "${!PKG_CMD[@]}"; do
    command -v "${PKG_CMD[$p]}" >/dev/null 2>&1 || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    say "installing Debian packages (missing: ${missing[*]})"
    apt-get update -q || say "warning: apt-get update failed"
    apt-get install -y -q fio btrfs-progs xfsprogs fuse3 jq git python3 e2fsprogs man-db tmux \
        attr acl libcap2-bin linux-perf \
        || say "warning: apt-get install failed"
    for p in "${!PKG_CMD[@]}"; do
        command -v "${PKG_CMD[$p]}" >/dev/null 2>&1 \
            || { echo "ci: ERROR: ${PKG_CMD[$p]} (package $p) is still missing" >&2; exit 1; }
    done
fi
# xfstests' build and run-time deps (no command to probe for the -dev packages: ask dpkg)
XFSTESTS_PKGS=(build-essential autoconf automake libtool libtool-bin pkg-config uuid-dev
    uuid-runtime libattr1-dev libacl1-dev libaio-dev liburing-dev libcap-dev xfsprogs
    xfslibs-dev libgdbm-dev libgdbm-compat-dev libssl-dev gawk bc attr acl psmisc quota
    e2fsprogs fio perl sed)
missing=()
for p in "${XFSTESTS_PKGS[@]}"; do
    [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    say "installing xfstests' Debian packages (missing: ${missing[*]})"
    apt-get update -q || say "warning: apt-get update failed"
    apt-get install -y -q --no-install-recommends "${XFSTESTS_PKGS[@]}" \
        || { echo "ci: ERROR: apt-get install ${missing[*]} failed" >&2; exit 1; }
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

# ---- cargo-fuzz for scripts/fuzz.sh (pinned, from crates.io) ---------------------------
# No nightly toolchain: scripts/fuzz.sh builds with the stable one and RUSTC_BOOTSTRAP=1.
# libfuzzer-sys compiles libFuzzer with the C++ compiler (build-essential, above).
CARGO_FUZZ_VERSION=0.13.2
if [[ $(cargo fuzz --version 2>/dev/null) != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
    say "cargo install --locked cargo-fuzz@$CARGO_FUZZ_VERSION"
    cargo install --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION" \
        || { echo "ci: ERROR: cargo install --locked cargo-fuzz --version $CARGO_FUZZ_VERSION failed (needs crates.io); scripts/fuzz.sh (scripts/test.sh step 5) needs it" >&2; exit 1; }
    [[ $(cargo fuzz --version 2>/dev/null) == "cargo-fuzz $CARGO_FUZZ_VERSION" ]] \
        || { echo "ci: ERROR: after cargo install, 'cargo fuzz --version' says '$(cargo fuzz --version 2>&1)', not cargo-fuzz $CARGO_FUZZ_VERSION" >&2; exit 1; }
fi
command -v c++ >/dev/null 2>&1 \
    || { echo "ci: ERROR: no C++ compiler (c++): libfuzzer-sys needs one to build libFuzzer for scripts/fuzz.sh (apt-get install g++)" >&2; exit 1; }

# ---- xfstests (pinned source from ../shared, built once into a cache outside the repo) ---
# The tree is built from the tarball as is; tests/posix/xfstests-fuse.patch (the FSTYP=fuse
# glue, shell only) is applied on top, and re-applied to pristine copies of the files it
# touches whenever the patch changes, so editing it needs no rebuild.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
XFSTESTS_REV=63a29724
XFSTESTS_PATCH=$ROOT/tests/posix/xfstests-fuse.patch
if [[ -z ${XFSTESTS_TARBALL:-} ]]; then
    for c in "$ROOT/../shared/xfstests" "$ROOT/../../shared/xfstests"; do
        if [[ -f $c/xfstests-$XFSTESTS_REV.tar.gz ]]; then
            XFSTESTS_TARBALL=$c/xfstests-$XFSTESTS_REV.tar.gz
            break
        fi
    done
fi
XFSTESTS_DIR=${XFSTESTS_DIR:-/var/tmp/checkpointfs-xfstests}
XT=$XFSTESTS_DIR/$XFSTESTS_REV/xfstests
if [[ ! -f $XT/.cpfs-built ]]; then
    if [[ -z ${XFSTESTS_TARBALL:-} || ! -f $XFSTESTS_TARBALL ]]; then
        # scripts/test.sh runs xfstests (step 8) unless CPFS_XFSTESTS=0: without the source,
        # say so now rather than fail there.
        [[ ${CPFS_XFSTESTS:-1} == 0 ]] || {
            echo "ci: ERROR: xfstests source not found: ../shared/xfstests/xfstests-$XFSTESTS_REV.tar.gz beside the repository (or set XFSTESTS_TARBALL); CPFS_XFSTESTS=0 runs the tests without xfstests" >&2
            exit 1
        }
        say "warning: xfstests source not found (../shared/xfstests/xfstests-$XFSTESTS_REV.tar.gz beside the repo, or set XFSTESTS_TARBALL); scripts/posix-suites.sh will refuse to run xfstests"
    else
        say "building xfstests $XFSTESTS_REV from $XFSTESTS_TARBALL into $XT"
        rm -rf -- "$XFSTESTS_DIR/$XFSTESTS_REV"
        mkdir -p "$XFSTESTS_DIR/$XFSTESTS_REV"
        tar xzf "$XFSTESTS_TARBALL" -C "$XFSTESTS_DIR/$XFSTESTS_REV"
        [[ -x $XT/check ]] || { echo "ci: ERROR: $XFSTESTS_TARBALL has no xfstests/check" >&2; exit 1; }
        if ! make -C "$XT" -j"$(nproc)" > "$XT/.cpfs-build.log" 2>&1; then
            tail -n 40 "$XT/.cpfs-build.log" >&2
            echo "ci: ERROR: building xfstests failed (full log $XT/.cpfs-build.log)" >&2
            exit 1
        fi
        cp -- "$XFSTESTS_TARBALL" "$XT/.cpfs-source.tar.gz"   # pristine files for re-patching
        touch "$XT/.cpfs-built"
        say "built xfstests"
    fi
fi
if [[ -f $XT/.cpfs-built ]]; then
    want=$(sha256sum < "$XFSTESTS_PATCH" | cut -d' ' -f1)
    if [[ $(cat "$XT/.cpfs-patched" 2>/dev/null) != "$want" ]]; then
        mapfile -t pfiles < <(sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "$XFSTESTS_PATCH")
        if [[ ${#pfiles[@]} -gt 0 ]]; then
            tar xzf "$XT/.cpfs-source.tar.gz" -C "$XT/.." "${pfiles[@]/#/xfstests/}"
            patch -d "$XT" -p1 --forward --no-backup-if-mismatch -s < "$XFSTESTS_PATCH" \
                || { echo "ci: ERROR: $XFSTESTS_PATCH does not apply to xfstests $XFSTESTS_REV" >&2; exit 1; }
        fi
        echo "$want" > "$XT/.cpfs-patched"
        say "applied $(basename "$XFSTESTS_PATCH") to $XT (${pfiles[*]})"
    fi
fi

# ---- xfstests' optional users (tests needing them are "not run" without) -------------
for u in fsgqa fsgqa2 123456-fsgqa; do
    getent passwd "$u" >/dev/null || useradd -m "$u" 2>/dev/null \
        || say "warning: could not create user $u"
done
getent group fsgqa >/dev/null || groupadd fsgqa 2>/dev/null || true

# ---- pjdfstest's second dummy user ------------------------------------------------------
if ! getent passwd pjdtests >/dev/null; then
    getent group pjdtests >/dev/null || groupadd --system pjdtests
    useradd --system --no-create-home --gid pjdtests --shell /usr/sbin/nologin pjdtests
fi

# ---- Claude Code CLI for tests/it/agent_claude_code.rs (pinned, from the npm registry) -----
# Installed outside the repo, in $CLAUDE_CODE_DIR (environment; the test reads it too); the
# test runs $CLAUDE_CODE_DIR/node_modules/.bin/claude with telemetry, updates and every
# non-loopback connection off, against tests/agents/mock_anthropic.py.
CLAUDE_CODE_VERSION=2.1.332
CLAUDE_CODE_DIR=${CLAUDE_CODE_DIR:-/var/tmp/checkpointfs-agents/claude-code}
# npm_version DIR PKG: the version of npm package PKG installed under DIR, or nothing.
npm_version() {
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' \
        "$1/node_modules/$2/package.json" 2>/dev/null || true
}

# npm_install_pinned DIR PKG VERSION NEEDED_BY: npm install PKG@VERSION into DIR (outside the
# repository), or a clear error naming the test that needs it.
npm_install_pinned() {
    local dir=$1 pkg=$2 version=$3 needed_by=$4 have
    command -v npm >/dev/null 2>&1 && command -v node >/dev/null 2>&1 \
        || { echo "ci: ERROR: node/npm are missing (apt-get install nodejs npm); $needed_by needs them for $pkg" >&2; return 1; }
    have=$(npm_version "$dir" "$pkg")
    say "npm install $pkg@$version into $dir${have:+ (had $have)}"
    mkdir -p -- "$dir"
    if ! (cd "$dir" && npm install --no-audit --no-fund --prefix "$dir" "$pkg@$version"); then
        echo "ci: ERROR: npm install $pkg@$version failed (needs the npm registry); $needed_by needs it" >&2
        return 1
    fi
}

install_claude_code() {
    if [[ $(npm_version "$CLAUDE_CODE_DIR" @anthropic-ai/claude-code) == "$CLAUDE_CODE_VERSION" \
        && -x $CLAUDE_CODE_DIR/node_modules/.bin/claude ]]; then
        return 0
    fi
    npm_install_pinned "$CLAUDE_CODE_DIR" @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" \
        tests/it/agent_claude_code.rs || return 1
    # The package's postinstall puts the native binary in place of a stub: check it runs.
    # An npm that skipped the install script (allowScripts) gets it run here, once.
    local home out
    home=$(mktemp -d)
    out=$(DISABLE_AUTOUPDATER=1 HOME=$home "$CLAUDE_CODE_DIR/node_modules/.bin/claude" --version </dev/null 2>&1) || true
    if [[ $out != "$CLAUDE_CODE_VERSION "* ]]; then
        say "claude --version says '$out': running the package's postinstall (node install.cjs)"
        (cd "$CLAUDE_CODE_DIR/node_modules/@anthropic-ai/claude-code" && node install.cjs) || true
        out=$(DISABLE_AUTOUPDATER=1 HOME=$home "$CLAUDE_CODE_DIR/node_modules/.bin/claude" --version </dev/null 2>&1) || true
    fi
    rm -rf -- "$home"
    if [[ $out != "$CLAUDE_CODE_VERSION "* ]]; then
        echo "ci: ERROR: $CLAUDE_CODE_DIR/node_modules/.bin/claude --version says '$out', not $CLAUDE_CODE_VERSION, after npm install" >&2
        return 1
    fi
}
install_claude_code || exit 1

# ---- git identity for tests that commit ------------------------------------------------
# Env vars for git(1); a global config too, only when none is set (libgit2 reads no env).
export GIT_AUTHOR_NAME=${GIT_AUTHOR_NAME:-checkpointfs-ci}
export GIT_AUTHOR_EMAIL=${GIT_AUTHOR_EMAIL:-ci@checkpointfs.invalid}
export GIT_COMMITTER_NAME=${GIT_COMMITTER_NAME:-$GIT_AUTHOR_NAME}
export GIT_COMMITTER_EMAIL=${GIT_COMMITTER_EMAIL:-$GIT_AUTHOR_EMAIL}
git config --global user.name >/dev/null 2>&1 || git config --global user.name "$GIT_AUTHOR_NAME"
git config --global user.email >/dev/null 2>&1 || git config --global user.email "$GIT_AUTHOR_EMAIL"


# ---- Gemini CLI for tests/it/agent_gemini_cli.rs (pinned, from the npm registry) -----------
# Installed outside the repo into $GEMINI_CLI_DIR (default /var/tmp/checkpointfs-agents/
# gemini-cli; the test reads the same variable); the test runs its node_modules/.bin/gemini
# with telemetry, updates and every non-loopback connection off, against
# tests/agents/mock_gemini.py. Needs node >= 20 and npm.
GEMINI_CLI_VERSION=0.61.0
GEMINI_CLI_DIR=${GEMINI_CLI_DIR:-/var/tmp/checkpointfs-agents/gemini-cli}
install_gemini_cli() {
    local node_major
    if [[ $(npm_version "$GEMINI_CLI_DIR" @google/gemini-cli) == "$GEMINI_CLI_VERSION" \
        && -x $GEMINI_CLI_DIR/node_modules/.bin/gemini ]]; then
        return 0
    fi
    node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) || node_major=0
    if (( node_major < 20 )); then
        echo "ci: ERROR: @google/gemini-cli@$GEMINI_CLI_VERSION needs node >= 20, this is $(node --version 2>&1)" >&2
        return 1
    fi
    npm_install_pinned "$GEMINI_CLI_DIR" @google/gemini-cli "$GEMINI_CLI_VERSION" \
        tests/it/agent_gemini_cli.rs || return 1
    # Check it runs (a throwaway HOME: nothing of the machine's user is read or written).
    local home out
    home=$(mktemp -d)
    out=$(HOME=$home "$GEMINI_CLI_DIR/node_modules/.bin/gemini" --version </dev/null 2>&1) || true
    rm -rf -- "$home"
    if [[ $out != "$GEMINI_CLI_VERSION" ]]; then
        echo "ci: ERROR: $GEMINI_CLI_DIR/node_modules/.bin/gemini --version says '$out', not $GEMINI_CLI_VERSION, after npm install" >&2
        return 1
    fi
}
install_gemini_cli || exit 1


# ---- Garage for tests/it/remote.rs (pinned, from crates.io) ----------------------------------
# A real 3-node S3-compatible cluster (tests/it/common/garage.rs starts it on 127.0.0.1). Built
# once into a cache outside the repo; skipped when the binary is there. The uncached build
# takes ~15-25 min on 2 cores (issue 29 allows 18 min of CI for all of this): lmdb only, no
# sqlite/k2v/telemetry, its C libraries bundled (no system packages needed).
GARAGE_VERSION=2.5.0
GARAGE_ROOT=/var/cache/checkpointfs-test/garage-$GARAGE_VERSION
install_garage() {
    [[ -x $GARAGE_ROOT/bin/garage ]] && return 0
    local started=$SECONDS
    mkdir -p "$GARAGE_ROOT"
    nice -n 15 env CARGO_TARGET_DIR=/var/tmp/target-garage cargo install --locked garage \
        --version "$GARAGE_VERSION" --no-default-features --features bundled-libs,lmdb \
        --root "$GARAGE_ROOT" || return 1
    echo "ci: built garage $GARAGE_VERSION in $((SECONDS - started)) s"
}
install_garage || exit 1
