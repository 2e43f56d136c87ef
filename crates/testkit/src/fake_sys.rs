//! A [`Sys`] that does nothing privileged and records every call, in order, for the
//! runners' unit tests (as youki's `TestHelperSyscall`). Cgroups are names in a set:
//! made by `create_cgroup`, gone after `kill_and_remove`; users come from a table.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use berth_model::driver::TaskUser;
use berth_model::limits::{CgroupSettings, TaskLimits};
use berth_sys::cgroup::CgroupError;
use berth_sys::process::users::UserError;
use berth_sys::{RunCgroup, Sys};

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    CreateCgroup { name: String, memory_bytes: u64 },
    ExistingCgroup(String),
    KillAndRemove(String),
    GiveDirs { dirs: Vec<PathBuf>, uid: u32 },
    GiveFile { uid: u32 },
    LookupUser(String),
}

#[derive(Default)]
struct Recorded {
    calls: Vec<Call>,
    live_cgroups: std::collections::BTreeSet<String>,
    oom_kills: BTreeMap<String, u64>,
}

/// The recording fake.
#[derive(Clone)]
pub struct FakeSys {
    recorded: Arc<Mutex<Recorded>>,
    settings: CgroupSettings,
    users: BTreeMap<String, TaskUser>,
    /// `create_cgroup` fails for these names (a full or broken cgroupfs).
    failing_cgroups: Arc<Mutex<Vec<String>>>,
}

impl Default for FakeSys {
    fn default() -> Self {
        FakeSys {
            recorded: Arc::default(),
            settings: CgroupSettings::default(),
            users: [("root", 0, 0), ("nobody", 65534, 65534), ("daemon", 1, 1)]
                .into_iter()
                .map(|(name, uid, gid)| (name.to_string(), TaskUser { uid, gid }))
                .collect(),
            failing_cgroups: Arc::default(),
        }
    }
}

impl FakeSys {
    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.recorded.lock().unwrap().calls.clone()
    }

    /// The cgroups made and not yet removed.
    pub fn live_cgroups(&self) -> Vec<String> {
        self.recorded
            .lock()
            .unwrap()
            .live_cgroups
            .iter()
            .cloned()
            .collect()
    }

    /// Makes the next runs of cgroup `name` report an OOM kill.
    pub fn oom_kill(&self, name: &str) {
        *self
            .recorded
            .lock()
            .unwrap()
            .oom_kills
            .entry(name.to_string())
            .or_default() += 1;
    }

    /// Makes `create_cgroup(name)` fail.
    pub fn fail_cgroup(&self, name: &str) {
        self.failing_cgroups.lock().unwrap().push(name.to_string());
    }

    fn record(&self, call: Call) {
        self.recorded.lock().unwrap().calls.push(call);
    }

    fn cgroup(&self, name: &str) -> Box<dyn RunCgroup> {
        Box::new(FakeCgroup {
            name: name.to_string(),
            sys: self.clone(),
            procs: Vec::new(),
        })
    }
}

impl Sys for FakeSys {
    fn create_cgroup(
        &self,
        name: &str,
        limits: &TaskLimits,
    ) -> Result<Box<dyn RunCgroup>, CgroupError> {
        self.record(Call::CreateCgroup {
            name: name.to_string(),
            memory_bytes: limits.memory_bytes,
        });
        if self
            .failing_cgroups
            .lock()
            .unwrap()
            .iter()
            .any(|n| n == name)
        {
            return Err(CgroupError::io(
                "creating the cgroup",
                std::path::Path::new("/fake").join(name).as_path(),
                io::Error::from(io::ErrorKind::StorageFull),
            ));
        }
        self.recorded
            .lock()
            .unwrap()
            .live_cgroups
            .insert(name.to_string());
        Ok(self.cgroup(name))
    }

    fn existing_cgroup(&self, name: &str, _limits: &TaskLimits) -> Box<dyn RunCgroup> {
        self.record(Call::ExistingCgroup(name.to_string()));
        self.cgroup(name)
    }

