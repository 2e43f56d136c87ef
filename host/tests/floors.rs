//! The invariants ARCHITECTURE.md states about the code, checked by reading the source
//! as text, in the spirit of rust-analyzer's tidy tests. Every rule is one function
//! that returns its violations, each naming the file and line that broke it, and has a
//! unit test below showing that it catches a violation.
//!
//! The floors are read from ARCHITECTURE.md (the "Floors" block), so the picture there
//! and the rule here are the same thing.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// A broken rule: where, and which rule.
#[derive(Debug, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// One source file: its path relative to the repository and its text.
struct Source {
    path: String,
    text: String,
}

impl Source {
    /// The top-level module of `host/src` the file belongs to (`csi` for
    /// `host/src/csi/client.rs`, `config` for `host/src/config.rs`); `None` for the crate
    /// roots.
    fn module(&self) -> Option<&str> {
        let rel = self.path.strip_prefix("host/src/")?;
        let first = rel.split('/').next()?;
        let name = first.strip_suffix(".rs").unwrap_or(first);
        (!matches!(name, "lib" | "main")).then_some(name)
    }

    /// Lines of code with comments and string literals blanked out, numbered from 1.
    fn code_lines(&self) -> impl Iterator<Item = (usize, String)> + '_ {
        self.text
            .lines()
            .enumerate()
            .map(|(i, line)| (i + 1, strip_comments_and_strings(line)))
    }
}

fn strip_comments_and_strings(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push('"');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// The rules.

/// Floors: a module may import only modules on lower floors (and itself). `floors`
/// maps a top-level module to its floor number.
fn upward_imports(source: &Source, floors: &BTreeMap<String, usize>) -> Vec<Violation> {
    let Some(module) = source.module() else {
        return Vec::new();
    };
    let Some(&own_floor) = floors.get(module) else {
        return vec![Violation {
            file: source.path.clone(),
            line: 1,
            message: format!(
                "module `{module}` stands on no floor: add it to the Floors block of ARCHITECTURE.md"
            ),
        }];
    };
    let mut violations = Vec::new();
    for (line, code) in source.code_lines() {
        for target in crate_paths(&code) {
            if target == module {
                continue;
            }
            let Some(&target_floor) = floors.get(target) else {
                continue;
            };
            if target_floor >= own_floor {
                let why = if target_floor == own_floor {
                    "on the same floor"
                } else {
                    "on a higher floor"
                };
                violations.push(Violation {
                    file: source.path.clone(),
                    line,
                    message: format!(
                        "`{module}` (floor {own_floor}) imports `crate::{target}` (floor {target_floor}, {why}): move the shared part down (often into `model`)"
                    ),
                });
            }
        }
    }
    violations
}

/// The first segment after every `crate::` on a line of code.
fn crate_paths(code: &str) -> Vec<&str> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // `crate::` as a path root, not the tail of another identifier.
            code[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
        .filter_map(|(at, _)| {
            let rest = &code[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (end > 0).then(|| &rest[..end])
        })
        .collect()
}

/// Only `host/src/mount/` calls mount(2) and friends.
fn mount_syscalls_outside_mount(source: &Source) -> Vec<Violation> {
    if source.path.starts_with("host/src/mount/") {
        return Vec::new();
    }
    const FLAG_TYPES: &[&str] = &["MountPropagationFlags", "MountFlags", "UnmountFlags"];
    const RAW: &[&str] = &[
        "libc::mount",
        "libc::umount",
        "nix::mount",
        "move_mount",
        "fsmount",
        "open_tree",
        "SYS_mount",
        "SYS_umount",
    ];
    let mut violations = Vec::new();
    for (line, code) in source.code_lines() {
        // `rustix::mount::X` or `rustix::mount::{X, Y}` where some X is not a flag type
        // (a function, `self`, or the module itself).
        let rustix_call = code.match_indices("rustix::mount").any(|(at, _)| {
            let rest = &code[at + "rustix::mount".len()..];
            let rest = rest.strip_prefix("::").unwrap_or("");
            let named: Vec<&str> = match rest.strip_prefix('{') {
                Some(list) => list[..list.find('}').unwrap_or(list.len())]
                    .split(',')
                    .map(str::trim)
                    .collect(),
                None => vec![
                    rest.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                        .next()
                        .unwrap_or(""),
                ],
            };
            named.iter().any(|name| !FLAG_TYPES.contains(name))
        });
        if rustix_call || RAW.iter().any(|raw| code.contains(raw)) {
            violations.push(Violation {
                file: source.path.clone(),
                line,
                message: "a mount syscall outside host/src/mount/: add a function to `mount` and call that".into(),
            });
        }
    }
    violations
}

/// Only `host/src/runtime/` touches wasmtime and the generated WIT bindings.
fn bindings_outside_runtime(source: &Source) -> Vec<Violation> {
    mentions_outside(
        source,
        "host/src/runtime/",
        &["wasmtime", "bindgen!", "bindings::"],
        "wasmtime or generated bindings outside host/src/runtime/: convert to a `model` type inside `runtime`",
    )
}

/// Only `host/src/csi/` touches tonic and the protobuf types.
fn grpc_outside_csi(source: &Source) -> Vec<Violation> {
    mentions_outside(
        source,
        "host/src/csi/",
        &["tonic::", "prost::", "berth_proto"],
        "tonic or protobuf types outside host/src/csi/: convert to a `model` type inside `csi`",
    )
}

/// A violation for every line of code outside `home` that mentions one of `needles`.
fn mentions_outside(
    source: &Source,
    home: &str,
    needles: &[&str],
    message: &str,
) -> Vec<Violation> {
    if source.path.starts_with(home) {
        return Vec::new();
    }
    source
        .code_lines()
        .filter(|(_, code)| needles.iter().any(|needle| code.contains(needle)))
        .map(|(line, _)| Violation {
            file: source.path.clone(),
            line,
            message: message.to_string(),
        })
        .collect()
}

/// Errors are typed: no `Result<_, String>` outside tests.
fn stringly_results(source: &Source) -> Vec<Violation> {
    if source.path.ends_with("/tests.rs") {
        return Vec::new();
    }
    let mut violations = Vec::new();
    for (line, code) in source.code_lines() {
        if code.contains("#[cfg(test)]") {
            break;
        }
        if result_errors(&code).any(|error| error == "String") {
            violations.push(Violation {
                file: source.path.clone(),
                line,
                message:
                    "`Result<_, String>`: give the error a type (a `thiserror` enum of the module)"
                        .into(),
            });
        }
    }
    violations
}

/// The error type (the last top-level argument) of every `Result<…>` on a line.
/// `wasmtime::Result<Result<T, String>>` is skipped: that is the signature of a generated
/// host function whose WIT type is `result<T, string>`, the guest's error text. So is
/// `Result<hcl::Value, String>`, the signature hcl-rs gives the jobspec functions
/// (`hcl::eval::Func`): the text is what hcl-rs shows the user.
fn result_errors(code: &str) -> impl Iterator<Item = String> + '_ {
    code.match_indices("Result<").filter_map(move |(at, _)| {
        if code[..at].ends_with("wasmtime::") || code[..at].ends_with("wasmtime::Result<") {
            return None;
        }
        if code[at..].starts_with("Result<hcl::Value, String>") {
            return None;
        }
        let mut depth = 0usize;
        let mut last_arg_start = at + "Result<".len();
        for (i, c) in code[at + "Result<".len()..].char_indices() {
            let i = at + "Result<".len() + i;
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if depth == 0 => {
                    let arg: String = code[last_arg_start..i]
                        .chars()
                        .filter(|c| !c.is_whitespace())
                        .collect();
                    return Some(arg);
                }
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => last_arg_start = i + 1,
                _ => {}
            }
        }
        None
    })
}

