//! What a component imports and exports, read from its bytes before it is compiled, and
//! held against what this agent offers: so a mismatch is named plainly ("imports
//! berth:host/process@0.2.0; this agent offers @0.1.4"), at no compile cost, instead of
//! wasmtime's "function implementation is missing" after seconds of compiling, and a
//! hook dropped where drivers go is called a hook.
//!
//! Only the component's own (outermost) import and export names are read, with
//! wasmparser, the parser wasmtime itself uses; nested modules and components are
//! skipped. A binary that is not a component is refused with its size.

use wasmparser::{Parser, Payload};

/// What a component says it is, by name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Surface {
    pub imports: Vec<String>,
    pub exports: Vec<String>,
}

/// The kind of plugin a component is loaded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Driver,
    Hook,
}

impl Role {
    fn noun(self) -> &'static str {
        match self {
            Role::Driver => "task driver",
            Role::Hook => "hook",
        }
    }

    /// The interface it must export, and the versions this agent runs.
    fn export(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Role::Driver => ("berth:driver/driver", &["0.2.1", "0.2.0", "0.1.0"]),
            Role::Hook => ("berth:hook/lifecycle", &["0.1.0"]),
        }
    }
}

/// The `berth:host` interfaces this agent offers, at the newest version of each line it
/// serves (a guest built against an older patch of a line links).
const HOST_VERSION: &str = "0.1.4";

/// Why a component is refused before it is compiled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error(
        "is {size} bytes; this agent compiles components of at most {max} bytes \
         (`max_component_size` in the agent config)"
    )]
    TooLarge { size: u64, max: u64 },
    #[error("not a valid WebAssembly component ({size} bytes): {reason}")]
    NotAComponent { size: usize, reason: String },
    #[error("imports {import}; this agent offers @{offered}")]
    HostVersion { import: String, offered: String },
    #[error(
        "imports {import}, which plugins cannot use (berth gives them no network); build without it \
         (componentize-js 0.23: `disableFeatures: ['http', 'fetch-event']`, or \
         `jco componentize --disable http fetch-event`)"
    )]
    Http { import: String },
    #[error(
        "imports {import}, which this agent does not offer (it offers berth:host/*@{HOST_VERSION} and wasi:*@0.2)"
    )]
    Unknown { import: String },
    #[error(
        "imports {import}: hooks get WASI and berth:host/log only (processes and timers are \
         task drivers')"
    )]
    NotForHooks { import: String },
    #[error("is a {found}, not a {wanted} (it exports {export}){hint}")]
    OtherRole {
        found: &'static str,
        wanted: &'static str,
        export: String,
        hint: &'static str,
    },
    #[error("exports {export}; this agent runs {wanted}@{offered}")]
    ExportVersion {
        export: String,
        wanted: &'static str,
        offered: String,
    },
    #[error("exports no {wanted} (its exports: {exports})")]
    NoExport {
        wanted: &'static str,
        exports: String,
    },
}

/// A component file of `size` bytes, against the agent's `max_component_size`.
pub fn check_size(size: u64, max: u64) -> Result<(), Mismatch> {
    if size > max {
        return Err(Mismatch::TooLarge { size, max });
    }
    Ok(())
}

/// The component's own imports and exports.
pub fn surface(bytes: &[u8]) -> Result<Surface, Mismatch> {
    let not_a_component = |reason: String| Mismatch::NotAComponent {
        size: bytes.len(),
        reason,
    };
    if !bytes.starts_with(b"\0asm") {
        return Err(not_a_component(
            "it does not start with WebAssembly's magic number".into(),
        ));
    }
    let mut surface = Surface::default();
    // Nesting: 0 outside, 1 in the component itself, more in nested modules/components.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload
            .map_err(|e| not_a_component(format!("{} (at byte {})", e.message(), e.offset())))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    return Err(not_a_component(
                        "it is a core WebAssembly module, not a component (wrap it with `wasm-tools component new`)".into(),
                    ));
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| not_a_component(e.to_string()))?;
                    surface.imports.push(import.name.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| not_a_component(e.to_string()))?;
                    surface.exports.push(export.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(not_a_component("truncated".into()));
    }
    Ok(surface)
}

/// `name` split into its interface and version: `berth:host/process@0.2.0` into
/// (`berth:host/process`, `0.2.0`).
fn split(name: &str) -> (&str, Option<&str>) {
    match name.split_once('@') {
        Some((interface, version)) => (interface, Some(version)),
        None => (name, None),
    }
}

/// The line of a semver version as wasmtime links them: `0.1` of `0.1.2`, `1` of `1.4.0`.
fn line(version: &str) -> &str {
    let mut parts = version.splitn(3, '.');
    let major = parts.next().unwrap_or("");
    if major == "0" {
        let minor_end = 2 + parts.next().map_or(0, str::len);
        &version[..minor_end.min(version.len())]
    } else {
        major
    }
}

