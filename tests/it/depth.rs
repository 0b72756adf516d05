//! Deep trees (issue 28, item 11): what a create costs must not grow faster than the depth.
use std::path::Path;

use crate::common::{self, TestMount};

/// `python3 scripts/lib/create-at-depth.py ARGS` (shared with scripts/bench-scale.sh),
/// asserting success; returns its output's fields.
fn create_at_depth(args: &[&str]) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/lib/create-at-depth.py");
    let mut argv = vec![script.to_str().unwrap()];
    argv.extend_from_slice(args);
    let out = common::run("python3", &argv, Path::new("/"));
    assert!(out.status.success(), "{args:?}: {}", common::stderr(&out));
    common::stdout(&out)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// At depth 5,000 a create cost the daemon 171 ms of CPU, 6× its cost at depth 2,500: the
/// path of a directory too deep for the kernel to spell was built by asking the kernel to
/// spell each ancestor, each time walking that ancestor's whole chain. Linear is ≤ 2×
/// (plus what the longer walk costs in caches; 2.0–2.6× seen on a loaded machine): the
/// bound leaves room for that and still fails a quadratic cost. The daemon's own CPU time
/// is measured (`/proc/PID/task/*/schedstat`), not wall time, which on a busy machine is
/// mostly waiting for a CPU; both depths are created at in alternating batches.
#[test]
fn a_create_costs_the_daemon_cpu_linear_in_the_depth() {
    let mut shallow = TestMount::unmounted(&[]);
    let mut deep = TestMount::unmounted(&[]);
    create_at_depth(&["chain", shallow.src.to_str().unwrap(), "2500"]);
    create_at_depth(&["chain", deep.src.to_str().unwrap(), "5000"]);
    shallow.mount();
    deep.mount();
    let pid = |m: &TestMount| m.pid().expect("the daemon's pid").to_string();
    let (shallow_pid, deep_pid) = (pid(&shallow), pid(&deep));
    let out = create_at_depth(&[
        "create",
        "6",
        shallow.mnt.to_str().unwrap(),
        "2500",
        deep.mnt.to_str().unwrap(),
        "5000",
        &shallow_pid,
        &deep_pid,
    ]);
    // Per depth: median ms, the daemon's CPU ms per create, files listed at the bottom.
    assert_eq!([&out[2], &out[5]], ["60", "60"], "files listed: {out:?}");
    let cpu = |i: usize| out[i].parse::<f64>().unwrap();
    let ratio = cpu(4) / cpu(1);
    assert!(
        ratio <= 3.5,
        "a create cost the daemon {} ms of CPU at depth 2,500 and {} ms at 5,000: {ratio:.2}x",
        out[1],
        out[4]
    );
}