/// Every module file starts with a `//!` doc comment saying what it is for.
fn missing_module_doc(source: &Source) -> Vec<Violation> {
    if source.text.trim_start().starts_with("//!") {
        return Vec::new();
    }
    vec![Violation {
        file: source.path.clone(),
        line: 1,
        message: "the file does not start with a `//!` comment saying what the module is for"
            .into(),
    }]
}

/// ARCHITECTURE.md names every module directory of `host/src`, and every `host/src/…`
/// path it names exists.
fn architecture_map(
    architecture: &str,
    dirs: &[String],
    exists: impl Fn(&str) -> bool,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for dir in dirs {
        if !architecture.contains(&format!("{dir}/")) {
            violations.push(Violation {
                file: "ARCHITECTURE.md".into(),
                line: 1,
                message: format!("the module directory `{dir}/` is not in the code map"),
            });
        }
    }
    for (i, line) in architecture.lines().enumerate() {
        for (at, _) in line.match_indices("host/src/") {
            let path: String = line[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
                .collect();
            let path = path.trim_end_matches('.');
            if !exists(path) {
                violations.push(Violation {
                    file: "ARCHITECTURE.md".into(),
                    line: i + 1,
                    message: format!("`{path}` does not exist"),
                });
            }
        }
    }
    violations
}

/// The floors from the ```` ```text ```` block under `## Floors` in ARCHITECTURE.md:
/// lines `floor N  a, b, c`.
fn parse_floors(architecture: &str) -> Result<BTreeMap<String, usize>, String> {
    let section = architecture
        .split("\n## Floors")
        .nth(1)
        .ok_or("ARCHITECTURE.md has no `## Floors` section")?;
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .ok_or("the Floors section has no ```text block")?;
    let mut floors = BTreeMap::new();
    for line in block.lines() {
        let Some(rest) = line.trim().strip_prefix("floor") else {
            continue;
        };
        let rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let floor: usize = rest[..digits]
            .parse()
            .map_err(|_| format!("cannot read the floor number in {line:?}"))?;
        for module in rest[digits..].split(|c: char| c == ',' || c.is_whitespace()) {
            if module.is_empty() {
                continue;
            }
            let module = module.trim_end_matches('/');
            if floors.insert(module.to_string(), floor).is_some() {
                return Err(format!("`{module}` stands on two floors"));
            }
        }
    }
    if floors.is_empty() {
        return Err("the Floors block lists no floor".into());
    }
    Ok(floors)
}

// ---------------------------------------------------------------------------------------
// The tree.

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_sources(repo: &Path, dir: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    let mut stack = vec![repo.join(dir)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(Source {
                    path: path
                        .strip_prefix(repo)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                    text: std::fs::read_to_string(&path).unwrap(),
                });
            }
        }
    }
    sources.sort_by(|a, b| a.path.cmp(&b.path));
    sources
}

