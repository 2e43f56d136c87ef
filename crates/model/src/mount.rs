//! What a task is given to mount: a host path at a task path, read-only or not, with
//! Nomad's propagation modes. The syscalls that carry these out live in `mount/`.

use std::fmt;
use std::path::PathBuf;

/// How mount events propagate between the host and a task's bind mount, by Nomad's
/// names (`mount/` maps them to mount(2) flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Propagation {
    /// `rprivate`: nothing propagates either way.
    Private,
    /// `rslave`: mounts made on the host under the source appear in the task.
    HostToTask,
    /// `rshared`: mounts propagate both ways. Needs a read-write volume.
    Bidirectional,
}

impl Propagation {
    /// The name used in jobspecs.
    pub fn as_str(self) -> &'static str {
        match self {
            Propagation::Private => "private",
            Propagation::HostToTask => "host-to-task",
            Propagation::Bidirectional => "bidirectional",
        }
    }
}

impl fmt::Display for Propagation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mount the host handed to the driver for the task at hand.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandedMount {
    pub host_path: PathBuf,
    pub task_path: PathBuf,
    pub read_only: bool,
    pub propagation: Propagation,
    /// Setuid files and device nodes under it keep their powers in the task: only for a
    /// host volume the operator marked `allow_setuid = true`. Every other mount a task
    /// gets is `nosuid,nodev`.
    #[serde(default)]
    pub allow_setuid: bool,
    /// The host directory `host_path` is below when others write inside it (the CSI
    /// root, which plugins write): the source is then resolved from there through no link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_below: Option<PathBuf>,
}