/// The version of `berth:driver/driver` the component exports, if it exports one.
pub fn driver_export_version(surface: &Surface) -> Option<&str> {
    let (wanted, _) = Role::Driver.export();
    (surface.exports.iter())
        .map(|export| split(export))
        .find(|(interface, _)| *interface == wanted)
        .and_then(|(_, version)| version)
}

/// `0.2.1, @0.2.0 and @0.1.0`, after the message's first `@`.
fn offered(versions: &[&str]) -> String {
    match versions {
        [] => String::new(),
        [only] => (*only).to_string(),
        [rest @ .., last] => format!("{} and @{last}", rest.join(", @")),
    }
}

/// Checks `surface` against what this agent offers a `role`: first what it is (the
/// interface it exports), then every import.
pub fn check(surface: &Surface, role: Role) -> Result<(), Mismatch> {
    check_export(surface, role)?;
    check_imports(surface, role)
}

fn check_export(surface: &Surface, role: Role) -> Result<(), Mismatch> {
    let (wanted, versions) = role.export();
    if let Some(export) = surface.exports.iter().find(|e| split(e).0 == wanted) {
        return match split(export).1 {
            Some(v) if versions.contains(&v) => Ok(()),
            _ => Err(Mismatch::ExportVersion {
                export: export.clone(),
                wanted,
                offered: offered(versions),
            }),
        };
    }
    let other = match role {
        Role::Driver => Role::Hook,
        Role::Hook => Role::Driver,
    };
    let (other_export, _) = other.export();
    if let Some(export) = surface.exports.iter().find(|e| split(e).0 == other_export) {
        return Err(Mismatch::OtherRole {
            found: other.noun(),
            wanted: role.noun(),
            export: export.clone(),
            hint: match other {
                Role::Hook => ": declare it in a `hook` block of the agent config",
                Role::Driver => ": put it in the plugin dir (`plugin_dir`)",
            },
        });
    }
    Err(Mismatch::NoExport {
        wanted,
        exports: if surface.exports.is_empty() {
            "none".into()
        } else {
            surface.exports.join(", ")
        },
    })
}

