//! Plans the mount steps that put a task into its own mount namespace, rooted in its
//! task directory. Planning is pure (it only reads the host's mount table), so the plan
//! can be checked in unit tests without forking.
//!
//! # The root
//!
//! The task directory is bound onto itself, so it is a mount point, and made
//! `nosuid,nodev` (its `local/`, `secrets/` and `tmp/` with it); the system directories,
//! `/dev`, `/alloc` and the volumes are mounted inside it; then the task's init
//! `pivot_root`s into it and detaches the host's root (as runc does). Nothing of the
//! host's tree is left in the namespace, so a task that keeps `CAP_SYS_CHROOT` (a root
//! task) cannot climb out with the `chroot(".."...)` trick: there is no outside to
//! climb to. Every mount a task gets is `nosuid,nodev`, the system directories and
//! read-only volumes also `ro`; a host volume the operator marked `allow_setuid` keeps
//! its setuid files and devices.
//!
//! # Propagation
//!
//! With no bidirectional volume, the task's namespace starts as `rslave` of the host:
//! the task receives the host's mount events but can never send any back. A
//! bidirectional volume must stay a peer of the host's mount, so in that case only the
//! mount holding the task root is made private (as runc does for `rshared` rootfs
//! propagation) and the system directories are made `rslave` one by one.

use std::io;
use std::path::{Path, PathBuf};

use rustix::mount::MountPropagationFlags;

use crate::mount::mountinfo::{self, MountEntry};
use crate::mount::{MountStep, Restriction, Target, beneath, c_path};
use berth_model::mount::Propagation;

/// Host directories bound read-only into every chroot, when the host has them. A
/// directory that is a symlink on the host (`/bin -> usr/bin`) becomes the same symlink.
pub const SYSTEM_DIRS: &[&str] = &[
    "bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc",
];

/// A volume bind mount, already checked against what the driver was handed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    pub host_path: PathBuf,
    /// Absolute path inside the task's root.
    pub task_path: PathBuf,
    pub read_only: bool,
    pub propagation: Propagation,
    /// A directory the source is below, whose contents others write (a CSI plugin's
    /// publish tree): the source is then resolved through no link from it.
    pub source_below: Option<PathBuf>,
    /// Not `nosuid,nodev` ([`HandedMount::allow_setuid`]).
    ///
    /// [`HandedMount::allow_setuid`]: berth_model::mount::HandedMount::allow_setuid
    pub allow_setuid: bool,
}

/// Everything needed to put a task in its own root.
#[derive(Debug, Clone)]
pub struct ChrootSpec {
    /// Host path of the task directory, which becomes `/`.
    pub root: PathBuf,
    /// Working directory inside the root.
    pub cwd: PathBuf,
    pub mounts: Vec<VolumeMount>,
    /// May mount (bind mounts only): only for a CSI plugin the operator granted it to, in
    /// `csi { privileged_plugin }` for its job. It keeps `CAP_SYS_ADMIN`
    /// ([`super::confine::Confinement::MountingPlugin`]) and sees no kernel settings in
    /// `/proc`.
    pub privileged: bool,
    /// A privileged task's file (outside its root) where its mount warden writes the
    /// mounts it refused, one line each, for the task's events.
    pub mount_refusals: Option<PathBuf>,
    /// Files the host wrote for the task's group (its `resolv.conf`, its `hosts`), each
    /// bound read-only over the file of its name in the task's `/etc` (the host's,
    /// bound read-only), a link there included.
    pub etc_files: Vec<PathBuf>,
    /// The task's root is an image's layers under an overlayfs at `root`, not the task
    /// directory with the host's system directories.
    pub image: Option<ImageRoot>,
}

/// An image's root for one task: the store's layers, read-only and shared, and the
/// task's own upper and work directories (in its alloc's dir: its writes count against
/// the alloc's disk and go with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRoot {
    /// The layers' directories, the top first.
    pub lower: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// The host's ids of root in the task's user namespace, when it has one: the layers
    /// are then mounted idmapped through it, and what the host makes in the upper
    /// directory (its root, `etc/`, mount points) is root's inside.
    pub owner: Option<berth_model::driver::TaskUser>,
}

/// The files every image root gets in its `/etc`, covered by the group's or the host's.
pub const IMAGE_ETC_FILES: &[&str] = &["hosts", "resolv.conf"];

