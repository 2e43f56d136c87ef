//! Third-party lifecycle hooks as components (`berth:hook/hook@0.1.0`): loading, and
//! every call in a fresh sandboxed instance with the hook's own limits.
//!
//! The sandbox: WASI with only the task's `local/` directory preopened (at `/local`),
//! no environment, no arguments, no network; a deadline per call (epoch interruption
//! for guest time, a wall-clock bound for everything else); a memory cap. What a hook
//! returns is bounded ([`Bounds`]) and its files are written by the host, beneath
//! `local/` only ([`write_beneath`]).

use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use tracing::Instrument;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use super::Runtime;
use super::bindings::hook_v0_1::{self as wit, Hook as HookBindings, HookPre};
use super::sandbox::{self, Fault, PluginCtx, PluginIdentity};
use berth_model::hook::{HookSpec, WriteQuota};
use berth_model::text::clip;

/// Limits on what a hook may return from prestart.
pub struct Bounds;

impl Bounds {
    pub const ENV_VARS: usize = 64;
    pub const ENV_KEY_BYTES: usize = 128;
    pub const ENV_VALUE_BYTES: usize = 4096;
    pub const FILES: usize = 16;
    pub const FILE_BYTES: usize = 1 << 20;
    pub const EVENTS: usize = 8;
    pub const EVENT_CHARS: usize = 512;
    pub const PATH_DEPTH: usize = 8;
}

#[derive(Debug, thiserror::Error)]
pub enum HookLoadError {
    #[error(
        "hook {name:?}: {} is sha256 {actual}, but the agent config pins sha256 {pinned}: refused \
         (update the pin if the new file is approved)",
        path.display()
    )]
    DigestMismatch {
        name: String,
        path: PathBuf,
        pinned: String,
        actual: String,
    },
    #[error(
        "hook {name:?}: {} (sha256 {actual}) has no sha256 pin, and require_pinned = true \
         refuses unpinned components",
        path.display()
    )]
    Unpinned {
        name: String,
        path: PathBuf,
        actual: String,
    },
    #[error("hook {name:?}: cannot read {path}: {source}")]
    Read {
        name: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("hook {name:?}: {path} is not a valid WebAssembly component: {reason}")]
    Invalid {
        name: String,
        path: PathBuf,
        reason: String,
    },
    #[error("hook {name:?}: {path} is not a berth hook: {reason}")]
    WrongWorld {
        name: String,
        path: PathBuf,
        reason: String,
    },
    /// Refused before it was compiled: what it imports or exports is not what this agent
    /// offers a hook.
    #[error("hook {name:?}: {path}: {mismatch}")]
    Mismatch {
        name: String,
        path: PathBuf,
        mismatch: crate::component_check::Mismatch,
    },
}

/// Why a hook call did not give a usable answer. Displayed after the hook's label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookFailure {
    /// The hook returned an error: its reason is for the user.
    #[error("{0}")]
    Refused(String),
    #[error("{fault} (during {call})")]
    Fault { call: &'static str, fault: Fault },
    #[error("returned too much: {0}")]
    TooMuch(String),
    #[error("asked for something it may not have: {0}")]
    Denied(String),
    #[error("could not be run: {0}")]
    Setup(String),
}

/// What a prestart call changes for the task, checked against [`Bounds`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrestartOutput {
    pub env: Vec<(String, String)>,
    pub files: Vec<PathBuf>,
    pub events: Vec<String>,
}

/// What a hook is told about the task.
#[derive(Debug, Clone, Default)]
pub struct HookTaskContext {
    pub job_name: String,
    pub group_name: String,
    pub task_name: String,
    pub alloc_id: String,
    pub driver: String,
    pub task_config: String,
    pub env: Vec<(String, String)>,
    pub meta: Vec<(String, String)>,
    pub volumes: Vec<(String, String, bool)>,
}

/// The lifecycle notifications after prestart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notification {
    Poststart,
    Exited {
        exit_code: i32,
        signal: i32,
        failed: bool,
    },
    Stop,
}

/// A loaded hook.
pub struct Hook {
    runtime: Runtime,
    /// The component's SHA-256, for `berth hook list`.
    digest: String,
    spec: HookSpec,
    pre: HookPre<PluginCtx>,
}

