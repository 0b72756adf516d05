//! A real 3-node Garage cluster for the remote's tests: three `garage server` processes on
//! 127.0.0.1 ports, replication factor 3, each with its own metadata and data dirs in one
//! temporary directory, a bucket and an access key. Dropping the guard (also while a test
//! panics) kills every node it started and removes the directory.
//!
//! The binary is the pinned build `scripts/install-test-deps.sh` makes (garage 2.5.0, into
//! /var/cache/checkpointfs-test/), or `CHECKPOINTFS_GARAGE`. A missing binary fails the test
//! with how to build it: a remote test that skipped would pass without testing anything.
#![allow(
    clippy::disallowed_methods,
    reason = "the cluster's own temporary files, never a mount's SRC"
)]
use std::fs;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const GARAGE_DEFAULT: &str = "/var/cache/checkpointfs-test/garage-2.5.0/bin/garage";
pub const BUCKET: &str = "cpfs";
/// The access key imported into the cluster (Garage's formats: GK + 24 hex, 64 hex).
pub const ACCESS_KEY_ID: &str = "GK0123456789abcdef01234567";
pub const SECRET_ACCESS_KEY: &str =
    "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";

pub fn garage_binary() -> PathBuf {
    let p = std::env::var_os("CHECKPOINTFS_GARAGE")
        .map_or_else(|| PathBuf::from(GARAGE_DEFAULT), PathBuf::from);
    assert!(
        p.exists(),
        "{} is missing: build it with scripts/install-test-deps.sh (or set CHECKPOINTFS_GARAGE)",
        p.display()
    );
    p
}

struct Node {
    config: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

pub struct Garage {
    bin: PathBuf,
    nodes: Vec<Node>,
    pub s3_ports: Vec<u16>,
    /// Declared last: removed after `Drop::drop` killed the nodes.
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

impl Garage {
    /// Starts the cluster and waits (bounded) until its layout is applied and the bucket
    /// answers.
    pub fn start() -> Garage {
        let bin = garage_binary();
        let dir = tempfile::Builder::new()
            .prefix("checkpointfs-garage-")
            .tempdir()
            .expect("temp dir");
        let mut secret = [0u8; 32];
        getrandom_fill(&mut secret);
        let secret: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let mut g = Garage {
            bin,
            nodes: Vec::new(),
            s3_ports: Vec::new(),
            dir,
        };
        for i in 0..3 {
            let (rpc, s3, admin) = (free_port(), free_port(), free_port());
            let base = g.dir.path().join(format!("n{i}"));
            fs::create_dir_all(base.join("meta")).unwrap();
            fs::create_dir_all(base.join("data")).unwrap();
            let config = base.join("garage.toml");
            fs::write(
                &config,
                format!(
                    "metadata_dir = \"{meta}\"\ndata_dir = \"{data}\"\ndb_engine = \"lmdb\"\n\
                     lmdb_map_size = \"1G\"\nreplication_factor = 3\ncompression_level = \"none\"\n\
                     rpc_bind_addr = \"127.0.0.1:{rpc}\"\nrpc_public_addr = \"127.0.0.1:{rpc}\"\n\
                     rpc_secret = \"{secret}\"\n\n[s3_api]\ns3_region = \"garage\"\n\
                     api_bind_addr = \"127.0.0.1:{s3}\"\nroot_domain = \".s3.garage.localhost\"\n\n\
                     [admin]\napi_bind_addr = \"127.0.0.1:{admin}\"\n",
                    meta = base.join("meta").display(),
                    data = base.join("data").display(),
                ),
            )
            .unwrap();
            g.nodes.push(Node {
                config,
                child: None,
                log: base.join("server.log"),
            });
            g.s3_ports.push(s3);
        }
        for i in 0..3 {
            g.start_node(i);
        }
        let ids: Vec<String> = (0..3).map(|i| g.node_id(i)).collect();
        for id in &ids[1..] {
            g.cli_ok(0, &["node", "connect", id]);
        }
        for id in &ids {
            let short = &id[..16];
            g.cli_ok(0, &["layout", "assign", "-z", "dc1", "-c", "1G", short]);
        }
        g.cli_ok(0, &["layout", "apply", "--version", "1"]);
        g.cli_ok(0, &["bucket", "create", BUCKET]);
        g.cli_ok(
            0,
            &[
                "key",
                "import",
                "--yes",
                "-n",
                "cpfs-test",
                ACCESS_KEY_ID,
                SECRET_ACCESS_KEY,
            ],
        );
        g.cli_ok(
            0,
            &[
                "bucket",
                "allow",
                "--read",
                "--write",
                "--owner",
                BUCKET,
                "--key",
                "cpfs-test",
            ],
        );
        g
    }

    fn start_node(&mut self, i: usize) {
        let log = fs::File::create(&self.nodes[i].log).unwrap();
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&self.nodes[i].config)
            .arg("server")
            .env("RUST_LOG", "garage=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start garage server");
        self.nodes[i].child = Some(child);
    }

    /// Kills node `i` (SIGKILL), as a crashed machine.
    pub fn kill_node(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts node `i` again (after [`Garage::kill_node`]), with its data.
    pub fn restart_node(&mut self, i: usize) {
        assert!(self.nodes[i].child.is_none(), "node {i} is running");
        self.start_node(i);
    }

    pub fn cli(&self, node: usize, args: &[&str]) -> Output {
        Command::new(&self.bin)
            .arg("-c")
            .arg(&self.nodes[node].config)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .output()
            .expect("run garage")
    }

    /// Runs a garage command, retrying (bounded) while the cluster is still forming.
    fn cli_ok(&self, node: usize, args: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.cli(node, args);
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            assert!(
                Instant::now() < deadline,
                "garage {args:?} failed: {}{}\nlogs:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.logs()
            );
            // The cluster answers once its RPC is up: wait for that, bounded above.
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn node_id(&self, i: usize) -> String {
        let out = self.cli_ok(i, &["node", "id", "-q"]);
        let id = out.trim().to_string();
        assert!(id.contains('@'), "garage node id: {id:?}");
        id
    }

    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| fs::read_to_string(&n.log).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n---\n")
    }

    /// The environment a mount (its daemon) or `restore` needs to reach the cluster through
    /// node `node`'s S3 API.
    pub fn env(&self, node: usize) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), ACCESS_KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET_ACCESS_KEY.into()),
            (
                "AWS_ENDPOINT_URL".into(),
                format!("http://127.0.0.1:{}", self.s3_ports[node]),
            ),
            ("AWS_REGION".into(), "garage".into()),
            ("AWS_ALLOW_HTTP".into(), "true".into()),
        ]
    }

    /// Where the nodes keep objects on disk (for greps of the whole bucket that do not
    /// trust the S3 API): every node's metadata dir (small objects are inline there) and
    /// data dir (blocks; compression is off).
    pub fn storage_dirs(&self) -> Vec<PathBuf> {
        (0..3)
            .flat_map(|i| ["meta", "data"].map(|d| self.dir.path().join(format!("n{i}/{d}"))))
            .collect()
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill_node(i);
        }
    }
}

fn getrandom_fill(buf: &mut [u8]) {
    let mut f = fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut f, buf).unwrap();
}