/// The steps of a chroot, split where the task's process forks into its pid namespace
/// ([`super::shim`]): a fresh `/proc` must be mounted from inside that namespace.
#[derive(Debug, Clone)]
pub struct ChrootPlan {
    /// Run by the shim: namespaces, system directories, `/dev`, volumes.
    pub before_fork: Vec<MountStep>,
    /// Run by the task, pid 1 of its namespace: `/proc`, then the chroot.
    pub after_fork: Vec<MountStep>,
}

/// Prepares the task root on the host (mount point directories, system symlinks) and
/// returns the steps the child runs after `fork`.
pub fn prepare(spec: &ChrootSpec) -> io::Result<ChrootPlan> {
    if let Some(image) = &spec.image {
        return prepare_image(spec, image);
    }
    let root = spec
        .root
        .canonicalize()
        .map_err(|e| io::Error::new(e.kind(), format!("task dir {}: {e}", spec.root.display())))?;
    let mut system = Vec::new();
    // A root task may have replaced anything in its root on an earlier run (its `usr`
    // with a link to /etc, say): nothing here follows a link ([`beneath`]).
    for name in SYSTEM_DIRS {
        let host = Path::new("/").join(name);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let inside = root.join(name);
            if std::fs::symlink_metadata(&inside).is_err() {
                std::os::unix::fs::symlink(std::fs::read_link(&host)?, &inside)?;
            }
        } else if meta.is_dir() {
            beneath::create(&root, Path::new(name), false, 0o755)?;
            system.push(host);
        }
    }
    for dir in ["dev", "proc", "tmp"] {
        beneath::create(&root, Path::new(dir), false, 0o755)?;
    }
    for mount in &spec.mounts {
        create_mount_point(&root, mount)?;
    }
    plan(&root, &host_mounts_if_needed(spec)?, &system, spec)
}

/// The host's mount table, read only when a bidirectional mount needs it (to find the
/// mount that holds the root). Read for every task, it cost each start a walk of every
/// mount on the node: with a thousand allocs' disk images mounted, a millisecond per start.
fn host_mounts_if_needed(spec: &ChrootSpec) -> io::Result<Vec<MountEntry>> {
    let bidirectional = spec
        .mounts
        .iter()
        .any(|m| m.propagation == Propagation::Bidirectional);
    if bidirectional {
        mountinfo::read_self()
    } else {
        Ok(Vec::new())
    }
}

/// An image root: its mount points are made in the task's upper directory (the merged
/// root exists only in the task's namespace), through no link: the task wrote that
/// directory on an earlier run.
/// The file in a task's image dir (`<task dir>/image/`) listing the layers it uses.
pub const IMAGE_LAYERS_FILE: &str = "layers";