impl Hook {
    /// Loads the hook `spec` declares, if its file is what the operator pinned (and, with
    /// `require_pinned`, if there is a pin at all). Checked before any of its code runs.
    pub async fn load(
        runtime: &Runtime,
        spec: HookSpec,
        require_pinned: bool,
    ) -> Result<Hook, HookLoadError> {
        let bytes = runtime
            .read_component(&spec.path)
            .map_err(|source| HookLoadError::Read {
                name: spec.name.clone(),
                path: spec.path.clone(),
                source,
            })?
            .map_err(|mismatch| HookLoadError::Mismatch {
                name: spec.name.clone(),
                path: spec.path.clone(),
                mismatch,
            })?;
        let digest = berth_model::pins::sha256_hex(&bytes);
        match &spec.sha256 {
            Some(pinned) if *pinned != digest => {
                return Err(HookLoadError::DigestMismatch {
                    name: spec.name.clone(),
                    path: spec.path.clone(),
                    pinned: pinned.clone(),
                    actual: digest,
                });
            }
            None if require_pinned => {
                return Err(HookLoadError::Unpinned {
                    name: spec.name.clone(),
                    path: spec.path.clone(),
                    actual: digest,
                });
            }
            _ => {}
        }
        let refused = |mismatch| HookLoadError::Mismatch {
            name: spec.name.clone(),
            path: spec.path.clone(),
            mismatch,
        };
        let surface = crate::component_check::surface(&bytes).map_err(refused)?;
        crate::component_check::check(&surface, crate::component_check::Role::Hook)
            .map_err(refused)?;
        let invalid = |reason: String| HookLoadError::Invalid {
            name: spec.name.clone(),
            path: spec.path.clone(),
            reason,
        };
        let label = format!("hook {:?} ({})", spec.name, spec.path.display());
        let (component, _) = runtime
            .cache()
            .load(runtime.engine(), &bytes, &label)
            .map_err(|e| invalid(format!("{e:#}")))?;
        let mut linker: Linker<PluginCtx> = Linker::new(runtime.engine());
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .and_then(|()| {
                super::bindings::host::log::add_to_linker::<_, HasSelf<_>>(&mut linker, |c| c)
            })
            .map_err(|e| invalid(format!("{e:#}")))?;
        let wrong_world = |reason: String| HookLoadError::WrongWorld {
            name: spec.name.clone(),
            path: spec.path.clone(),
            reason,
        };
        let instance_pre = linker.instantiate_pre(&component).map_err(|e| {
            wrong_world(format!(
                "it imports something the hook sandbox does not offer (hooks get WASI and \
                 berth:host/log only): {e:#}"
            ))
        })?;
        let pre = HookPre::new(instance_pre).map_err(|e| {
            wrong_world(format!(
                "it does not export berth:hook/lifecycle@0.1.0 ({e:#})"
            ))
        })?;
        Ok(Hook {
            runtime: runtime.clone(),
            digest,
            spec,
            pre,
        })
    }

    /// The component's SHA-256, as `sha256sum` prints it.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn spec(&self) -> &HookSpec {
        &self.spec
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// `hook "policy" (/etc/berth/policy.wasm)`: how messages name a hook.
    pub fn label(&self) -> String {
        format!("hook {:?} ({})", self.spec.name, self.spec.path.display())
    }

    /// Calls prestart, checks what came back, and writes the hook's files beneath
    /// `local_dir`.
    pub async fn prestart(
        &self,
        context: &HookTaskContext,
        local_dir: &Path,
    ) -> Result<PrestartOutput, HookFailure> {
        let wit_context = self.wit_context(context);
        let response = self
            .call("prestart", local_dir, async |store, b| {
                b.berth_hook_lifecycle()
                    .call_prestart(store, &wit_context)
                    .await
            })
            .await?
            .map_err(|reason| HookFailure::Refused(clip(&reason, Bounds::EVENT_CHARS)))?;
        let output = check_response(&response, &self.spec.quota)?;
        for file in &response.files {
            write_beneath(local_dir, Path::new(&file.path), &file.contents)
                .map_err(|e| HookFailure::Denied(e.to_string()))?;
        }
        Ok(output)
    }