fn module_dirs(repo: &Path) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut stack = vec![repo.join("host/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(
                    path.strip_prefix(repo)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
                stack.push(path);
            }
        }
    }
    dirs.sort();
    dirs
}

fn assert_clean(rule: &str, violations: Vec<Violation>) {
    let listed: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        listed.is_empty(),
        "{rule}: {} violation(s):\n{}",
        listed.len(),
        listed.join("\n")
    );
}

fn architecture() -> String {
    std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap()
}

#[test]
fn no_module_imports_upward() {
    let floors = parse_floors(&architecture()).unwrap();
    let sources = rust_sources(&repo(), "host/src");
    let mut violations = Vec::new();
    for source in &sources {
        violations.extend(upward_imports(source, &floors));
    }
    // Every floor named in the picture is a module that exists.
    for module in floors.keys() {
        let exists = sources.iter().any(|s| s.module() == Some(module.as_str()));
        if !exists {
            violations.push(Violation {
                file: "ARCHITECTURE.md".into(),
                line: 1,
                message: format!(
                    "the Floors block names `{module}`, which is not a module of host/src"
                ),
            });
        }
    }
    assert_clean("floors", violations);
}

#[test]
fn only_mount_calls_mount_syscalls() {
    let violations = rust_sources(&repo(), "host/src")
        .iter()
        .flat_map(mount_syscalls_outside_mount)
        .collect();
    assert_clean("mount syscalls", violations);
}

#[test]
fn only_runtime_touches_wasmtime_bindings() {
    let violations = rust_sources(&repo(), "host/src")
        .iter()
        .flat_map(bindings_outside_runtime)
        .collect();
    assert_clean("generated bindings", violations);
}

#[test]
fn only_csi_touches_grpc() {
    let violations = rust_sources(&repo(), "host/src")
        .iter()
        .flat_map(grpc_outside_csi)
        .collect();
    assert_clean("gRPC types", violations);
}

#[test]
fn errors_are_typed() {
    let violations = rust_sources(&repo(), "host/src")
        .iter()
        .flat_map(stringly_results)
        .collect();
    assert_clean("typed errors", violations);
}

#[test]
fn every_module_says_what_it_is_for() {
    let violations = rust_sources(&repo(), "host/src")
        .iter()
        .flat_map(missing_module_doc)
        .collect();
    assert_clean("module docs", violations);
}

#[test]
fn architecture_names_every_module_directory() {
    let repo = repo();
    let violations = architecture_map(&architecture(), &module_dirs(&repo), |path| {
        repo.join(path).exists()
    });
    assert_clean("ARCHITECTURE.md", violations);
}

// ---------------------------------------------------------------------------------------
// The checker's own tests: each rule catches what it names.

fn source(path: &str, text: &str) -> Source {
    Source {
        path: path.into(),
        text: text.into(),
    }
}

fn floors_of(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(m, f)| (m.to_string(), *f)).collect()
}

