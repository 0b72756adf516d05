//! `diff` streams (issue 28, item 8): a 4 GiB sparse file, which costs its maker no disk,
//! is compared in bounded memory, holes skipped, and reported as large with the number of
//! bytes that differ. Before, the daemon read both versions whole (8.4 GB RSS) and a memory
//! cgroup killed it.
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::common::{TestMount, checkpoint, cli, process_alive, stderr, stdout};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A process's peak resident set (VmHWM), in bytes.
fn peak_rss(pid: i32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Starts a new peak: VmHWM becomes the current RSS (`clear_refs` 5, Linux 4.0).
fn reset_peak_rss(pid: i32) {
    fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
}

/// A memory cgroup that a process is moved into, with a hard limit and no swap; the
/// process is moved back and the cgroup removed on drop. cgroup v2 where its memory
/// controller is available, else v1's memory hierarchy (hybrid hosts, as this CI's VM).
struct MemoryCgroup {
    dir: PathBuf,
    /// Where the process was: its cgroup's `cgroup.procs`.
    home: PathBuf,
    pid: i32,
    v2: bool,
}

impl MemoryCgroup {
    fn limit(pid: i32, bytes: u64) -> Option<MemoryCgroup> {
        let name = format!("checkpointfs-test-{}", std::process::id());
        let own = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let v2_root = Path::new("/sys/fs/cgroup");
        let v2 = fs::read_to_string(v2_root.join("cgroup.controllers"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
        let (parent, home) = if v2 {
            let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?;
            // Enabling the controller for the root's children: harmless if it already is.
            let _ = fs::write(v2_root.join("cgroup.subtree_control"), "+memory");
            (
                v2_root.to_path_buf(),
                v2_root.join(rel.trim_start_matches('/')),
            )
        } else {
            let rel = own.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "memory")
                    .then_some(path)
            })?;
            let root = Path::new("/sys/fs/cgroup/memory");
            let home = root.join(rel.trim_start_matches('/'));
            (home.clone(), home)
        };
        let dir = parent.join(name);
        fs::create_dir(&dir).ok()?;
        let group = MemoryCgroup {
            dir,
            home: home.join("cgroup.procs"),
            pid,
            v2,
        };
        let set = |file: &str, value: &str| fs::write(group.dir.join(file), value);
        if v2 {
            set("memory.max", &bytes.to_string()).ok()?;
            let _ = set("memory.swap.max", "0");
        } else {
            set("memory.limit_in_bytes", &bytes.to_string()).ok()?;
            let _ = set("memory.memsw.limit_in_bytes", &bytes.to_string());
        }
        set("cgroup.procs", &pid.to_string()).ok()?;
        Some(group)
    }

    /// How many times the kernel's OOM killer killed a process of the cgroup.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        if process_alive(self.pid) {
            let _ = fs::write(&self.home, self.pid.to_string());
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

#[test]
fn diff_of_a_4_gib_sparse_file_runs_in_bounded_memory() {
    let mut m = TestMount::unmounted(&[]);
    let path = m.src.join("big.bin");
    let f = fs::File::create(&path).unwrap();
    f.set_len(4 * GIB).unwrap();
    for at in [0, GIB, 3 * GIB] {
        f.write_all_at(&[0x11; 4096], at).unwrap();
    }
    drop(f);
    m.mount();
    checkpoint(&m, "m1");
    // 100 bytes changed in a data block, and a block of data where a hole was.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.mnt.join("big.bin"))
        .unwrap();
    f.write_all_at(&[0x22; 100], GIB + 10).unwrap();
    f.write_all_at(&[0x33; 4096], 2 * GIB).unwrap();
    drop(f);
    let changed = 100 + 4096;
    let pid = m.pid().expect("daemon pid");
    let mnt = m.mnt.to_str().unwrap();

    // The bound, then a memory cgroup of 128 MiB around the daemon, where there is one.
    let mut growth = Vec::new();
    let cgroup = MemoryCgroup::limit(pid, 128 * MIB);
    match &cgroup {
        Some(c) => eprintln!(
            "the daemon runs in memory cgroup {} (v{}), limit 128 MiB",
            c.dir.display(),
            if c.v2 { 2 } else { 1 }
        ),
        None => eprintln!("no writable memory cgroup here: only the VmHWM bound is checked"),
    }
    reset_peak_rss(pid);
    let start = peak_rss(pid);

    let out = cli(&["diff", mnt, "m1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "Large files a/big.bin and b/big.bin differ: {changed} bytes changed"
        )),
        "{text}"
    );
    growth.push(peak_rss(pid) - start);

    let out = cli(&["diff", mnt, "m1", "--stat"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains(&format!("big.bin | large, {changed} bytes changed")),
        "{text}"
    );

    let out = cli(&["diff", mnt, "m1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let file = &doc["files"][0];
    assert_eq!(file["path"], "big.bin");
    assert_eq!(file["content"], "large");
    assert_eq!(file["bytes_changed"], changed);
    assert_eq!(file["after"]["size"], 4 * GIB);
    assert!(file["after"]["sha256"].is_string(), "{file}");

    // --full: a sparse file is not text (its holes read as NUL), so still no line diff and
    // no reading it whole.
    let out = cli(&["diff", mnt, "m1", "--json", "--full"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["files"][0]["content"], "binary");
    growth.push(peak_rss(pid) - start);

    assert!(process_alive(pid), "the daemon died");
    if let Some(cgroup) = &cgroup {
        assert_eq!(cgroup.oom_kills(), 0);
    }
    let worst = *growth.iter().max().unwrap();
    eprintln!(
        "daemon peak RSS growth over the diffs: {} KiB",
        worst / 1024
    );
    assert!(worst <= 64 * MIB, "peak RSS grew by {worst} bytes");
}
