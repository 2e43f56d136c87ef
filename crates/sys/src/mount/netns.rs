//! Network namespaces kept by a bind mount of their `nsfs` file, as `ip netns add` keeps
//! them: the namespace outlives the thread that made it, and the agent too, until the
//! mount is gone ([`crate::network::netns`] is the one caller).

use std::io;
use std::path::Path;

use rustix::mount::{self, MountPropagationFlags, UnmountFlags};

/// Makes `dir` a shared mount (bound onto itself first when it is not a mount point), as
/// `ip netns` makes `/run/netns`: a namespace mounted in it then shows in, and its
/// unmount reaches, every mount namespace that copied `dir` as a peer.
pub fn share_dir(dir: &Path) -> io::Result<()> {
    let shared = MountPropagationFlags::SHARED | MountPropagationFlags::REC;
    match mount::mount_change(dir, shared) {
        Ok(()) => Ok(()),
        // Not a mount point yet.
        Err(rustix::io::Errno::INVAL) => {
            mount::mount_bind(dir, dir)?;
            mount::mount_change(dir, shared)?;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Binds the namespace file `namespace` (`/proc/thread-self/ns/net` of the thread that
/// made it) at `target`, an empty file.
pub fn bind_namespace(namespace: &Path, target: &Path) -> io::Result<()> {
    mount::mount_bind(namespace, target)?;
    Ok(())
}

/// Unmounts the namespace bound at `target` (lazily: a process still in the namespace
/// keeps it, the name is gone at once).
pub fn unbind_namespace(target: &Path) -> io::Result<()> {
    mount::unmount(target, UnmountFlags::DETACH)?;
    Ok(())
}
