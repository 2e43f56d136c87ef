//! `berth:host/process`: the host spawns, waits on and signals processes for drivers.
//!
//! A spawn is checked before anything happens: it must come while the host is asking
//! the driver to start a task; it may not ask for less isolation than the driver
//! declared, nor spawn unconfined unless the operator allows that driver to; its argv
//! and env are bounded; its mounts must be ones the host handed the
//! driver for that task (a driver cannot invent a bind of `/etc`), and a driver that
//! declared mount-configs `none` may pass none at all. The task's user and privilege
//! come from the host (the task scope), never from the driver. A refused request is also
//! recorded as a violation, so the call fails even if the guest swallows the error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bindings::host::process::{self as wit, ExitStatus, Host, ProcessRef, SpawnRequest};
use crate::sandbox::PluginCtx;
use berth_model::driver::{FsIsolation, SpawnIsolation};
use berth_model::mount::{HandedMount, Propagation};
use berth_sys::process::isolation::{ChrootSpec, VolumeMount};
use berth_sys::process::{self as host_process, Isolation, SpawnSpec};

/// Longest single wait a guest may ask for; it can always wait again.
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

impl Host for PluginCtx {
    async fn spawn(
        &mut self,
        request: SpawnRequest,
    ) -> wasmtime::Result<Result<ProcessRef, String>> {
        let spec = match self.check_spawn(request) {
            Ok(spec) => spec,
            Err(refusal) => {
                let refusal = refusal.to_string();
                self.violations.push(refusal.clone());
                return Ok(Err(refusal));
            }
        };
        Ok(self.spawn_checked(spec).map_err(|e| e.to_string()))
    }

    async fn wait(
        &mut self,
        process: ProcessRef,
        timeout_millis: Option<u64>,
    ) -> wasmtime::Result<Result<Option<ExitStatus>, String>> {
        let processes = self.processes.clone();
        let owner = self.plugin.name.clone();
        let timeout = timeout_millis
            .map(Duration::from_millis)
            .unwrap_or(MAX_WAIT)
            .min(MAX_WAIT);
        let waited = self
            .clock
            .exempt(processes.wait(&owner, from_wit_ref(process), Some(timeout)))
            .await;
        Ok(waited
            .map(|status| {
                status.map(|s| ExitStatus {
                    code: s.code,
                    signal: s.signal,
                })
            })
            .map_err(|e| e.to_string()))
    }

    async fn signal(
        &mut self,
        process: ProcessRef,
        signal: String,
    ) -> wasmtime::Result<Result<(), String>> {
        Ok(self
            .processes
            .signal(&self.plugin.name, from_wit_ref(process), &signal)
            .map_err(|e| e.to_string()))
    }

    async fn adopt(&mut self, process: ProcessRef) -> wasmtime::Result<Result<(), String>> {
        // Outside recovery a driver has no business with processes it did not spawn, and
        // in recovery only with those the host recorded spawning for that task: a guessed
        // pid and start time would otherwise let it signal any host process.
        let driver = self.plugin.name.to_string();
        let refusal = match &self.plugin.adoptable {
            None => Some(SpawnRefusal::AdoptOutsideRecovery {
                driver,
                pid: process.pid,
            }),
            Some(recorded) if !recorded.contains(&from_wit_ref(process)) => {
                Some(SpawnRefusal::AdoptUnrecorded {
                    driver,
                    pid: process.pid,
                })
            }
            Some(_) => None,
        };
        if let Some(refusal) = refusal {
            let refusal = refusal.to_string();
            self.violations.push(refusal.clone());
            return Ok(Err(refusal));
        }
        Ok(self
            .processes
            .adopt(&self.plugin.name, from_wit_ref(process))
            .map_err(|e| e.to_string()))
    }

    async fn task_ends_with(
        &mut self,
        process: ProcessRef,
    ) -> wasmtime::Result<Result<(), String>> {
        // The host will wait on this process for the task: only one this very start
        // spawned, or a driver could make the host watch a process of another task.
        let driver = self.plugin.name.to_string();
        let process = from_wit_ref(process);
        let refusal = if self.task.is_none() {
            Some(SpawnRefusal::EndsWithOutsideTaskStart { driver })
        } else if !self.spawned.contains(&process) {
            Some(SpawnRefusal::EndsWithNotSpawned {
                driver,
                pid: process.pid,
            })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            let refusal = refusal.to_string();
            self.violations.push(refusal.clone());
            return Ok(Err(refusal));
        }
        self.task_ends_with = Some(process);
        Ok(Ok(()))
    }
}

