//! `checkpointfs completions SHELL` and `checkpointfs man [--dir DIR]`: shell completion
//! scripts and man pages, generated from the clap definitions (the caller, [`crate::cli`],
//! passes its `clap::Command`) so that they can never disagree with `--help`.
use std::fs;
use std::io::{self, Write};
use std::path::Path;

use clap_complete::Shell;

use crate::cli::exit_status::{EXIT_FAILURE, EXIT_OK};

/// The program name completions are registered for (the binary's name).
const BIN_NAME: &str = "checkpointfs";

/// Prints the completion script of `cmd` for `shell` to stdout.
pub fn completions(mut cmd: clap::Command, shell: Shell) -> i32 {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, BIN_NAME, &mut script);
    write_stdout(&script, &format!("the {shell} completion script"))
}

/// The pages of `cmd`. Without `dir`: prints the top-level man page to stdout. With `dir`: writes
/// `checkpointfs.1` and one `checkpointfs-SUBCOMMAND.1` per subcommand there (creating the
/// directory if needed) and prints the paths written.
pub fn man(cmd: clap::Command, dir: Option<&Path>) -> i32 {
    let Some(dir) = dir else {
        let mut page = Vec::new();
        if let Err(e) = page_of(cmd).render(&mut page) {
            eprintln!("checkpointfs: cannot render the man page: {e}");
            return EXIT_FAILURE;
        }
        return write_stdout(&page, "the man page");
    };
    match write_man_pages(cmd, dir) {
        Ok(written) => {
            let list: String = written.iter().map(|p| format!("{p}\n")).collect();
            write_stdout(list.as_bytes(), "the list of man pages")
        }
        Err(e) => {
            eprintln!(
                "checkpointfs: cannot write man pages to {}: {e}",
                dir.display()
            );
            EXIT_FAILURE
        }
    }
}

/// The paths written, top-level page first.
fn write_man_pages(cmd: clap::Command, dir: &Path) -> io::Result<Vec<String>> {
    fs::create_dir_all(dir)?;
    let mut cmd = cmd.disable_help_subcommand(true);
    // Building gives each subcommand its display name, `checkpointfs-SUBCOMMAND`, which
    // names its page.
    cmd.build();
    let mut pages = vec![page_of(cmd.clone())];
    pages.extend(
        cmd.get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| page_of(s.clone())),
    );
    pages
        .iter()
        .map(|page| page.generate_to(dir).map(|p| p.display().to_string()))
        .collect()
}

/// The page of `cmd`, its footer naming the program (clap_mangen would name the
/// subcommand: "umount 0.1.0").
fn page_of(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).source(format!("{BIN_NAME} {}", env!("CARGO_PKG_VERSION")))
}

fn write_stdout(bytes: &[u8], what: &str) -> i32 {
    let mut out = io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("checkpointfs: cannot write {what} to stdout: {e}");
            EXIT_FAILURE
        }
    }
}