fn check_imports(surface: &Surface, role: Role) -> Result<(), Mismatch> {
    let (wanted, versions) = role.export();
    // The role's own package (its `types`, imported by the interface it exports).
    let own_package = wanted.split('/').next().unwrap_or(wanted);
    for import in &surface.imports {
        let (interface, version) = split(import);
        if interface.split('/').next() == Some(own_package) {
            if !version.is_some_and(|v| versions.contains(&v)) {
                return Err(Mismatch::ExportVersion {
                    export: import.clone(),
                    wanted,
                    offered: offered(versions),
                });
            }
        } else if role == Role::Hook
            && interface.starts_with("berth:host/")
            && interface != "berth:host/log"
        {
            return Err(Mismatch::NotForHooks {
                import: import.clone(),
            });
        } else if interface.starts_with("berth:host/") {
            if version.map(line) != Some(line(HOST_VERSION)) {
                return Err(Mismatch::HostVersion {
                    import: import.clone(),
                    offered: HOST_VERSION.into(),
                });
            }
        } else if interface.starts_with("wasi:http/") {
            return Err(Mismatch::Http {
                import: import.clone(),
            });
        } else if interface.starts_with("wasi:") {
            if version.map(line) != Some("0.2") {
                return Err(Mismatch::Unknown {
                    import: import.clone(),
                });
            }
        } else {
            return Err(Mismatch::Unknown {
                import: import.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn component(text: &str) -> Vec<u8> {
        wat::parse_str(text).unwrap()
    }

    #[test]
    fn the_outer_imports_and_exports_are_read_and_nested_ones_skipped() {
        let bytes = component(
            "(component
               (import \"berth:host/log@0.1.0\" (instance))
               (component $inner (import \"inner:only/x\" (instance)))
               (core module $m)
               (instance $i)
               (export \"berth:driver/driver@0.2.0\" (instance $i))
             )",
        );
        let surface = surface(&bytes).unwrap();
        assert_eq!(surface.imports, ["berth:host/log@0.1.0"]);
        assert_eq!(surface.exports, ["berth:driver/driver@0.2.0"]);
        assert_eq!(check(&surface, Role::Driver), Ok(()));
    }

    #[test]
    fn each_mismatch_is_named() {
        let with = |imports: &[&str], exports: &[&str]| Surface {
            imports: imports.iter().map(|s| s.to_string()).collect(),
            exports: exports.iter().map(|s| s.to_string()).collect(),
        };
        let driver = ["berth:driver/driver@0.2.0"];
        assert_eq!(
            check(&with(&["berth:host/process@0.2.0"], &driver), Role::Driver)
                .unwrap_err()
                .to_string(),
            "imports berth:host/process@0.2.0; this agent offers @0.1.4"
        );
        // Older patches of the line link.
        assert!(check(&with(&["berth:host/timer@0.1.0"], &driver), Role::Driver).is_ok());
        assert!(check(&with(&["wasi:io/streams@0.2.6"], &driver), Role::Driver).is_ok());
        assert!(
            check(
                &with(&["wasi:http/outgoing-handler@0.2.3"], &driver),
                Role::Driver
            )
            .unwrap_err()
            .to_string()
            .starts_with("imports wasi:http/outgoing-handler@0.2.3, which plugins cannot use")
        );
        assert!(matches!(
            check(&with(&["acme:secret/x@1.0.0"], &driver), Role::Driver),
            Err(Mismatch::Unknown { .. })
        ));
        assert_eq!(
            check(&with(&[], &["berth:driver/driver@0.3.0"]), Role::Driver)
                .unwrap_err()
                .to_string(),
            "exports berth:driver/driver@0.3.0; this agent runs berth:driver/driver@0.2.1, @0.2.0 and @0.1.0"
        );
        assert_eq!(
            check(&with(&[], &["berth:hook/lifecycle@0.1.0"]), Role::Driver)
                .unwrap_err()
                .to_string(),
            "is a hook, not a task driver (it exports berth:hook/lifecycle@0.1.0): declare it in a `hook` block of the agent config"
        );
        assert_eq!(
            check(&with(&[], &["wasi:cli/run@0.2.0"]), Role::Hook)
                .unwrap_err()
                .to_string(),
            "exports no berth:hook/lifecycle (its exports: wasi:cli/run@0.2.0)"
        );
        assert!(matches!(
            check(
                &with(
                    &["berth:host/process@0.1.2"],
                    &["berth:hook/lifecycle@0.1.0"]
                ),
                Role::Hook
            ),
            Err(Mismatch::NotForHooks { .. })
        ));
    }

    #[test]
    fn what_is_not_a_component_is_refused_with_its_size() {
        let error = surface(b"nope").unwrap_err().to_string();
        assert_eq!(
            error,
            "not a valid WebAssembly component (4 bytes): it does not start with WebAssembly's magic number"
        );
        let module = wat::parse_str("(module)").unwrap();
        let error = surface(&module).unwrap_err().to_string();
        assert!(
            error.contains("a core WebAssembly module, not a component"),
            "{error}"
        );
        let whole = component(DRIVER_EXPORT_COMPONENT);
        let error = surface(&whole[..whole.len() - 3]).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!(
                "not a valid WebAssembly component ({} bytes): unexpected end-of-file",
                whole.len() - 3
            )),
            "{error}"
        );
        assert_eq!(
            check_size(2048, 1024).unwrap_err().to_string(),
            "is 2048 bytes; this agent compiles components of at most 1024 bytes (`max_component_size` in the agent config)"
        );
        assert!(check_size(1024, 1024).is_ok());
        assert_eq!(line("0.1.2"), "0.1");
        assert_eq!(line("1.4.0"), "1");
    }

    const DRIVER_EXPORT_COMPONENT: &str =
        "(component (instance $i) (export \"berth:driver/driver@0.2.0\" (instance $i)))";
}

#[cfg(test)]
mod real_components {
    use super::*;

    /// The agent's own drivers and test hooks pass the check as what they are.
    #[test]
    fn the_built_in_drivers_and_a_real_hook_pass_as_what_they_are() {
        for (name, bytes) in berth_builtin::DRIVERS {
            let surface = surface(bytes).unwrap();
            check(&surface, Role::Driver).unwrap_or_else(|e| panic!("{name}: {e}: {surface:?}"));
            assert!(check(&surface, Role::Hook).is_err(), "{name}");
        }
        use berth_builtin::test_components as t;
        let read = |path: &str| std::fs::read(path).unwrap();
        let legacy = surface(&read(t::LEGACY_V01)).unwrap();
        check(&legacy, Role::Driver).unwrap_or_else(|e| panic!("legacy: {e}: {legacy:?}"));
        for (name, bytes) in [
            ("deny", t::DENY_POLICY_HOOK),
            ("inject", t::INJECT_ENV_HOOK),
            ("hostile", t::HOSTILE_HOOK),
        ] {
            let surface = surface(&read(bytes)).unwrap();
            check(&surface, Role::Hook).unwrap_or_else(|e| panic!("{name}: {e}: {surface:?}"));
            assert_eq!(
                check(&surface, Role::Driver).unwrap_err().to_string(),
                "is a hook, not a task driver (it exports berth:hook/lifecycle@0.1.0): declare it in a `hook` block of the agent config",
                "{name}"
            );
        }
    }
}
