//! The crate's modules import one way only: each top-level module sits in a layer, and code
//! (tests aside) may name only modules of lower layers. A new module must be placed here, so
//! the layering is decided, not accreted. No mount; reads the sources.
#![allow(
    clippy::disallowed_methods,
    reason = "tests build and change trees directly, as users and their tools do"
)]
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top to bottom: the layer table of docs/design.md, one folder (or `rewind.rs`) a
/// module. A module may use the modules of the layers below its own, never its own layer's
/// or one above.
const LAYERS: &[&[&str]] = &[
    // the command line: clap definitions, dispatch, rendering, exit statuses
    &["cli"],
    // mounting and serving: validation, options, spawn, daemon, unmount, watchdog, registry,
    // the control socket
    &["mount"],
    // the FUSE wire; a rewind's plan executed through the core; (reserved) the remote store;
    // a branch's three-way merge, planned
    &["transport", "rewind", "remote", "merge"],
    // the passthrough core, the virtual .checkpoint/ tree, the mutation gate
    &["fs"],
    // the file-history system: Layer 1, checkpoints, store, views, gc, reports' facts
    &["history"],
    // Layer 3, the transcript
    &["transcript"],
    // the state dir
    &["state"],
    // syscall helpers
    &["sys"],
];

/// The files allowed at the top of `src/`: the entry points, and `rewind.rs` (a layer of
/// one module). Everything else lives in its layer's folder.
const TOP_LEVEL_FILES: &[&str] = &["lib.rs", "main.rs", "rewind.rs"];

/// The top-level modules named as `crate::NAME` in `text`, outside comments and the
/// `#[cfg(test)]` module (tests may reach anywhere).
fn imports(text: &str) -> BTreeSet<String> {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let line = line.split("//").next().unwrap_or("");
        let mut rest = line;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// Top-level module name → the modules its files import.
fn module_imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            if module == "lib" || module == "main" {
                continue;
            }
            let mut used = imports(&fs::read_to_string(&path).unwrap());
            used.remove(&module);
            graph.entry(module).or_default().extend(used);
        }
    }
    graph
}

#[test]
fn modules_import_only_from_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_imports(&src);
    let layer_of: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, layer)| layer.iter().map(move |m| (*m, i)))
        .collect();
    assert_eq!(
        layer_of.len(),
        LAYERS.iter().map(|l| l.len()).sum::<usize>(),
        "a module is listed twice in LAYERS"
    );
    let unplaced: Vec<&String> = graph
        .keys()
        .filter(|m| !layer_of.contains_key(m.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules not placed in a layer of tests/it/layers.rs: {unplaced:?}"
    );
    let stale: Vec<&&str> = layer_of
        .keys()
        .filter(|m| !graph.contains_key(**m))
        .collect();
    assert!(
        stale.is_empty(),
        "LAYERS names modules that do not exist: {stale:?}"
    );
    let mut wrong = Vec::new();
    for (module, used) in &graph {
        let here = layer_of[module.as_str()];
        for dep in used {
            match layer_of.get(dep.as_str()) {
                Some(&there) if there > here => {}
                Some(&there) => wrong.push(format!(
                    "{module} (layer {here}) imports {dep} (layer {there})"
                )),
                None => wrong.push(format!("{module} imports unknown module {dep}")),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn src_holds_only_layer_folders_and_the_listed_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files: Vec<String> = fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let extra: Vec<&String> = files
        .iter()
        .filter(|f| !TOP_LEVEL_FILES.contains(&f.as_str()))
        .collect();
    assert!(
        extra.is_empty(),
        "files at the top of src/ outside any layer's folder: {extra:?}"
    );
    for layer in LAYERS.iter().flat_map(|l| l.iter()) {
        let folder = src.join(layer);
        let file = src.join(format!("{layer}.rs"));
        assert!(
            folder.join("mod.rs").is_file() || file.is_file(),
            "layer {layer} has neither src/{layer}/mod.rs nor src/{layer}.rs"
        );
    }
}

#[test]
fn the_import_scanner_sees_paths_and_skips_comments_and_tests() {
    let text = "use crate::fs::PassthroughFs;\n\
                let x = crate::sys::fstat(fd); // crate::cli::nope\n\
                /// [`crate::mount::daemon`] in a doc comment\n\
                #[cfg(test)]\nmod tests { use crate::cli::Cli; }\n";
    let found: Vec<String> = imports(text).into_iter().collect();
    assert_eq!(found, ["fs", "sys"]);
}
