//! A cgroup per task run: created with the task's limits before its driver starts it,
//! joined by every process the task's driver spawns (before any other setup step), read
//! for OOM kills when the task exits, and emptied (SIGKILL) and removed when the run
//! ends. So no process of a task outlives it, whatever it forked, and the host, not the
//! driver, says whether the kernel OOM-killed it.
//!
//! The task's cgroup is `<parent>/job-<job>/<alloc id>.<task>` under each hierarchy: a
//! restarted agent finds it again from the names alone. `job-<job>` is the job's level:
//! its `pids.max` (`job_pids_max`) is the job's share of the node-wide ceiling that
//! `<parent>`'s `pids.max` sets, so one job cannot take every pid the node's tasks may
//! have. Beside the tasks in it is each alloc's `<alloc id>-logs`, where the alloc's log
//! collectors run: counted in the job's share, outside every task's memory limit, and
//! killed with the alloc. The job's level is made with the first cgroup in it and removed
//! with the last (under [`JOB_LEVELS`], so that one task's removal never takes the level
//! from under another's start). The file logic for cgroup v1 and v2 is in [`layout`].

pub mod favor;
pub mod layout;
pub mod usage;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::mount::mountinfo;
use berth_model::limits::{CgroupSettings, TaskLimits};
use layout::{Layout, Plan};

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "this node has no cgroup controller for {} ({}), so the task's limits cannot be \
         enforced; an operator may run tasks without them with \
         cgroups {{ allow_missing_controllers = true }} in the agent config",
        missing.join(", "),
        hierarchy
    )]
    MissingControllers {
        missing: Vec<&'static str>,
        hierarchy: String,
    },
    #[error(
        "the cgroup hierarchy at {} is read-only: berth cannot create the task's cgroup \
         there (the agent needs it mounted read-write)",
        path.display()
    )]
    ReadOnly { path: PathBuf },
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error(
        "processes of the task's cgroup {} were still alive after {waited:?} of SIGKILL",
        path.display()
    )]
    Unkillable { path: PathBuf, waited: Duration },
    #[error(
        "cgroups {{ favor_dynmods = true }}: could not {step}: {source}; task starts wait \
         for the kernel's cgroup migration lock as before"
    )]
    Favor {
        step: favor::FavorStep,
        source: io::Error,
    },
}