/// Why the host refused a driver's spawn request. The guest gets the text; the call is
/// also failed as a violation, even if the guest ignores the error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SpawnRefusal {
    #[error("driver {driver:?} may only spawn processes while starting a task")]
    OutsideTaskStart { driver: String },
    #[error(
        "driver {driver:?} said which process its task ends with outside start-task: only a \
         task being started can say so"
    )]
    EndsWithOutsideTaskStart { driver: String },
    #[error(
        "driver {driver:?} said its task ends with process {pid}, which it did not spawn while \
         starting this task"
    )]
    EndsWithNotSpawned { driver: String, pid: u32 },
    #[error("spawn needs a program: argv is empty")]
    EmptyArgv,
    #[error(
        "driver {driver:?} tried to adopt process {pid} outside recover-task: a driver adopts \
         only the processes of a task it recovers after an agent restart"
    )]
    AdoptOutsideRecovery { driver: String, pid: u32 },
    #[error(
        "driver {driver:?} tried to adopt process {pid}, which berth did not spawn for the \
         task it recovers: a driver adopts only the processes the host recorded for that task"
    )]
    AdoptUnrecorded { driver: String, pid: u32 },
    #[error(
        "driver {driver:?} asked to mount {} at {} ({}{}), which the host did not hand it for task {task}",
        mount.host_path.display(),
        mount.task_path.display(),
        if mount.read_only { "read-only, " } else { "" },
        mount.propagation
    )]
    MountNotHanded {
        driver: String,
        mount: Box<HandedMount>,
        task: String,
    },
    #[error(
        "driver {driver:?} declared mount-configs \"none\" but asked to mount {host_path} at {task_path}"
    )]
    MountsDeclaredNone {
        driver: String,
        host_path: String,
        task_path: String,
    },
    #[error(
        "driver {driver:?} asked for mounts without isolation: mounts need isolation \"chroot\""
    )]
    MountsWithoutIsolation { driver: String },
    #[error("working dir {0:?} must be absolute inside the task's root")]
    RelativeCwd(PathBuf),
    #[error("program {0:?} must be an absolute path, or a bare name looked up in the task's PATH")]
    RelativeProgram(String),
    #[error(
        "driver {driver:?} declared fs-isolation {declared:?} but asked to spawn without \
         isolation: a driver gets at most the isolation it declared, never less"
    )]
    BelowDeclaredIsolation {
        driver: String,
        declared: FsIsolation,
    },
    #[error(
        "driver {driver:?} asked to spawn with isolation {asked:?}, which it did not declare \
         ({declared}): a driver spawns only as it said it would"
    )]
    Undeclared {
        driver: String,
        asked: &'static str,
        declared: String,
    },
    #[error(
        "driver {driver:?} asked to spawn without isolation (as root, in the host's \
         namespaces), which the operator has not allowed for this driver: plugin \
         {driver:?} {{ allow_unconfined = true }} allows it (for raw_exec, \
         config {{ enabled = true }})"
    )]
    UnconfinedNotAllowed { driver: String },
    #[error(
        "driver {driver:?} asked to spawn with {args} arguments, {vars} environment variables \
         and {bytes} bytes of them (at most {MAX_ARGS} each and {MAX_ARG_BYTES} bytes in all)"
    )]
    TooLarge {
        driver: String,
        args: usize,
        vars: usize,
        bytes: usize,
    },
}

/// The most arguments (and, separately, environment variables) a spawn may carry.
pub(crate) const MAX_ARGS: usize = 4096;
/// The most bytes of arguments and environment together (Linux allows 2 MiB per exec).
pub(crate) const MAX_ARG_BYTES: usize = 1 << 20;

impl PluginCtx {
    /// Spawns what [`PluginCtx::check_spawn`] allowed, recorded as this call's.
    pub(crate) fn spawn_checked(
        &mut self,
        spec: SpawnSpec,
    ) -> Result<ProcessRef, host_process::ProcessError> {
        let (processes, owner) = (self.processes.clone(), self.plugin.name.clone());
        let spawned = self.clock.exempt_work(|| processes.spawn(&owner, &spec));
        if let Ok(process) = &spawned {
            self.spawned.push(*process);
        }
        spawned.map(to_wit_ref)
    }

