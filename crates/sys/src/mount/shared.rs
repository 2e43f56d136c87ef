//! Shared subtrees on the host: a directory made a shared mount so that what a plugin
//! mounts below it inside its own mount namespace (bidirectional propagation) appears on
//! the host, and released once nothing is mounted below it. Used for `<data_dir>/csi`.

use std::ffi::CString;
use std::io;
use std::path::Path;

use rustix::mount::{self, MountPropagationFlags, UnmountFlags};

use super::mountinfo;

/// Makes `root` a shared mount (bound onto itself first if it is not a mount point), so
/// mounts made below it in a plugin's namespace propagate to the host.
pub fn ensure_shared(root: &Path) -> io::Result<()> {
    std::fs::create_dir_all(root)?;
    let root = root.canonicalize()?;
    let mounts = mountinfo::read_self()?;
    let here = mounts.iter().rev().find(|m| m.mount_point == root);
    match here {
        Some(entry) if entry.shared_group().is_some() => return Ok(()),
        Some(_) => {}
        None => mount::mount_bind(&root, &root)?,
    }
    mount::mount_change(&root, MountPropagationFlags::SHARED)?;
    Ok(())
}

/// Whether anything is mounted at or below `path` (other than `path` itself).
pub fn mounted_below(path: &Path) -> io::Result<bool> {
    let path = match path.canonicalize() {
        Ok(path) => path,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(mountinfo::read_self()?
        .iter()
        .any(|m| m.mount_point != path && m.mount_point.starts_with(&path)))
}

/// Whether `path` is itself a mount point. A path that passes through a link is not one:
/// a plugin that left a link at its publish path (to `/`, say) must not make the agent
/// take the link's target for the volume, nor unmount it.
pub fn is_mount_point(path: &Path) -> bool {
    match path.canonicalize() {
        Ok(resolved) if resolved == path => {}
        _ => return false,
    }
    mountinfo::read_self()
        .map(|mounts| mounts.iter().any(|m| m.mount_point == path))
        .unwrap_or(false)
}

/// Unmounts (lazily) whatever is mounted at `path` below `base`, stacked mounts included,
/// reaching it through no link at any step (each unmount goes to `/proc/self/fd/<n>` of
/// the mount's root opened below `base`), so a plugin that swaps a directory for a link
/// meanwhile cannot steer the unmount elsewhere. How many.
pub fn unmount_all_below(base: &Path, path: &Path) -> io::Result<usize> {
    let (base_dir, relative) = open_below(base, path)?;
    let mut unmounted = 0;
    while let Some(target) = mount_root_at(&base_dir, &relative)? {
        let mut buffer = [0u8; 32];
        mount::unmount(
            super::beneath::fd_path(&target, &mut buffer),
            UnmountFlags::DETACH,
        )?;
        unmounted += 1;
        if unmounted > 64 {
            return Err(io::Error::other(format!(
                "{} stays mounted after 64 unmounts",
                path.display()
            )));
        }
    }
    Ok(unmounted)
}

/// Unmounts the mount at `path` below `base` without `MNT_DETACH`: one that something
/// still uses (an open file, a working directory in it) stays, and the call fails with
/// `EBUSY`. `path` is reached through no link to check that a mount is there, then
/// unmounted by path (a descriptor held across the unmount would itself make it busy):
/// for directories only the agent writes (an alloc's root in `allocs/`). Whether it
/// unmounted one.
pub fn unmount_unless_busy(base: &Path, path: &Path) -> io::Result<bool> {
    let (base_dir, relative) = open_below(base, path)?;
    if mount_root_at(&base_dir, &relative)?.is_none() {
        return Ok(false);
    }
    mount::unmount(path, UnmountFlags::NOFOLLOW)?;
    Ok(true)
}

/// `base` opened, and `path`'s place below it.
fn open_below(base: &Path, path: &Path) -> io::Result<(std::os::fd::OwnedFd, CString)> {
    let relative = path.strip_prefix(base).map_err(|_| {
        io::Error::other(format!(
            "{} is not below {}",
            path.display(),
            base.display()
        ))
    })?;
    let base_dir = super::beneath::open_root(&super::c_path(base)?)?;
    Ok((base_dir, super::c_path(relative)?))
}

/// `relative` below `base_dir`, reached through no link, when it is the root of a mount
/// (`None`: missing, or no mount there).
fn mount_root_at(
    base_dir: &std::os::fd::OwnedFd,
    relative: &CString,
) -> io::Result<Option<std::os::fd::OwnedFd>> {
    let target = match super::beneath::open(base_dir, relative) {
        Ok(target) => target,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let stat = rustix::fs::statx(
        &target,
        c"",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::MNT_ID,
    )?;
    let mount_root = rustix::fs::StatxAttributes::MOUNT_ROOT;
    let is_root =
        stat.stx_attributes_mask.contains(mount_root) && stat.stx_attributes.contains(mount_root);
    Ok(is_root.then_some(target))
}

/// Undoes [`ensure_shared`] once nothing is mounted below `root` any more: the last
/// plugin is gone and no volume is staged.
pub fn release_shared_if_unused(root: &Path) -> io::Result<()> {
    if !is_mount_point(root) || mounted_below(root)? {
        return Ok(());
    }
    mount::unmount(root, UnmountFlags::DETACH)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plugin that leaves a link at its publish path (to `/`) must not make the agent take
    /// the link's target for a mounted volume, nor unmount it.
    #[test]
    fn a_link_is_no_mount_point_and_nothing_is_unmounted_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("rw-file-system-single-node-writer");
        std::os::unix::fs::symlink("/", &link).unwrap();
        assert!(is_mount_point(Path::new("/")));
        assert!(!is_mount_point(&link));
        // Refused (a link on the way) or nothing to do; `/` stays mounted either way.
        let _ = unmount_all_below(dir.path(), &link);
        assert!(is_mount_point(Path::new("/")));
    }
}