impl CgroupError {
    /// A directory was missing (a parent removed meanwhile).
    fn is_not_found(&self) -> bool {
        matches!(self, CgroupError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// The error of an I/O `action` on `path` (a read-only cgroupfs said as such).
    pub fn io(action: &'static str, path: &Path, source: io::Error) -> CgroupError {
        if source.raw_os_error() == Some(rustix::io::Errno::ROFS.raw_os_error()) {
            return CgroupError::ReadOnly {
                path: path.to_path_buf(),
            };
        }
        CgroupError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The node's cgroups, as detected at agent start, with the operator's settings.
#[derive(Debug, Clone)]
pub struct Cgroups {
    layout: Option<Layout>,
    settings: CgroupSettings,
}

/// How long to keep killing a cgroup's processes before giving up.
const KILL_PATIENCE: Duration = Duration::from_secs(5);

/// Held while a job's level is made with a cgroup in it, or removed when empty.
static JOB_LEVELS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The job's level under the parent (see the module's comment). A job launched from
/// another (`batch/dispatch-…`, `batch/periodic-…`) is a job of its own, with a share of
/// its own, as in Nomad: its `/` becomes `~`, which no job name may hold, so the level
/// is one directory and two jobs never share one.
pub fn job_dir(job: &str) -> String {
    format!("job-{}", job.replace('/', "~"))
}

impl Cgroups {
    /// Reads the mount table. A node without cgroups gives a value that refuses tasks
    /// (or, if the operator allows it, runs them unlimited).
    pub fn detect(settings: CgroupSettings) -> Cgroups {
        let mounts = mountinfo::read_self().unwrap_or_default();
        let layout = Layout::detect(&mounts, |root| {
            std::fs::read_to_string(root.join("cgroup.controllers")).ok()
        });
        Cgroups { layout, settings }
    }

    pub fn with_layout(layout: Option<Layout>, settings: CgroupSettings) -> Cgroups {
        Cgroups { layout, settings }
    }

    pub fn settings(&self) -> &CgroupSettings {
        &self.settings
    }

    /// For the agent's start-up log and for errors.
    pub fn describe(&self) -> String {
        self.layout
            .as_ref()
            .map(Layout::describe)
            .unwrap_or_else(|| "no cgroup filesystem mounted".into())
    }

    /// The needed controllers the node lacks.
    pub fn missing(&self) -> Vec<&'static str> {
        match &self.layout {
            Some(layout) => layout.missing(),
            None => layout::NEEDED.to_vec(),
        }
    }

    /// Turns on the kernel's `favordynmods` (see [`favor`]), keeping under `keeper` what
    /// a cgroup v1 node needs for it. Returns what it took.
    pub fn favor_dynamic_modifications(
        &self,
        keeper: &Path,
    ) -> Result<Option<favor::FavorStep>, CgroupError> {
        let Some(layout) = &self.layout else {
            return Ok(None);
        };
        let mounts = mountinfo::read_self().unwrap_or_default();
        let step = favor::plan(layout, &mounts, keeper);
        let failed = |source| CgroupError::Favor {
            step: step.clone(),
            source,
        };
        match &step {
            favor::FavorStep::Already { .. } => {}
            favor::FavorStep::ReconfigureUnified { root, options } => {
                let options: Vec<&str> = options.iter().map(String::as_str).collect();
                crate::mount::cgroupfs::reconfigure_cgroup2(root, &options, favor::OPTION)
                    .map_err(failed)?;
            }
            favor::FavorStep::MountNamed { target } => {
                std::fs::create_dir_all(target).map_err(failed)?;
                crate::mount::cgroupfs::mount_named_cgroup1(
                    target,
                    favor::NAMED_HIERARCHY,
                    favor::OPTION,
                )
                .map_err(failed)?;
            }
        }
        Ok(Some(step))
    }

    /// Sets the node-wide ceiling on the processes of all tasks together: `pids.max` of the
    /// parent cgroup (the operator's `all_tasks_pids_max`, else the host's `pid_max` less
    /// a reserve). Returns the ceiling set; `None` on a node without a pids controller.
    pub fn limit_all_tasks(&self) -> Result<Option<u64>, CgroupError> {
        let Some(layout) = &self.layout else {
            return Ok(None);
        };
        let pids_max = self.all_tasks_pids_max();
        let Some((dir, writes)) =
            layout::all_tasks_pids_plan(layout, &self.settings.parent, pids_max)
        else {
            return Ok(None);
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| CgroupError::io("creating the cgroup", &dir, e))?;
        for write in writes {
            std::fs::write(&write.file, &write.value)
                .map_err(|e| CgroupError::io("writing", &write.file, e))?;
        }
        Ok(Some(pids_max))
    }

    /// The node-wide ceiling on all tasks' processes.
    fn all_tasks_pids_max(&self) -> u64 {
        match self.settings.all_tasks_pids_max {
            Some(max) => max,
            None => {
                let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
                    .ok()
                    .and_then(|text| text.trim().parse().ok())
                    .unwrap_or(32_768);
                layout::default_all_tasks_pids(pid_max)
            }
        }
    }

    /// Each job's share of the node-wide ceiling: the operator's `job_pids_max`, else
    /// half of the ceiling.
    pub fn job_pids_max(&self) -> u64 {
        self.settings
            .job_pids_max
            .unwrap_or_else(|| (self.all_tasks_pids_max() / 2).max(8))
    }

    /// The task cgroup's name under the parent: in its job's level.
    pub fn task_name(job: &str, alloc_id: &str, task: &str) -> String {
        format!("{}/{alloc_id}.{task}", job_dir(job))
    }

    /// The name of the cgroup of an alloc's log collectors: beside its tasks' (a task's
    /// name is `<alloc id>.<task>`, so no task's can be this).
    pub fn collectors_name(job: &str, alloc_id: &str) -> String {
        format!("{}/{alloc_id}-logs", job_dir(job))
    }

    /// The job's level above cgroup `name`, when `name` is in one.
    fn job_level(&self, layout: &Layout, plan: &Plan, name: &str) -> Option<JobLevel> {
        let (job, _) = name.split_once('/')?;
        Some(JobLevel {
            dirs: plan.parents.clone(),
            pids_dir: layout::pids_dir(layout, &self.settings.parent, job),
            pids_max: self.job_pids_max(),
        })
    }

    fn task_cgroup(&self, layout: &Layout, plan: Plan, name: &str) -> TaskCgroup {
        TaskCgroup {
            job: self.job_level(layout, &plan, name),
            own_pids_dir: layout::pids_dir(layout, &self.settings.parent, name),
            plan,
        }
    }

    /// The cgroup of an alloc's log collectors (see [`Cgroups::collectors_name`]), made
    /// when missing; one that exists is kept with what runs in it (an earlier run's
    /// collectors, still writing a log).
    pub fn collectors(&self, name: &str) -> Result<TaskCgroup, CgroupError> {
        let Some(layout) = &self.layout else {
            return Ok(TaskCgroup::none());
        };
        let plan = layout::unlimited_plan(layout, &self.settings.parent, name);
        let cgroup = self.task_cgroup(layout, plan, name);
        crate::blocking::run(|| {
            let _levels = JOB_LEVELS.lock().unwrap_or_else(|e| e.into_inner());
            cgroup.build(true)?;
            cgroup.limit_job()
        })?;
        Ok(cgroup)
    }

    /// The collectors' cgroup of an alloc, to empty and remove; nothing is made.
    pub fn existing_collectors(&self, name: &str) -> TaskCgroup {
        match &self.layout {
            Some(layout) => {
                let plan = layout::unlimited_plan(layout, &self.settings.parent, name);
                self.task_cgroup(layout, plan, name)
            }
            None => TaskCgroup::none(),
        }
    }

    /// Creates the cgroup of one task run and writes its limits. A cgroup of the same
    /// name left by an earlier run is emptied and made anew. On failure nothing is left.
    pub fn create(&self, name: &str, limits: &TaskLimits) -> Result<TaskCgroup, CgroupError> {
        let missing = self.missing();
        if !missing.is_empty() && !self.settings.allow_missing_controllers {
            return Err(CgroupError::MissingControllers {
                missing,
                hierarchy: self.describe(),
            });
        }
        let Some(layout) = &self.layout else {
            return Ok(TaskCgroup::none());
        };
        let plan = layout::plan(layout, &self.settings.parent, name, limits);
        let cgroup = self.task_cgroup(layout, plan, name);
        crate::blocking::run(|| {
            cgroup.kill_and_remove()?;
            let mut tries = 0;
            loop {
                let levels = JOB_LEVELS.lock().unwrap_or_else(|e| e.into_inner());
                let built = cgroup.build(false).and_then(|()| cgroup.limit_job());
                drop(levels);
                let Err(error) = built else {
                    return Ok(());
                };
                let _ = cgroup.kill_and_remove();
                tries += 1;
                // Another agent on this host (same parent) removed the job's level, empty
                // a moment, between its making and ours: made again.
                if !error.is_not_found() || tries == 3 {
                    return Err(error);
                }
            }
        })?;
        Ok(cgroup)
    }

    /// The cgroup of a run from before an agent restart, to read and remove; nothing is
    /// created or written. A run an agent without job levels started (before an upgrade)
    /// is found where that agent put it: `<alloc id>.<task>` right under the parent.
    pub fn existing(&self, name: &str, limits: &TaskLimits) -> TaskCgroup {
        let Some(layout) = &self.layout else {
            return TaskCgroup::none();
        };
        let at = |name: &str| {
            let plan = layout::plan(layout, &self.settings.parent, name, limits);
            self.task_cgroup(layout, plan, name)
        };
        let cgroup = at(name);
        if cgroup.exists() {
            return cgroup;
        }
        match name.rsplit_once('/') {
            Some((_, flat)) if at(flat).exists() => at(flat),
            _ => cgroup,
        }
    }
}

impl Cgroups {
    /// What the task cgroup `name` counts as used now; nothing is created or written.
    pub fn usage(&self, name: &str) -> berth_model::usage::CgroupUsage {
        // Where a plan reads does not depend on the limits it would write.
        let limits = TaskLimits {
            memory_bytes: 0,
            memory_soft_bytes: None,
            cpu_shares: 0,
            pids_max: 0,
            restrict_devices: false,
        };
        self.existing(name, &limits).usage()
    }
}

/// The node's memory in bytes (`MemTotal` of `/proc/meminfo`), to refuse a task that
/// asks for more than the node has.
pub fn node_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// One task run's cgroup.
#[derive(Debug, Clone)]
pub struct TaskCgroup {
    plan: Plan,
    /// The job's level it is in.
    job: Option<JobLevel>,
    /// Its own directory in the pids hierarchy.
    own_pids_dir: Option<PathBuf>,
}

/// A job's cgroup (see the module's comment).
#[derive(Debug, Clone)]
struct JobLevel {
    /// Under each hierarchy.
    dirs: Vec<PathBuf>,
    /// Under the pids hierarchy, where its `pids.max` is.
    pids_dir: Option<PathBuf>,
    pids_max: u64,
}

impl TaskCgroup {
    /// No cgroup (a node without cgroups where the operator allowed it).
    fn none() -> TaskCgroup {
        TaskCgroup {
            plan: Plan::empty(),
            job: None,
            own_pids_dir: None,
        }
    }

    /// Makes the directories and writes the limits; `keep_existing`: a directory that
    /// exists is used as it is. Call with [`JOB_LEVELS`] held.
    fn build(&self, keep_existing: bool) -> Result<(), CgroupError> {
        for parent in &self.plan.parents {
            std::fs::create_dir_all(parent)
                .map_err(|e| CgroupError::io("creating the cgroup", parent, e))?;
        }
        for dir in &self.plan.dirs {
            match std::fs::create_dir(dir) {
                Ok(()) => {}
                Err(e) if keep_existing && e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(CgroupError::io("creating the cgroup", dir, e)),
            }
        }
        for write in &self.plan.writes {
            match std::fs::write(&write.file, &write.value) {
                Ok(()) => {}
                Err(error) if write.best_effort => {
                    tracing::debug!(file = %write.file.display(), %error,
                        "optional cgroup setting not applied");
                }
                Err(error) => {
                    return Err(CgroupError::io("writing", &write.file, error));
                }
            }
        }
        Ok(())
    }

    /// Writes the job's share on its level (made by [`TaskCgroup::build`]).
    fn limit_job(&self) -> Result<(), CgroupError> {
        let Some(JobLevel {
            pids_dir: Some(dir),
            pids_max,
            ..
        }) = &self.job
        else {
            return Ok(());
        };
        let file = dir.join("pids.max");
        std::fs::write(&file, pids_max.to_string())
            .map_err(|e| CgroupError::io("writing", &file, e))
    }

    /// Removes the job's level once nothing is left in it: an alloc of the job that
    /// still has a cgroup there keeps it.
    fn remove_job_level_if_empty(&self) {
        let Some(job) = &self.job else {
            return;
        };
        let _levels = JOB_LEVELS.lock().unwrap_or_else(|e| e.into_inner());
        for dir in &job.dirs {
            // EBUSY while another cgroup is in it: then it stays, as it should.
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// `Some(job_pids_max)` when a fork in this cgroup failed and the job's level was at
    /// its `pids.max`: the task was refused processes because its job's share is used
    /// up, not its own limit.
    pub fn job_pids_share_used_up(&self) -> Option<u64> {
        let job_dir = self.job.as_ref()?.pids_dir.as_ref()?;
        let own = self.own_pids_dir.as_ref()?;
        // v2 counts a fork refused here in `pids.events.local`; v1 in `pids.events`.
        let refused = ["pids.events.local", "pids.events"]
            .iter()
            .find_map(|file| std::fs::read_to_string(own.join(file)).ok())
            .and_then(|text| layout::keyed_value(&text, "max"))
            .unwrap_or(0);
        if refused == 0 {
            return None;
        }
        let read = |file: &str| -> Option<u64> {
            std::fs::read_to_string(job_dir.join(file))
                .ok()?
                .trim()
                .parse()
                .ok()
        };
        let max = read("pids.max")?;
        let reached = read("pids.peak").or_else(|| read("pids.current"))?;
        (reached >= max).then_some(max)
    }

    /// The `cgroup.procs` files a process writes itself into to join.
    pub fn procs_files(&self) -> &[PathBuf] {
        &self.plan.procs
    }

    /// How many times the kernel OOM-killed a process of this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let Some((file, key)) = &self.plan.oom_kills else {
            return 0;
        };
        std::fs::read_to_string(file)
            .ok()
            .and_then(|text| layout::keyed_value(&text, key))
            .unwrap_or(0)
    }

    /// The pids in the cgroup now.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .plan
            .procs
            .iter()
            .filter_map(|procs| std::fs::read_to_string(procs).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// SIGKILLs every process in the cgroup until it is empty, then removes its
    /// directories. Blocking (it polls); call from `blocking::run`. A cgroup that does
    /// not exist is fine.
    pub fn kill_and_remove(&self) -> Result<(), CgroupError> {
        let started = Instant::now();
        if let Some(kill) = &self.plan.kill
            && self.plan.dirs.iter().all(|d| d.exists())
        {
            // v2: one write kills the whole subtree, forks in flight included.
            let _ = std::fs::write(kill, "1");
        }
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            if started.elapsed() > KILL_PATIENCE {
                return Err(CgroupError::Unkillable {
                    path: self.plan.dirs[0].clone(),
                    waited: KILL_PATIENCE,
                });
            }
            for pid in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for dir in self.plan.dirs.iter().rev() {
            // A killed process leaves the cgroup a moment after it is gone from
            // `cgroup.procs` as a zombie is reaped: retry EBUSY briefly.
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(e)
                        if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error())
                            && started.elapsed() < KILL_PATIENCE =>
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(CgroupError::io("removing the cgroup", dir, e)),
                }
            }
        }
        self.remove_job_level_if_empty();
        Ok(())
    }

