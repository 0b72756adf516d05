//! `checkpointfs ui MNT` (or `--state-dir DIR`, read-only): a terminal browser of the
//! timeline of checkpoints, the paths each changed, their diffs and a path's history, with
//! restore, rewind and undo behind a confirmation. Layers: [`model`] is the state and the
//! keys (pure), [`view`] draws it (ratatui), [`source`] answers its queries on a worker
//! thread (the daemon's paged browse requests, or the state dir offline); this module runs
//! the loop and owns the terminal, which is restored on every way out: a return, a panic
//! (ratatui's panic hook) and SIGTERM/SIGHUP (a flag the loop checks every 50 ms).
pub mod model;
pub mod source;
pub mod view;

use std::io::{self, IsTerminal};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event as TermEvent, KeyEventKind};

use self::model::{Event, Model};
use self::source::Source;
use crate::cli::commands::{Target, open_offline, state_dir_of};
use crate::cli::exit_status::{EXIT_FAILURE, EXIT_OK, EXIT_USAGE};
use crate::mount::control_socket;

/// How often the head is polled: new checkpoints show within this, at one request each.
const POLL: Duration = Duration::from_secs(1);

/// How long the loop waits for a key before it looks at replies and signals again.
const WAIT: Duration = Duration::from_millis(50);

/// Leaves raw mode and the alternate screen when dropped (also when unwinding).
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// `checkpointfs ui`.
pub fn run(target: &Target) -> i32 {
    if !io::stdout().is_terminal() || !io::stdin().is_terminal() {
        eprintln!(
            "checkpointfs: ui needs a terminal (stdin and stdout); use `log` or `diff` in scripts"
        );
        return EXIT_USAGE;
    }
    let state_dir = match state_dir_of(target) {
        Ok(d) => d,
        Err(code) => return code,
    };
    let (label, read_only) = match target {
        Target::Mount(m) => (m.display().to_string(), false),
        Target::StateDir(d) => (format!("--state-dir {}", d.display()), true),
    };
    let source = if control_socket::daemon_is_serving(&state_dir) {
        Source::Daemon { state_dir }
    } else if read_only {
        match open_offline(&state_dir) {
            Ok(h) => Source::Offline(h),
            Err(code) => return code,
        }
    } else {
        eprintln!(
            "checkpointfs: no daemon serves {label} (is it mounted?); `checkpointfs ui \
             --state-dir {}` browses its history read-only",
            state_dir.display()
        );
        return EXIT_FAILURE;
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGTERM, libc::SIGHUP] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("checkpointfs: cannot handle signal {sig}: {e}");
            return EXIT_FAILURE;
        }
    }
    let (query_tx, query_rx) = crossbeam_channel::unbounded();
    let (reply_tx, reply_rx) = crossbeam_channel::unbounded();
    // Not joined on exit: it may be inside a request, and its answer is no longer wanted.
    let spawned = std::thread::Builder::new()
        .name("ui-source".into())
        .spawn(move || source::serve(source, query_rx, reply_tx));
    if let Err(e) = spawned {
        eprintln!("checkpointfs: cannot start a thread: {e}");
        return EXIT_FAILURE;
    }
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            ratatui::restore();
            eprintln!("checkpointfs: cannot set up the terminal: {e}");
            return EXIT_FAILURE;
        }
    };
    let guard = TerminalGuard;
    let size = terminal
        .size()
        .map(|s| (s.width, s.height))
        .unwrap_or((80, 24));
    let theme = view::Theme::from_env();
    let mut m = Model::new(label, read_only, size);
    let send = |qs: Vec<model::Query>| {
        for q in qs {
            let _ = query_tx.send(q);
        }
    };
    send(m.start());
    let mut last_poll = Instant::now();
    let mut dirty = true;
    let outcome = loop {
        if stop.load(Ordering::Relaxed) {
            break Ok(128 + libc::SIGTERM);
        }
        if dirty {
            if let Err(e) = terminal.draw(|f| view::draw(f, &m, theme)) {
                break Err(e);
            }
            dirty = false;
        }
        let mut events = Vec::new();
        match event::poll(WAIT) {
            Ok(true) => match event::read() {
                Ok(TermEvent::Key(k)) if k.kind != KeyEventKind::Release => {
                    events.push(Event::Key(k))
                }
                Ok(TermEvent::Resize(w, h)) => events.push(Event::Resize(w, h)),
                Ok(_) => {}
                Err(e) => break Err(e),
            },
            Ok(false) => {}
            Err(e) => break Err(e),
        }
        events.extend(reply_rx.try_iter().map(|r| Event::Reply(Box::new(r))));
        if last_poll.elapsed() >= POLL {
            last_poll = Instant::now();
            events.push(Event::Tick);
        }
        for e in events {
            dirty = true;
            send(m.update(e));
        }
        if m.quit {
            break Ok(EXIT_OK);
        }
    };
    drop(terminal);
    drop(guard);
    match outcome {
        Ok(code) => {
            if !m.status.is_empty() && code == EXIT_OK {
                println!("{}", view::printable(&m.status));
            }
            code
        }
        Err(e) => {
            eprintln!("checkpointfs: ui: terminal error: {e}");
            EXIT_FAILURE
        }
    }
}