    pub async fn notify(
        &self,
        notification: Notification,
        context: &HookTaskContext,
        local_dir: &Path,
    ) -> Result<(), HookFailure> {
        let wit_context = self.wit_context(context);
        match notification {
            Notification::Poststart => {
                self.call("poststart", local_dir, async |store, b| {
                    b.berth_hook_lifecycle()
                        .call_poststart(store, &wit_context)
                        .await
                })
                .await
            }
            Notification::Stop => {
                self.call("stop", local_dir, async |store, b| {
                    b.berth_hook_lifecycle()
                        .call_stop(store, &wit_context)
                        .await
                })
                .await
            }
            Notification::Exited {
                exit_code,
                signal,
                failed,
            } => {
                let exit = wit::berth::hook::types::ExitInfo {
                    exit_code,
                    signal,
                    failed,
                };
                self.call("exited", local_dir, async |store, b| {
                    b.berth_hook_lifecycle()
                        .call_exited(store, &wit_context, exit)
                        .await
                })
                .await
            }
        }
    }

    fn wit_context(&self, context: &HookTaskContext) -> wit::berth::hook::types::TaskContext {
        wit::berth::hook::types::TaskContext {
            job_name: context.job_name.clone(),
            group_name: context.group_name.clone(),
            task_name: context.task_name.clone(),
            alloc_id: context.alloc_id.clone(),
            driver: context.driver.clone(),
            task_config: context.task_config.clone(),
            env: context.env.clone(),
            meta: context.meta.clone(),
            volumes: context
                .volumes
                .iter()
                .map(
                    |(name, destination, read_only)| wit::berth::hook::types::Volume {
                        name: name.clone(),
                        destination: destination.clone(),
                        read_only: *read_only,
                    },
                )
                .collect(),
            hook_config: self.spec.config.clone(),
        }
    }

    /// One call in a fresh instance with the hook's limits.
    async fn call<R>(
        &self,
        call: &'static str,
        local_dir: &Path,
        body: impl AsyncFnOnce(&mut Store<PluginCtx>, &HookBindings) -> wasmtime::Result<R>,
    ) -> Result<R, HookFailure> {
        let span = tracing::info_span!("plugin_call", plugin = %self.spec.name, function = %call);
        let started = std::time::Instant::now();
        let result = self
            .call_in_span(call, local_dir, body)
            .instrument(span)
            .await;
        self.runtime.metrics().plugin_call(
            "hook",
            &self.spec.name,
            call,
            started.elapsed(),
            result.is_ok(),
        );
        result
    }

    async fn call_in_span<R>(
        &self,
        call: &'static str,
        local_dir: &Path,
        body: impl AsyncFnOnce(&mut Store<PluginCtx>, &HookBindings) -> wasmtime::Result<R>,
    ) -> Result<R, HookFailure> {
        let identity = PluginIdentity {
            name: self.spec.name.as_str().into(),
            may_mount: false,
            // Hooks cannot spawn at all (no berth:host/process); the strictest anyway.
            isolation: berth_model::driver::FsIsolation::Chroot,
            spawns: Some(Vec::new()),
            adoptable: None,
        };
        // Declared before the store, so it is given back after the store is gone. Every
        // hook call is part of running a task: it leaves the slots kept for checks.
        let _slot = self
            .runtime
            .instance_slot(super::SlotUse::Task)
            .await
            .map_err(|no_slot| HookFailure::Fault {
                call,
                fault: Fault::NoInstanceSlot(no_slot.to_string()),
            })?;
        let mut store = sandbox::new_hook_store(
            &self.runtime,
            identity,
            self.spec.timeout,
            self.spec.memory_max,
            local_dir,
        )
        .map_err(|e| HookFailure::Setup(format!("preopening {}: {e}", local_dir.display())))?;
        let run = async {
            let bindings = self.pre.instantiate_async(&mut store).await?;
            store.data_mut().clock.restart();
            body(&mut store, &bindings).await
        };
        // Guest time is bounded by the epoch deadline; the wall-clock bound covers a
        // guest blocked in a WASI wait (a sleep, a poll).
        let outcome = match tokio::time::timeout(self.spec.timeout, run).await {
            Ok(outcome) => outcome,
            Err(_) => {
                return Err(HookFailure::Fault {
                    call,
                    fault: Fault::Deadline(self.spec.timeout),
                });
            }
        };
        outcome.map_err(|error| HookFailure::Fault {
            call,
            fault: sandbox::classify(&error, store.data()),
        })
    }
}