    /// What the task's processes used, as the cgroup counts it.
    pub fn usage(&self) -> berth_model::usage::CgroupUsage {
        usage::read(&self.plan.usage)
    }

    /// Whether any of the cgroup's directories exist.
    pub fn exists(&self) -> bool {
        self.plan.dirs.iter().any(|d| d.exists())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> TaskLimits {
        TaskLimits {
            memory_bytes: 64 << 20,
            memory_soft_bytes: None,
            cpu_shares: 100,
            pids_max: 64,
            restrict_devices: true,
        }
    }

    #[test]
    fn each_job_gets_half_the_node_wide_ceiling_unless_the_operator_says() {
        let half = Cgroups::with_layout(
            None,
            CgroupSettings {
                all_tasks_pids_max: Some(600),
                ..CgroupSettings::default()
            },
        );
        assert_eq!(half.job_pids_max(), 300);
        let set = Cgroups::with_layout(
            None,
            CgroupSettings {
                all_tasks_pids_max: Some(600),
                job_pids_max: Some(500),
                ..CgroupSettings::default()
            },
        );
        assert_eq!(set.job_pids_max(), 500);
        assert_eq!(Cgroups::task_name("web", "a1", "t"), "job-web/a1.t");
        assert_eq!(Cgroups::collectors_name("web", "a1"), "job-web/a1-logs");
        assert_eq!(
            Cgroups::task_name("batch/dispatch-1-ab", "a1", "t"),
            "job-batch~dispatch-1-ab/a1.t"
        );
    }

    /// A dispatched job's cgroups are one level of its own, removed with its last task
    /// (its `/` once made `job-<parent>/<child>`, and the parent's level stayed behind).
    /// On this node's real cgroups, under a parent of the test's own.
    #[test]
    fn a_launched_jobs_level_is_one_directory_removed_with_its_last_cgroup() {
        let parent = format!("berth-unit-{}-levels", std::process::id());
        let cgroups = Cgroups::detect(CgroupSettings {
            parent: parent.clone(),
            ..CgroupSettings::default()
        });
        let Some(layout) = cgroups.layout.clone() else {
            panic!("this test needs the node's cgroups mounted");
        };
        let parent_dirs = layout::plan(&layout, &parent, "x", &limits()).parents;
        /// Removes the test's parents, deepest first, also when an assert failed.
        struct RemoveParents(Vec<PathBuf>);
        impl Drop for RemoveParents {
            fn drop(&mut self) {
                fn remove(dir: &Path) {
                    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                        if entry.path().is_dir() {
                            remove(&entry.path());
                        }
                    }
                    let _ = std::fs::remove_dir(dir);
                }
                self.0.iter().for_each(|dir| remove(dir));
            }
        }
        let _cleanup = RemoveParents(parent_dirs.clone());
        let name = Cgroups::task_name("batch/dispatch-1-ab", "a1", "t");
        let cgroup = cgroups.create(&name, &limits()).unwrap();
        for parent in &parent_dirs {
            let levels: Vec<_> = std::fs::read_dir(parent)
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().into_string().unwrap())
                .collect();
            assert_eq!(
                levels,
                ["job-batch~dispatch-1-ab"],
                "in {}",
                parent.display()
            );
            assert!(parent.join("job-batch~dispatch-1-ab/a1.t").is_dir());
        }
        cgroup.kill_and_remove().unwrap();
        for parent in &parent_dirs {
            let left: Vec<_> = std::fs::read_dir(parent)
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name())
                .collect();
            assert!(left.is_empty(), "left in {}: {left:?}", parent.display());
        }
    }

    /// A task an agent started before job levels existed is found again after an
    /// upgrade, where that agent put it; a task of the new agent is found in its level.
    #[test]
    fn a_run_from_before_job_levels_is_found_where_it_was_made() {
        let root = tempfile::tempdir().unwrap();
        let layout = Layout::Unified {
            root: root.path().into(),
            controllers: vec!["memory".into(), "cpu".into(), "pids".into()],
        };
        let cgroups = Cgroups::with_layout(Some(layout), CgroupSettings::default());
        let parent = root.path().join(&cgroups.settings().parent);
        std::fs::create_dir_all(parent.join("a1.t")).unwrap();
        std::fs::write(parent.join("a1.t/cgroup.procs"), "4242\n").unwrap();
        let name = Cgroups::task_name("web", "a1", "t");
        let old = cgroups.existing(&name, &limits());
        assert_eq!(old.procs_files(), [parent.join("a1.t/cgroup.procs")]);
        assert_eq!(old.pids(), [4242]);
        assert!(old.job.is_none(), "an old run is in no job's level");
        std::fs::create_dir_all(parent.join("job-web/a1.t")).unwrap();
        let new = cgroups.existing(&name, &limits());
        assert_eq!(
            new.procs_files(),
            [parent.join("job-web/a1.t/cgroup.procs")]
        );
    }

    #[test]
    fn a_node_without_cgroups_refuses_tasks_unless_the_operator_allows_it() {
        let strict = Cgroups::with_layout(None, CgroupSettings::default());
        let error = strict.create("a.t", &limits()).unwrap_err();
        assert_eq!(
            error.to_string(),
            "this node has no cgroup controller for memory, cpu, pids (no cgroup filesystem \
             mounted), so the task's limits cannot be enforced; an operator may run tasks \
             without them with cgroups { allow_missing_controllers = true } in the agent config"
        );
        let lenient = Cgroups::with_layout(
            None,
            CgroupSettings {
                allow_missing_controllers: true,
                ..CgroupSettings::default()
            },
        );
        let cgroup = lenient.create("a.t", &limits()).unwrap();
        assert!(cgroup.procs_files().is_empty());
        assert_eq!(cgroup.oom_kills(), 0);
        cgroup.kill_and_remove().unwrap();
    }

    #[test]
    fn a_v2_node_without_pids_names_the_missing_controller() {
        let layout = Layout::Unified {
            root: "/nonexistent".into(),
            controllers: vec!["memory".into(), "cpu".into()],
        };
        let error = Cgroups::with_layout(Some(layout), CgroupSettings::default())
            .create("a.t", &limits())
            .unwrap_err();
        assert!(
            matches!(&error, CgroupError::MissingControllers { missing, .. } if missing == &["pids"]),
            "{error}"
        );
    }

    #[test]
    fn reads_the_nodes_memory() {
        assert!(node_memory().unwrap() > 64 << 20);
    }
}