fn prepare_image(spec: &ChrootSpec, image: &ImageRoot) -> io::Result<ChrootPlan> {
    use std::os::unix::fs::DirBuilderExt;
    // The image's dir (`<task dir>/image`) is the agent's alone: a setuid file the task
    // copies up lands in its upper dir, and no host user may reach it there. The
    // overlay reaches it with its mounter's (root's) credentials.
    if let Some(dir) = image.upper.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
        let dir = crate::alloc_dir::open_dir_nofollow(dir)?;
        rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(0o700))?;
        // The layers this task stands on, one per line: the image store's garbage
        // collection keeps them while the task's dir is on the node.
        let mut list = String::new();
        for lower in &image.lower {
            list.push_str(&lower.to_string_lossy());
            list.push('\n');
        }
        let file = beneath::open_file_for_writing(&dir, IMAGE_LAYERS_FILE, 0o600)
            .map_err(|e| io::Error::other(format!("{IMAGE_LAYERS_FILE}: {e}")))?;
        io::Write::write_all(&mut std::fs::File::from(file), list.as_bytes())?;
    }
    for dir in [&spec.root, &image.upper, &image.work] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    }
    let mut made = vec![PathBuf::from(".")];
    for dir in ["dev", "proc", "etc"] {
        beneath::create(&image.upper, Path::new(dir), false, 0o755)?;
        made.push(dir.into());
    }
    for name in IMAGE_ETC_FILES {
        let file = Path::new("etc").join(name);
        beneath::create(&image.upper, &file, true, 0o644)?;
        made.push(file);
    }
    // The working dir is made only when the image has none there, as Docker makes a
    // missing one: a dir made in the upper dir would hide the image's own (its mode,
    // `/tmp`'s 1777 say).
    let cwd = spec.cwd.strip_prefix("/").unwrap_or(&spec.cwd);
    let in_image = |lower: &PathBuf| beneath::something_at(lower, cwd);
    if !cwd.as_os_str().is_empty() && !image.lower.iter().any(in_image) {
        beneath::create(&image.upper, cwd, false, 0o755)?;
        made.extend(
            cwd.ancestors()
                .filter(|a| !a.as_os_str().is_empty())
                .map(Path::to_path_buf),
        );
    }
    for mount in &spec.mounts {
        create_mount_point(&image.upper, mount)?;
    }
    if let Some(owner) = image.owner {
        // In the upper dir these hide the image's own: root's inside, as the image's are
        // (a mount point only shows while its mount covers it).
        let upper = c_path(&image.upper)?;
        let upper = beneath::open_root(&upper)?;
        for relative in &made {
            let entry = beneath::open_unfollowed(&upper, &c_path(relative)?)?;
            rustix::fs::chownat(
                &entry,
                "",
                Some(rustix::fs::Uid::from_raw(owner.uid)),
                Some(rustix::fs::Gid::from_raw(owner.gid)),
                rustix::fs::AtFlags::EMPTY_PATH | rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
    }
    plan(&spec.root, &host_mounts_if_needed(spec)?, &[], spec)
}

/// Creates the mount point for `mount` inside `root` without following a link (one
/// planted by an earlier run of the task, say) and without leaving the root.
fn create_mount_point(root: &Path, mount: &VolumeMount) -> io::Result<()> {
    // Jobspecs refuse `..` in task paths already; refuse it here too, before the first
    // directory is created, whoever built the mount.
    let climbs = mount
        .task_path
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir));
    if climbs {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "mount point {} climbs out of the task dir ('..')",
                mount.task_path.display()
            ),
        ));
    }
    let relative = mount
        .task_path
        .strip_prefix("/")
        .unwrap_or(&mount.task_path);
    let file = !mount.host_path.is_dir();
    beneath::create(root, relative, file, 0o755).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("mount point {}: {e}", mount.task_path.display()),
        )
    })
}

/// The devices a task gets: a fresh tmpfs at `/dev` with the harmless character devices,
/// a private devpts, its own shm, and the usual links. Never the host's `/dev` (its disks).
pub const TASK_DEVICES: &[(&str, u32, u32)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

fn minimal_dev(root: &Path, steps: &mut Vec<MountStep>) -> io::Result<()> {
    let dev = root.join("dev");
    steps.push(MountStep::MountTmpfs {
        target: Target::beneath(root, &dev)?,
        options: c"mode=755,size=1024k".into(),
        noexec: false,
    });
    for (name, major, minor) in TASK_DEVICES {
        steps.push(MountStep::MakeDevice {
            path: c_path(dev.join(name))?,
            major: *major,
            minor: *minor,
        });
    }
    for dir in ["pts", "shm"] {
        steps.push(MountStep::MakeDir {
            path: c_path(dev.join(dir))?,
        });
    }
    steps.push(MountStep::MountDevpts {
        target: c_path(dev.join("pts"))?,
    });
    // Inside the fresh tmpfs just mounted: nothing of the task's is there.
    steps.push(MountStep::MountTmpfs {
        target: Target::path(dev.join("shm"))?,
        options: c"mode=1777,size=65536k".into(),
        noexec: true,
    });
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        steps.push(MountStep::Symlink {
            target: c_path(target)?,
            link: c_path(dev.join(link))?,
        });
    }
    Ok(())
}

/// What a task may not change or read in `/proc` (as container runtimes do): kernel
/// settings are read-only (root owns `/proc/sys/kernel/core_pattern`, and writing it would
/// run a program on the host), and what leaks kernel memory or keys is hidden.
fn protect_proc(root: &Path, steps: &mut Vec<MountStep>) -> io::Result<()> {
    let proc = root.join("proc");
    for read_only in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        steps.push(MountStep::ProtectReadOnly {
            target: c_path(proc.join(read_only))?,
        });
    }
    for (masked, directory) in [
        ("kcore", false),
        ("keys", false),
        ("timer_list", false),
        ("sched_debug", false),
        ("acpi", true),
        ("scsi", true),
    ] {
        steps.push(MountStep::Mask {
            target: c_path(proc.join(masked))?,
            directory,
        });
    }
    Ok(())
}