/// Names a hook may not set, exactly: they change how the task's loader, shell or
/// language runtime behaves before the task's own code runs, or what the task is told
/// about itself.
const DENIED_ENV: &[&str] = &[
    "PATH",
    "BASH_ENV",
    "ENV",
    "IFS",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "CDPATH",
    "GLOBIGNORE",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
];

/// Prefixes a hook may not set: the dynamic loader's (`LD_`, and `DYLD_` for good
/// measure), glibc's allocator hooks and Python's interpreter settings; and the variables
/// berth itself gives the task (`berth_model::task_env`).
const DENIED_ENV_PREFIXES: &[&str] = &["LD_", "DYLD_", "MALLOC_", "PYTHON"];

/// Why a hook may not set environment variable `name`, if it may not.
pub fn env_refusal(name: &str) -> Option<String> {
    let well_formed = name.len() <= Bounds::ENV_KEY_BYTES
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Some(format!(
            "a name is 1 to {} of [A-Za-z0-9_], not starting with a digit",
            Bounds::ENV_KEY_BYTES
        ));
    }
    if let Some(prefix) = berth_model::task_env::set_by_berth(name) {
        return Some(format!(
            "{prefix}* variables are set by berth; hooks may not set them"
        ));
    }
    let upper = name.to_ascii_uppercase();
    if DENIED_ENV.contains(&upper.as_str()) {
        return Some(
            "it changes how the task's shell, loader or runtime starts; hooks may not set it"
                .into(),
        );
    }
    DENIED_ENV_PREFIXES
        .iter()
        .find(|prefix| upper.starts_with(*prefix))
        .map(|prefix| {
            format!(
                "{prefix}* variables change how the task's loader or runtime starts; hooks may \
                 not set them"
            )
        })
}

fn check_response(
    response: &wit::berth::hook::types::PrestartResponse,
    quota: &WriteQuota,
) -> Result<PrestartOutput, HookFailure> {
    let too_much = |what: String| Err(HookFailure::TooMuch(what));
    if response.env.len() > Bounds::ENV_VARS {
        return too_much(format!(
            "{} environment variables (at most {})",
            response.env.len(),
            Bounds::ENV_VARS
        ));
    }
    for (key, value) in &response.env {
        if let Some(rule) = env_refusal(key) {
            return Err(HookFailure::Denied(format!(
                "environment variable {:?}: {rule}",
                clip(key, 64)
            )));
        }
        if value.len() > Bounds::ENV_VALUE_BYTES || value.contains('\0') {
            return too_much(format!(
                "environment variable {key} of {} bytes (at most {}, no NUL)",
                value.len(),
                Bounds::ENV_VALUE_BYTES
            ));
        }
    }
    if response.files.len() > Bounds::FILES {
        return too_much(format!(
            "{} files (at most {})",
            response.files.len(),
            Bounds::FILES
        ));
    }
    let mut files = Vec::new();
    let mut bytes = 0u64;
    // Every file and every directory its path needs: the inodes the write may create.
    let mut inodes = std::collections::BTreeSet::new();
    for file in &response.files {
        if file.contents.len() > Bounds::FILE_BYTES {
            return too_much(format!(
                "file {:?} of {} bytes (at most {})",
                clip(&file.path, 128),
                file.contents.len(),
                Bounds::FILE_BYTES
            ));
        }
        let path = checked_relative(&file.path).map_err(|e| HookFailure::Denied(e.to_string()))?;
        bytes = bytes.saturating_add(file.contents.len() as u64);
        inodes.extend(
            path.ancestors()
                .filter(|a| !a.as_os_str().is_empty())
                .map(Path::to_path_buf),
        );
        files.push(path);
    }
    if bytes > quota.bytes {
        return too_much(format!(
            "files of {bytes} bytes in all (this hook's quota_bytes is {})",
            quota.bytes
        ));
    }
    if inodes.len() as u64 > quota.inodes {
        return too_much(format!(
            "files and directories making {} inodes (this hook's quota_inodes is {})",
            inodes.len(),
            quota.inodes
        ));
    }
    if response.events.len() > Bounds::EVENTS {
        return too_much(format!(
            "{} events (at most {})",
            response.events.len(),
            Bounds::EVENTS
        ));
    }
    Ok(PrestartOutput {
        env: response.env.clone(),
        files,
        events: response
            .events
            .iter()
            .map(|e| clip(e, Bounds::EVENT_CHARS))
            .collect(),
    })
}