    /// Not recorded: the collectors' cgroup is tested on cgroupfs (e2e).
    fn collectors_cgroup(&self, _name: &str) -> Result<Box<dyn RunCgroup>, CgroupError> {
        Ok(Box::new(NoCgroup))
    }

    fn existing_collectors_cgroup(&self, _name: &str) -> Box<dyn RunCgroup> {
        Box::new(NoCgroup)
    }

    /// Nothing is measured here: the real reads are tested on cgroupfs (e2e).
    fn cgroup_usage(&self, _name: &str) -> berth_model::usage::CgroupUsage {
        berth_model::usage::CgroupUsage::default()
    }

    fn missing_controllers(&self) -> Vec<&'static str> {
        Vec::new()
    }

    fn cgroup_settings(&self) -> &CgroupSettings {
        &self.settings
    }

    fn give_dirs(&self, dirs: &[(PathBuf, u32)], user: TaskUser) -> io::Result<()> {
        self.record(Call::GiveDirs {
            dirs: dirs.iter().map(|(path, _)| path.clone()).collect(),
            uid: user.uid,
        });
        Ok(())
    }

    fn give_file(&self, _file: BorrowedFd<'_>, user: TaskUser) -> io::Result<()> {
        self.record(Call::GiveFile { uid: user.uid });
        Ok(())
    }

    fn lookup_user(&self, name: &str) -> Result<TaskUser, UserError> {
        self.record(Call::LookupUser(name.to_string()));
        // By name, or by number as `/etc/passwd`'s lookup does (`user = "0"` is root).
        self.users
            .get(name)
            .or_else(|| {
                let uid: u32 = name.parse().ok()?;
                self.users.values().find(|user| user.uid == uid)
            })
            .copied()
            .ok_or_else(|| UserError::Unknown(name.to_string()))
    }

    fn disk_mechanism(&self) -> berth_sys::disk::Mechanism {
        berth_sys::disk::Mechanism::Unavailable {
            why: "a fake".into(),
        }
    }

    fn limit_alloc_disk(
        &self,
        _alloc_id: &str,
        _root: &std::path::Path,
        _size_mb: u64,
    ) -> Result<berth_sys::disk::AllocDiskLimit, berth_sys::disk::DiskError> {
        Ok(berth_sys::disk::AllocDiskLimit::Measured)
    }

    fn alloc_disk_usage(&self, _root: &std::path::Path) -> Option<berth_sys::disk::DiskUsage> {
        None
    }

    fn release_alloc_disk(
        &self,
        _alloc_id: &str,
        root: &std::path::Path,
        remove_contents: &mut dyn FnMut() -> io::Result<()>,
    ) -> Result<(), berth_sys::disk::DiskError> {
        remove_contents().map_err(|source| berth_sys::disk::DiskError::Io {
            action: "removing",
            path: root.to_path_buf(),
            source,
        })
    }
}

/// A cgroup nothing is recorded for.
#[derive(Debug)]
struct NoCgroup;

impl RunCgroup for NoCgroup {
    fn procs_files(&self) -> &[PathBuf] {
        &[]
    }

    fn oom_kills(&self) -> u64 {
        0
    }

    fn pids(&self) -> Vec<u32> {
        Vec::new()
    }

    fn kill_and_remove(&self) -> Result<(), CgroupError> {
        Ok(())
    }
}

#[derive(Debug)]
struct FakeCgroup {
    name: String,
    sys: FakeSys,
    procs: Vec<PathBuf>,
}

impl std::fmt::Debug for FakeSys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FakeSys")
    }
}

impl RunCgroup for FakeCgroup {
    fn procs_files(&self) -> &[PathBuf] {
        &self.procs
    }

    fn oom_kills(&self) -> u64 {
        let recorded = self.sys.recorded.lock().unwrap();
        recorded.oom_kills.get(&self.name).copied().unwrap_or(0)
    }

    fn pids(&self) -> Vec<u32> {
        Vec::new()
    }

    fn kill_and_remove(&self) -> Result<(), CgroupError> {
        let mut recorded = self.sys.recorded.lock().unwrap();
        recorded.calls.push(Call::KillAndRemove(self.name.clone()));
        recorded.live_cgroups.remove(&self.name);
        Ok(())
    }
}
