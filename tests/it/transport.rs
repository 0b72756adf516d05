//! Which transport FUSE requests travel over (issue 26): FUSE over io_uring where the kernel
//! offers it (the fuse module's `enable_uring` on) unless `--no-io-uring`, `/dev/fuse`
//! otherwise, with one log line saying why; `status` names the one in use.
use std::fs;
use std::path::Path;

use crate::common::{self, EnableUring, TestMount};

/// Completions on the daemon's io_uring instances so far: the sum of their `CqTail`
/// (/proc/PID/fdinfo of each `anon_inode:[io_uring]` fd). Each request served on the ring
/// completes one command (its entry's fetch), so this counts ring requests.
fn ring_completions(pid: i32) -> u64 {
    let mut total = 0;
    for fd in fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        let Ok(target) = fs::read_link(fd.path()) else {
            continue;
        };
        if target != Path::new("anon_inode:[io_uring]") {
            continue;
        }
        let info = fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        total += info
            .lines()
            .find_map(|l| l.strip_prefix("CqTail:"))
            .map_or(0, |n| n.trim().parse::<u64>().unwrap());
    }
    total
}

/// `getxattr(path, name)` with a 64-byte buffer: the value, or the errno.
fn getxattr(path: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: NUL-terminated strings and a live buffer of the length given.
    let len = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if len < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    Ok(buf[..len as usize].to_vec())
}

/// Requests through the mount that the kernel cannot answer from its caches: getxattr of
/// a name that does not exist (ENODATA), as the round-trip benchmark does.
fn uncached_requests(m: &TestMount, n: usize) {
    let file = m.mnt.join("f");
    for _ in 0..n {
        assert_eq!(getxattr(&file, "user.absent"), Err(libc::ENODATA));
    }
}

fn log_lines(m: &TestMount, needle: &str) -> usize {
    m.daemon_log()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

#[test]
fn the_default_mount_uses_io_uring_where_offered_and_no_io_uring_does_not() {
    let _on = EnableUring::set(true);
    let m = TestMount::unmounted(&[]);
    fs::write(m.src.join("f"), b"before").unwrap();
    let mut m = m;
    m.mount();
    let io = common::status_io(&m);
    assert_eq!(io["io_uring"], true, "{io}");
    let queues = fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    let transport = io["transport"].as_str().unwrap();
    assert!(
        transport.starts_with("io_uring ("),
        "{transport} (possible CPUs {queues})"
    );
    let text = common::cli_ok(&["status", m.mnt.to_str().unwrap()]);
    assert!(
        text.contains(&format!("transport:      {transport}\n")),
        "{text}"
    );
    assert_eq!(
        log_lines(&m, "FUSE over io_uring: "),
        1,
        "{}",
        m.daemon_log()
    );
    // Requests really travel over the ring, and are served right.
    let pid = m.pid().unwrap();
    let before = ring_completions(pid);
    uncached_requests(&m, 200);
    let served = ring_completions(pid) - before;
    assert!(
        served >= 200,
        "only {served} ring completions for 200 getxattr calls"
    );
    fs::write(m.mnt.join("g"), b"written through the ring").unwrap();
    assert_eq!(
        fs::read(m.src.join("g")).unwrap(),
        b"written through the ring"
    );
    assert_eq!(fs::read(m.mnt.join("f")).unwrap(), b"before");
    common::sh(&m, "setfattr -n user.k -v v g");
    assert_eq!(getxattr(&m.src.join("g"), "user.k"), Ok(b"v".to_vec()));
    assert_eq!(getxattr(&m.mnt.join("g"), "user.k"), Ok(b"v".to_vec()));
    let mut names: Vec<_> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["f", "g"]);

    let d = TestMount::unmounted(&["--no-io-uring"]);
    fs::write(d.src.join("f"), b"x").unwrap();
    let mut d = d;
    d.mount();
    let io = common::status_io(&d);
    assert_eq!(io["io_uring"], false, "{io}");
    assert_eq!(io["transport"], "/dev/fuse (--no-io-uring)", "{io}");
    let pid = d.pid().unwrap();
    uncached_requests(&d, 50);
    assert_eq!(
        ring_completions(pid),
        0,
        "a --no-io-uring daemon has no ring"
    );
    assert_eq!(
        log_lines(&d, "FUSE over io_uring not used: --no-io-uring"),
        1,
        "{}",
        d.daemon_log()
    );
}

#[test]
fn with_enable_uring_off_the_mount_says_once_why_it_uses_dev_fuse() {
    let _off = EnableUring::set(false);
    let m = TestMount::unmounted(&[]);
    fs::write(m.src.join("f"), b"x").unwrap();
    let mut m = m;
    m.mount();
    let io = common::status_io(&m);
    assert_eq!(io["io_uring"], false, "{io}");
    let transport = io["transport"].as_str().unwrap();
    assert!(
        transport.starts_with("/dev/fuse (") && transport.contains("enable_uring is off"),
        "{transport}"
    );
    let text = common::cli_ok(&["status", m.mnt.to_str().unwrap()]);
    assert!(
        text.contains(&format!("transport:      {transport}\n")),
        "{text}"
    );
    uncached_requests(&m, 20);
    assert_eq!(ring_completions(m.pid().unwrap()), 0);
    assert_eq!(
        log_lines(&m, "FUSE over io_uring not used:"),
        1,
        "{}",
        m.daemon_log()
    );
    assert_eq!(
        log_lines(&m, "enable_uring is off"),
        1,
        "{}",
        m.daemon_log()
    );
}

/// `io.requests` of `status --json`: requests served, by opcode.
fn requests(m: &TestMount, op: &str) -> u64 {
    common::status_io(m)["requests"][op].as_u64().unwrap_or(0)
}

#[test]
fn status_counts_the_requests_served_by_opcode_on_both_transports() {
    for (args, ring) in [(&[][..], true), (&["--no-io-uring"][..], false)] {
        let _on = EnableUring::set(true);
        let m = TestMount::unmounted(args);
        fs::write(m.src.join("f"), b"x").unwrap();
        for i in 0..30 {
            fs::write(m.src.join(format!("n{i}")), b"y").unwrap();
        }
        let mut m = m;
        m.mount();
        assert_eq!(common::status_io(&m)["io_uring"], ring);
        uncached_requests(&m, 1); // looks f up
        let getxattr = requests(&m, "GETXATTR");
        uncached_requests(&m, 40);
        assert_eq!(requests(&m, "GETXATTR") - getxattr, 40, "{args:?}");
        // Thirty names never looked up before: one LOOKUP each. `status` itself may look
        // up a few names in the mount (its own path, entries whose timeout ran out).
        let lookup = requests(&m, "LOOKUP");
        for i in 0..30 {
            fs::symlink_metadata(m.mnt.join(format!("n{i}"))).unwrap();
        }
        let looked_up = requests(&m, "LOOKUP") - lookup;
        assert!(
            (30..=36).contains(&looked_up),
            "{args:?}: {looked_up} LOOKUPs"
        );
        let io = common::status_io(&m);
        let names: Vec<&String> = io["requests"].as_object().unwrap().keys().collect();
        assert!(
            names
                .iter()
                .all(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_')),
            "{names:?}"
        );
    }
}