/// Why a file a hook returned was not written.
#[derive(Debug, thiserror::Error)]
pub enum HookFileError {
    #[error("file path {0:?} is empty or has a NUL")]
    EmptyOrNul(String),
    #[error("file path {0:?} is absolute; paths are relative to local/")]
    Absolute(String),
    #[error("file path {0:?} leaves (or wanders in) local/; use plain names")]
    Wanders(String),
    #[error("file path {0:?} is deeper than {depth} levels", depth = Bounds::PATH_DEPTH)]
    TooDeep(String),
    #[error("file path {0:?} goes through a symlink or out of local/")]
    Escapes(String),
    #[error("file path {0:?} goes through a symlink or a non-directory")]
    NotADirectory(String),
    #[error(
        "file path {0:?} is not a regular file (the task left a FIFO, a device or a socket \
         there): it is not written"
    )]
    NotAFile(String),
    #[error("opening {}: {source}", root.display())]
    OpenRoot {
        root: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {path:?} in local/: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// A path made only of plain names: not absolute, no `..`, no `.`, not too deep.
fn checked_relative(path: &str) -> Result<PathBuf, HookFileError> {
    let shown = clip(path, 128);
    let parsed = Path::new(path);
    if path.is_empty() || path.contains('\0') {
        return Err(HookFileError::EmptyOrNul(shown));
    }
    let mut depth = 0;
    for component in parsed.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::RootDir | Component::Prefix(_) => {
                return Err(HookFileError::Absolute(shown));
            }
            Component::ParentDir | Component::CurDir => {
                return Err(HookFileError::Wanders(shown));
            }
        }
    }
    if depth > Bounds::PATH_DEPTH {
        return Err(HookFileError::TooDeep(shown));
    }
    Ok(parsed.to_path_buf())
}

/// Writes `contents` at `relative` beneath `root`, creating parent directories. The
/// kernel resolves every step beneath `root` and refuses symlinks
/// (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so a link planted in the task dir cannot
/// redirect the write.
pub fn write_beneath(root: &Path, relative: &Path, contents: &[u8]) -> Result<(), HookFileError> {
    let relative = checked_relative(&relative.to_string_lossy())?;
    let shown = relative.display().to_string();
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let refuse = |e: rustix::io::Errno| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::XDEV => HookFileError::Escapes(shown.clone()),
        // O_DIRECTORY | O_NOFOLLOW on a symlink to a directory.
        rustix::io::Errno::NOTDIR => HookFileError::NotADirectory(shown.clone()),
        other => HookFileError::Write {
            path: shown.clone(),
            source: other.into(),
        },
    };
    let mut dir = rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| HookFileError::OpenRoot {
        root: root.to_path_buf(),
        source: e.into(),
    })?;
    let mut parts: Vec<_> = relative.components().collect();
    let name = parts.pop().expect("checked_relative allows no empty path");
    for part in parts {
        let open_dir = |dir: &rustix::fd::OwnedFd| {
            rustix::fs::openat2(
                dir,
                part.as_os_str(),
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                resolve,
            )
        };
        dir = match open_dir(&dir) {
            Ok(next) => next,
            Err(rustix::io::Errno::NOENT) => {
                rustix::fs::mkdirat(&dir, part.as_os_str(), Mode::from_raw_mode(0o755))
                    .map_err(refuse)?;
                open_dir(&dir).map_err(refuse)?
            }
            Err(e) => return Err(refuse(e)),
        };
    }
    use berth_sys::mount::beneath::{WriteOpenError, open_file_for_writing};
    let file = open_file_for_writing(&dir, name.as_os_str(), 0o644).map_err(|e| match e {
        WriteOpenError::NotAFile => HookFileError::NotAFile(shown.clone()),
        WriteOpenError::Open(e) => refuse(e),
    })?;
    // Never executable, also when the hook overwrites a file that was.
    rustix::fs::fchmod(&file, Mode::from_raw_mode(0o644)).map_err(refuse)?;
    let mut file = std::fs::File::from(file);
    std::io::Write::write_all(&mut file, contents).map_err(|source| HookFileError::Write {
        path: shown.clone(),
        source,
    })
}

#[cfg(test)]
mod tests;