/// `root` joined with an absolute task path.
fn join_inside(root: &Path, task_path: &Path) -> PathBuf {
    root.join(task_path.strip_prefix("/").unwrap_or(task_path))
}

/// The steps, from already-prepared directories. `system` are host dirs to bind;
/// `host_mounts` the host's mount table, needed (and read) only for a bidirectional mount.
fn plan(
    root: &Path,
    host_mounts: &[MountEntry],
    system: &[PathBuf],
    spec: &ChrootSpec,
) -> io::Result<ChrootPlan> {
    let bidirectional = spec
        .mounts
        .iter()
        .any(|m| m.propagation == Propagation::Bidirectional);
    let slave_rec = MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC;
    let root_c = c_path(root)?;
    let mut steps = vec![MountStep::UnshareNamespace, MountStep::UnshareIpcUtsPid];
    if bidirectional {
        let parent = mountinfo::containing_mount(host_mounts, root)
            .map(|m| m.mount_point.clone())
            .unwrap_or_else(|| PathBuf::from("/"));
        steps.push(MountStep::SetPropagation {
            target: Target::path(parent)?,
            flags: MountPropagationFlags::PRIVATE,
        });
    } else {
        steps.push(MountStep::SetPropagation {
            target: Target::Path(c"/".into()),
            flags: slave_rec,
        });
    }
    if let Some(image) = &spec.image {
        // The image's overlay is the root's mount point (and nosuid, nodev).
        steps.push(MountStep::MountOverlay {
            target: root_c.clone(),
            lower: image
                .lower
                .iter()
                .map(c_path)
                .collect::<io::Result<Vec<_>>>()?,
            upper: c_path(&image.upper)?,
            work: c_path(&image.work)?,
            idmapped: image.owner.is_some(),
        });
    } else {
        // The root becomes a mount point (pivot_root needs one), before anything is
        // mounted inside it.
        steps.push(MountStep::BindRecursive {
            source: Target::Path(root_c.clone()),
            target: Target::Path(root_c.clone()),
        });
        steps.push(MountStep::Restrict {
            target: Target::Path(root_c.clone()),
            restrict: Restriction::WRITABLE,
        });
    }
    // Every mount point inside the root is resolved when the step runs, through no link:
    // the task writes its root, the alloc's dir and its volumes, and may have planted a
    // link on an earlier run (or a sibling task, through /alloc) to redirect a mount onto
    // the host.
    let mut bind_system = |source: &Path| -> io::Result<()> {
        let target = Target::beneath(root, &join_inside(root, source))?;
        steps.push(MountStep::BindRecursive {
            source: Target::path(source)?,
            target: target.clone(),
        });
        steps.push(MountStep::Restrict {
            target: target.clone(),
            restrict: Restriction::READ_ONLY,
        });
        if bidirectional {
            steps.push(MountStep::SetPropagation {
                target,
                flags: slave_rec,
            });
        }
        Ok(())
    };
    for dir in system {
        bind_system(dir)?;
    }
    if spec.image.is_some() || system.iter().any(|dir| dir == Path::new("/etc")) {
        for file in &spec.etc_files {
            let name = file.file_name().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} names no file for /etc", file.display()),
                )
            })?;
            steps.push(MountStep::CoverFile {
                source: c_path(file)?,
                root: root_c.clone(),
                relative: c_path(Path::new("etc").join(name))?,
            });
        }
    }
    minimal_dev(root, &mut steps)?;
    for mount in &spec.mounts {
        let target = Target::beneath(root, &join_inside(root, &mount.task_path))?;
        let source = match &mount.source_below {
            Some(trusted) => Target::beneath(trusted, &mount.host_path)?,
            None => Target::path(&mount.host_path)?,
        };
        steps.push(MountStep::BindRecursive {
            source,
            target: target.clone(),
        });
        let restrict = Restriction {
            read_only: mount.read_only,
            nosuid_nodev: !mount.allow_setuid,
        };
        if restrict
            != (Restriction {
                read_only: false,
                nosuid_nodev: false,
            })
        {
            steps.push(MountStep::Restrict {
                target: target.clone(),
                restrict,
            });
        }
        steps.push(MountStep::SetPropagation {
            target,
            flags: crate::mount::propagation_flags(mount.propagation),
        });
    }
    // A task that may mount must not find the kernel's settings in /proc: it could
    // unmount their read-only cover. It gets its processes' entries only.
    let mut after_fork = vec![MountStep::MountProc {
        target: Target::beneath(root, &root.join("proc"))?,
        pids_only: spec.privileged,
    }];
    protect_proc(root, &mut after_fork)?;
    after_fork.push(MountStep::PivotRoot {
        root: root_c,
        cwd: c_path(&spec.cwd)?,
    });
    Ok(ChrootPlan {
        before_fork: steps,
        after_fork,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(propagation: Propagation, read_only: bool) -> VolumeMount {
        VolumeMount {
            host_path: "/srv/data".into(),
            task_path: "/local/data".into(),
            read_only,
            propagation,
            source_below: None,
            allow_setuid: false,
        }
    }

    fn steps_for(mounts: Vec<VolumeMount>) -> Vec<String> {
        let host = mountinfo::parse(
            "1 0 8:1 / / rw shared:1 - ext4 /dev/vda rw\n2 1 0:3 / /tmp rw shared:2 - tmpfs t rw\n",
        );
        let spec = ChrootSpec {
            root: "/tmp/t".into(),
            cwd: "/".into(),
            mounts,
            privileged: false,
            mount_refusals: None,
            etc_files: Vec::new(),
            image: None,
        };
        let plan = plan(Path::new("/tmp/t"), &host, &[PathBuf::from("/usr")], &spec).unwrap();
        let mut steps: Vec<String> = plan.before_fork.iter().map(ToString::to_string).collect();
        steps.push(FORK.into());
        steps.extend(plan.after_fork.iter().map(ToString::to_string));
        steps
    }

    const FORK: &str = "(fork into the pid namespace)";

    /// The group's files cover the host's in the task's `/etc`: after `/etc` is bound
    /// (so they land on it, not under it), before the root is pivoted into.
    #[test]
    fn group_etc_files_cover_the_hosts_after_etc_is_bound() {
        let spec = ChrootSpec {
            root: "/tmp/t".into(),
            cwd: "/".into(),
            mounts: Vec::new(),
            privileged: false,
            mount_refusals: None,
            etc_files: vec!["/data/allocs/a/etc/hosts".into()],
            image: None,
        };
        let system = [PathBuf::from("/usr"), PathBuf::from("/etc")];
        let plan = plan(Path::new("/tmp/t"), &[], &system, &spec).unwrap();
        let steps: Vec<String> = plan.before_fork.iter().map(ToString::to_string).collect();
        let bound = steps
            .iter()
            .position(|s| s == "bind /etc to /tmp/t/etc")
            .unwrap();
        let covered = steps
            .iter()
            .position(|s| s == "cover /tmp/t/etc/hosts with /data/allocs/a/etc/hosts (read-only)")
            .unwrap_or_else(|| panic!("{steps:#?}"));
        assert!(bound < covered, "{steps:#?}");
        // Without a bound /etc there is nothing to cover.
        let plan = plan_without_etc(&spec);
        assert!(!plan.iter().any(|s| s.starts_with("cover")), "{plan:#?}");
    }

    /// An image root is its overlay (no bind of the task dir, no host directory), with
    /// the group's files over its `/etc` and the task's dirs bound in, then `/proc` and
    /// the pivot.
    #[test]
    fn an_image_root_is_its_overlay_with_the_tasks_dirs_and_no_host_directory() {
        let spec = ChrootSpec {
            root: "/a/t/image/root".into(),
            cwd: "/srv".into(),
            mounts: vec![VolumeMount {
                host_path: "/a/t/local".into(),
                task_path: "/local".into(),
                ..volume(Propagation::Private, false)
            }],
            privileged: false,
            mount_refusals: None,
            etc_files: vec!["/a/etc/hosts".into()],
            image: Some(ImageRoot {
                lower: vec!["/images/layers/b".into(), "/images/layers/a".into()],
                upper: "/a/t/image/upper".into(),
                work: "/a/t/image/work".into(),
                owner: None,
            }),
        };
        let plan = plan(Path::new("/a/t/image/root"), &[], &[], &spec).unwrap();
        let steps: Vec<String> = plan.before_fork.iter().map(ToString::to_string).collect();
        let MountStep::MountOverlay { lower, .. } = &plan.before_fork[3] else {
            panic!("{steps:#?}");
        };
        assert_eq!(
            lower[0].to_str().unwrap(),
            "/images/layers/b",
            "the top first"
        );
        assert!(
            !steps.iter().any(|s| s.starts_with("bind /a/t/image/root")),
            "{steps:#?}"
        );
        assert!(
            !steps.iter().any(|s| s.starts_with("bind /usr")),
            "{steps:#?}"
        );
        for expected in [
            "cover /a/t/image/root/etc/hosts with /a/etc/hosts (read-only)",
            "bind /a/t/local to /a/t/image/root/local",
        ] {
            assert!(
                steps.iter().any(|s| s == expected),
                "{expected}: {steps:#?}"
            );
        }
        let last = plan.after_fork.last().unwrap().to_string();
        assert!(last.contains("/a/t/image/root"), "{last}");
    }

    #[test]
    fn an_image_keeps_its_own_working_dir_and_a_missing_one_is_made_in_the_upper_dir() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("layer");
        std::fs::create_dir_all(lower.join("tmp")).unwrap();
        std::fs::set_permissions(lower.join("tmp"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        std::os::unix::fs::symlink("/etc", lower.join("link")).unwrap();
        let image = ImageRoot {
            lower: vec![lower],
            upper: dir.path().join("t/image/upper"),
            work: dir.path().join("t/image/work"),
            owner: None,
        };
        let spec = |cwd: &str| ChrootSpec {
            root: dir.path().join("t/image/root"),
            cwd: cwd.into(),
            mounts: Vec::new(),
            privileged: false,
            mount_refusals: None,
            etc_files: Vec::new(),
            image: Some(image.clone()),
        };
        for cwd in ["/tmp", "/link/deeper", "/srv/app"] {
            prepare_image(&spec(cwd), &image).unwrap();
        }
        let upper = &image.upper;
        assert!(
            !upper.join("tmp").exists(),
            "the image's /tmp (1777) is not hidden"
        );
        assert!(
            !upper.join("link").exists(),
            "nor is anything behind its links"
        );
        assert!(
            upper.join("srv/app").is_dir(),
            "a missing working dir is made"
        );
        let listed = std::fs::read_to_string(dir.path().join("t/image/layers")).unwrap();
        assert_eq!(listed, format!("{}\n", image.lower[0].display()));
        let mode = std::fs::metadata(dir.path().join("t/image"))
            .unwrap()
            .permissions();
        assert_eq!(
            mode.mode() & 0o777,
            0o700,
            "no host user reaches the upper dir"
        );
    }

    fn plan_without_etc(spec: &ChrootSpec) -> Vec<String> {
        plan(Path::new("/tmp/t"), &[], &[PathBuf::from("/usr")], spec)
            .unwrap()
            .before_fork
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn proc_is_mounted_after_the_fork_into_the_pid_namespace() {
        let steps = steps_for(vec![volume(Propagation::Private, true)]);
        let fork = steps.iter().position(|s| s == FORK).unwrap();
        let proc = steps
            .iter()
            .position(|s| s == "mount proc at /tmp/t/proc")
            .unwrap();
        let pivot = steps
            .iter()
            .position(|s| s.starts_with("pivot_root"))
            .unwrap();
        assert!(fork < proc && proc < pivot, "{steps:#?}");
        let volume = steps
            .iter()
            .position(|s| s == "bind /srv/data to /tmp/t/local/data")
            .unwrap();
        assert!(volume < fork, "volumes are mounted by the shim: {steps:#?}");
    }

    #[test]
    fn without_bidirectional_the_namespace_is_a_slave_of_the_host() {
        let steps = steps_for(vec![volume(Propagation::Private, true)]);
        assert_eq!(steps[0], "create a mount namespace");
        assert_eq!(steps[1], "create IPC, UTS and PID namespaces");
        assert_eq!(
            steps[2],
            "set propagation MountPropagationFlags(DOWNSTREAM | REC) on /"
        );
        assert!(steps.contains(&"bind /usr to /tmp/t/usr".to_string()));
        assert!(steps.contains(&"make /tmp/t/usr read-only, nosuid, nodev".to_string()));
        let bind = steps
            .iter()
            .position(|s| s == "bind /srv/data to /tmp/t/local/data")
            .unwrap();
        assert_eq!(
            steps[bind + 1],
            "make /tmp/t/local/data read-only, nosuid, nodev"
        );
        assert_eq!(
            steps[bind + 2],
            "set propagation MountPropagationFlags(PRIVATE | REC) on /tmp/t/local/data"
        );
        assert_eq!(
            steps.last().unwrap(),
            "pivot_root into /tmp/t (working dir /)"
        );
    }

    #[test]
    fn bidirectional_keeps_the_volume_a_peer_and_privatises_only_the_root_mount() {
        let steps = steps_for(vec![volume(Propagation::Bidirectional, false)]);
        assert_eq!(
            steps[2],
            "set propagation MountPropagationFlags(PRIVATE) on /tmp"
        );
        assert!(steps.contains(
            &"set propagation MountPropagationFlags(DOWNSTREAM | REC) on /tmp/t/usr".to_string()
        ));
        assert!(steps.contains(
            &"set propagation MountPropagationFlags(SHARED | REC) on /tmp/t/local/data".to_string()
        ));
        assert!(steps.contains(&"make /tmp/t/local/data nosuid, nodev".to_string()));
    }

    #[test]
    fn the_root_is_its_own_nosuid_mount_before_anything_is_mounted_in_it() {
        let steps = steps_for(vec![volume(Propagation::Private, false)]);
        let root = steps
            .iter()
            .position(|s| s == "bind /tmp/t to /tmp/t")
            .unwrap_or_else(|| panic!("{steps:#?}"));
        assert_eq!(steps[root + 1], "make /tmp/t nosuid, nodev");
        let first_inside = steps
            .iter()
            .position(|s| s.starts_with("bind /usr") || s.starts_with("mount a tmpfs"))
            .unwrap();
        assert!(root < first_inside, "{steps:#?}");
        // Every mount of the plan is restricted: writable ones nosuid,nodev.
        assert!(steps.contains(&"make /tmp/t/local/data nosuid, nodev".to_string()));
    }

    #[test]
    fn a_volume_the_operator_allows_setuid_on_keeps_it() {
        let mut allowed = volume(Propagation::Private, false);
        allowed.allow_setuid = true;
        let steps = steps_for(vec![allowed]);
        assert!(
            !steps
                .iter()
                .any(|s| s.starts_with("make /tmp/t/local/data")),
            "{steps:#?}"
        );
        let mut read_only = volume(Propagation::Private, true);
        read_only.allow_setuid = true;
        let steps = steps_for(vec![read_only]);
        assert!(steps.contains(&"make /tmp/t/local/data read-only".to_string()));
    }

    #[test]
    fn the_task_gets_its_own_dev_and_a_proc_it_cannot_change() {
        let steps = steps_for(Vec::new());
        assert!(
            !steps.iter().any(|s| s.starts_with("bind /dev")),
            "the host's /dev is bound into the task: {steps:#?}"
        );
        let dev = steps
            .iter()
            .position(|s| s == "mount a tmpfs at /tmp/t/dev")
            .unwrap();
        for (name, major, minor) in TASK_DEVICES {
            assert!(steps.contains(&format!(
                "create device {major}:{minor} at /tmp/t/dev/{name}"
            )));
        }
        let devices: Vec<&String> = steps
            .iter()
            .filter(|s| s.starts_with("create device"))
            .collect();
        assert_eq!(devices.len(), TASK_DEVICES.len(), "{devices:#?}");
        assert!(steps[dev..].contains(&"mount devpts at /tmp/t/dev/pts".to_string()));
        let proc = steps
            .iter()
            .position(|s| s == "mount proc at /tmp/t/proc")
            .unwrap();
        assert!(steps[proc..].contains(&"make /tmp/t/proc/sys read-only".to_string()));
        assert!(steps[proc..].contains(&"mask /tmp/t/proc/kcore".to_string()));
    }
}