    pub(crate) fn check_spawn(&self, request: SpawnRequest) -> Result<SpawnSpec, SpawnRefusal> {
        let plugin = &*self.plugin.name;
        let Some(task) = &self.task else {
            return Err(SpawnRefusal::OutsideTaskStart {
                driver: plugin.to_string(),
            });
        };
        if request.argv.is_empty() {
            return Err(SpawnRefusal::EmptyArgv);
        }
        let argv_bytes: usize = request.argv.iter().map(String::len).sum();
        let env_bytes: usize = request.env.iter().map(|(k, v)| k.len() + v.len()).sum();
        if request.argv.len() > MAX_ARGS
            || request.env.len() > MAX_ARGS
            || argv_bytes + env_bytes > MAX_ARG_BYTES
        {
            return Err(SpawnRefusal::TooLarge {
                driver: plugin.to_string(),
                args: request.argv.len(),
                vars: request.env.len(),
                bytes: argv_bytes + env_bytes,
            });
        }
        let mut mounts = Vec::with_capacity(request.mounts.len());
        for asked in &request.mounts {
            let mount = HandedMount {
                host_path: PathBuf::from(&asked.host_path),
                task_path: PathBuf::from(&asked.task_path),
                read_only: asked.read_only,
                propagation: from_wit_propagation(asked.propagation),
                allow_setuid: false,
                source_below: None,
            };
            let handed = task.mounts.iter().find(|h| {
                h.host_path == mount.host_path
                    && h.task_path == mount.task_path
                    && h.propagation == mount.propagation
                    && (mount.read_only || !h.read_only)
            });
            let Some(handed) = handed else {
                return Err(SpawnRefusal::MountNotHanded {
                    driver: plugin.to_string(),
                    mount: Box::new(mount),
                    task: task.task_id.clone(),
                });
            };
            mounts.push(VolumeMount {
                host_path: mount.host_path,
                task_path: mount.task_path,
                read_only: mount.read_only,
                propagation: mount.propagation,
                // The operator's word, from the host's own record, never the driver's.
                allow_setuid: handed.allow_setuid,
                source_below: handed.source_below.clone(),
            });
        }
        if let Some(first) = request.mounts.first().filter(|_| !self.plugin.may_mount) {
            return Err(SpawnRefusal::MountsDeclaredNone {
                driver: plugin.to_string(),
                host_path: first.host_path.clone(),
                task_path: first.task_path.clone(),
            });
        }
        let asked = match request.isolation {
            wit::Isolation::None => SpawnIsolation::None,
            wit::Isolation::Chroot => SpawnIsolation::Chroot,
        };
        if let Some(declared) = (self.plugin.spawns.as_ref()).filter(|d| !d.contains(&asked)) {
            let declared: Vec<String> = (declared.iter())
                .map(|d| format!("{:?}", d.as_str()))
                .collect();
            return Err(SpawnRefusal::Undeclared {
                driver: plugin.to_string(),
                asked: asked.as_str(),
                declared: if declared.is_empty() {
                    "it declared that it spawns nothing".to_string()
                } else {
                    format!("spawn-isolation [{}]", declared.join(", "))
                },
            });
        }
        let isolation = match request.isolation {
            wit::Isolation::None if self.plugin.isolation != FsIsolation::None => {
                return Err(SpawnRefusal::BelowDeclaredIsolation {
                    driver: plugin.to_string(),
                    declared: self.plugin.isolation,
                });
            }
            wit::Isolation::None if !task.allow_unconfined => {
                return Err(SpawnRefusal::UnconfinedNotAllowed {
                    driver: plugin.to_string(),
                });
            }
            wit::Isolation::None => {
                if !mounts.is_empty() {
                    return Err(SpawnRefusal::MountsWithoutIsolation {
                        driver: plugin.to_string(),
                    });
                }
                let cwd = request
                    .cwd
                    .map(PathBuf::from)
                    .unwrap_or_else(|| task.task_dir.clone());
                Isolation::None { cwd }
            }
            wit::Isolation::Chroot => {
                let cwd = PathBuf::from(request.cwd.as_deref().unwrap_or("/"));
                if !cwd.is_absolute() {
                    return Err(SpawnRefusal::RelativeCwd(cwd));
                }
                Isolation::Chroot(ChrootSpec {
                    root: task.task_dir.clone(),
                    cwd,
                    mounts,
                    privileged: task.privileged,
                    mount_refusals: task
                        .privileged
                        .then(|| berth_sys::alloc_dir::mount_refusals_beside(&task.task_dir))
                        .flatten(),
                    etc_files: task.etc_files.clone(),
                    image: None,
                })
            }
        };
        // A bare name is looked up in the task's PATH by the child, after its chroot (as
        // Nomad does); a relative path would depend on the working directory.
        let program = &request.argv[0];
        if program.is_empty() || (!Path::new(program).is_absolute() && program.contains('/')) {
            return Err(SpawnRefusal::RelativeProgram(request.argv[0].clone()));
        }
        Ok(SpawnSpec {
            argv: request.argv,
            env: request.env,
            isolation,
            stdout: task.stdout.clone(),
            stderr: task.stderr.clone(),
            logs: task.logs,
            user: task.user,
            user_namespace: None,
            capabilities: None,
            cgroup_procs: task.cgroup_procs.clone(),
            collector_cgroup_procs: task.collector_cgroup_procs.clone(),
            network_namespace: task.network_namespace.clone(),
        })
    }
}

fn from_wit_ref(process: ProcessRef) -> host_process::ProcessRef {
    host_process::ProcessRef {
        pid: process.pid,
        start_time: process.start_time,
    }
}

fn to_wit_ref(process: host_process::ProcessRef) -> ProcessRef {
    ProcessRef {
        pid: process.pid,
        start_time: process.start_time,
    }
}

fn from_wit_propagation(propagation: wit::Propagation) -> Propagation {
    match propagation {
        wit::Propagation::Private => Propagation::Private,
        wit::Propagation::HostToTask => Propagation::HostToTask,
        wit::Propagation::Bidirectional => Propagation::Bidirectional,
    }
}

pub(crate) fn to_wit_propagation(propagation: Propagation) -> wit::Propagation {
    match propagation {
        Propagation::Private => wit::Propagation::Private,
        Propagation::HostToTask => wit::Propagation::HostToTask,
        Propagation::Bidirectional => wit::Propagation::Bidirectional,
    }
}