#[test]
fn checker_catches_an_upward_import() {
    let floors = floors_of(&[("model", 0), ("state", 2), ("alloc_runner", 7)]);
    let upward = source(
        "host/src/state/mod.rs",
        "//! state\nuse crate::model::status::ClientStatus;\nuse crate::alloc_runner::AllocStatus;\n",
    );
    assert_eq!(
        upward_imports(&upward, &floors),
        vec![Violation {
            file: "host/src/state/mod.rs".into(),
            line: 3,
            message: "`state` (floor 2) imports `crate::alloc_runner` (floor 7, on a higher floor): move the shared part down (often into `model`)".into(),
        }]
    );
    // Inline paths count too, comments and strings do not.
    let inline = source(
        "host/src/model/x.rs",
        "//! x\nfn f() { crate::state::open(); } // crate::agent\nconst S: &str = \"crate::agent\";\n",
    );
    let found = upward_imports(&inline, &floors);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].line, 2);
}

#[test]
fn checker_catches_a_same_floor_import_and_a_module_without_a_floor() {
    let floors = floors_of(&[("csi", 4), ("driver_set", 4)]);
    let sideways = source("host/src/csi/mod.rs", "use crate::driver_set::DriverSet;\n");
    assert!(
        upward_imports(&sideways, &floors)[0]
            .message
            .contains("on the same floor")
    );
    let homeless = source("host/src/newthing.rs", "//! new\n");
    assert!(
        upward_imports(&homeless, &floors)[0]
            .message
            .contains("stands on no floor")
    );
    let downward = source(
        "host/src/csi/mod.rs",
        "use crate::csi::client::CsiClient;\n",
    );
    assert!(upward_imports(&downward, &floors).is_empty());
}

#[test]
fn checker_catches_mount_syscalls_elsewhere() {
    let elsewhere = source(
        "host/src/csi/layout.rs",
        "use rustix::mount::MountPropagationFlags;\nfn f() { rustix::mount::mount_bind(a, b)?; }\nuse rustix::mount::{mount_change, MountFlags};\nunsafe { libc::umount2(p, 0) };\nuse rustix::mount;\nuse rustix::mount::{MountFlags, UnmountFlags};\n",
    );
    let lines: Vec<usize> = mount_syscalls_outside_mount(&elsewhere)
        .iter()
        .map(|v| v.line)
        .collect();
    assert_eq!(lines, vec![2, 3, 4, 5]);
    let inside = source(
        "host/src/mount/shared.rs",
        "fn f() { rustix::mount::mount_bind(a, b)?; }\n",
    );
    assert!(mount_syscalls_outside_mount(&inside).is_empty());
}

#[test]
fn checker_catches_bindings_and_grpc_elsewhere() {
    let bindings = source(
        "host/src/validate.rs",
        "use crate::runtime::bindings::driver_types;\n",
    );
    assert_eq!(bindings_outside_runtime(&bindings).len(), 1);
    let grpc = source(
        "host/src/agent/mod.rs",
        "fn f() -> tonic::Status { todo() }\n",
    );
    assert_eq!(grpc_outside_csi(&grpc).len(), 1);
    let fine = source("host/src/csi/client.rs", "use tonic::Code;\n");
    assert!(grpc_outside_csi(&fine).is_empty());
}

#[test]
fn checker_catches_stringly_results_and_missing_docs() {
    let stringly = source(
        "host/src/jobspec/decode.rs",
        "//! d\npub fn parse(text: &str) -> Result<u32, String> {}\nfn ok() -> Result<Option<(String, HashMap<String, String>)>, Error> {}\nfn wit(&mut self) -> wasmtime::Result<Result<(), String>> {}\ntype R = std::result::Result<hcl::Value, String>;\n#[cfg(test)]\nfn t() -> Result<(), String> {}\n",
    );
    let found = stringly_results(&stringly);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].line, 2);
    assert_eq!(
        missing_module_doc(&source("host/src/x.rs", "use a;\n")).len(),
        1
    );
}

#[test]
fn checker_catches_a_stale_architecture_map() {
    let architecture = "## Code map\n### `host/src/csi/`\nSee `host/src/gone.rs`.\n";
    let dirs = vec!["host/src/csi".to_string(), "host/src/model".to_string()];
    let found = architecture_map(architecture, &dirs, |path| path != "host/src/gone.rs");
    let messages: Vec<&str> = found.iter().map(|v| v.message.as_str()).collect();
    assert_eq!(
        messages,
        vec![
            "the module directory `host/src/model/` is not in the code map",
            "`host/src/gone.rs` does not exist"
        ]
    );
}

#[test]
fn floors_are_read_from_the_picture() {
    let architecture =
        "# A\n## Floors\n\n```text\nfloor 2  agent\nfloor 1  csi, state\nfloor 0  model\n```\n";
    assert_eq!(
        parse_floors(architecture).unwrap(),
        floors_of(&[("agent", 2), ("csi", 1), ("state", 1), ("model", 0)])
    );
    assert!(parse_floors("## Floors\n```text\nfloor 1 a\nfloor 2 a\n```\n").is_err());
    assert!(parse_floors("no floors here").is_err());
}
