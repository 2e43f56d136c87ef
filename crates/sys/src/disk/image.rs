//! An alloc's own filesystem: a sparse ext4 image of its size, loop-mounted at its
//! directory by the host (see the module above).
//!
//! The image is a little larger than the size: ext4 keeps its inode tables (256 bytes an
//! inode) and a reserve of blocks for itself inside the image, and the alloc's files get
//! at least the size. The runner stops the alloc once it holds the size; the kernel
//! refuses what would pass the image. Sparse: a new alloc takes a few hundred KiB of the
//! host's disk, and then what its tasks write.

use std::io;
use std::path::Path;
use std::process::Command;

use super::{AllocDiskLimit, DiskError, DiskUsage, Unsupported};
use crate::mount;
use berth_model::limits::MIB;

/// An image with less room than this is full (see [`usage`]).
const FULL_WITHIN: u64 = 1024 * 1024;

/// Bytes ext4 gives each inode in its tables.
const INODE_SIZE: u64 = 256;

/// Whether this node can make and mount images: loop devices and `mkfs.ext4`.
pub fn available() -> Result<(), Unsupported> {
    if !Path::new("/dev/loop-control").exists() {
        return Err(Unsupported(
            "this node has no loop devices (/dev/loop-control is missing)".into(),
        ));
    }
    match Command::new("mkfs.ext4").arg("-V").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(Unsupported(format!("mkfs.ext4 -V failed ({})", out.status))),
        Err(e) => Err(Unsupported(format!("mkfs.ext4 cannot be run ({e})"))),
    }
}

/// The image's size for an alloc of `size` bytes and `inodes`: room for the size, the
/// inode tables, ext4's reserve (2 % of the blocks, at most 4,096 of them) and its
/// bitmaps and descriptors.
pub fn image_bytes(size: u64, inodes: u64) -> u64 {
    let block = if size < 512 * MIB { 1024 } else { 4096 };
    let reserve = (size / 50).min(4096 * block);
    size.saturating_add(inodes.saturating_mul(INODE_SIZE))
        .saturating_add(reserve)
        .saturating_add(2 * MIB)
}

/// See [`super::DiskLimits::limit`].
pub fn limit(
    data_dir: &Path,
    image: &Path,
    root: &Path,
    size: u64,
    inodes: u64,
) -> Result<AllocDiskLimit, DiskError> {
    if is_filesystem_root(root) {
        return Ok(AllocDiskLimit::Kernel);
    }
    let holds_files = std::fs::read_dir(root).is_ok_and(|mut entries| entries.next().is_some());
    if image.exists() {
        if holds_files {
            // Its image exists, and so do files the image would hide: only a build that
            // wrote in the directory unmounted could have made them. Keep them seen.
            return Err(DiskError::io(
                "mounting the alloc's image over files at",
                root,
                io::Error::other("the directory is not empty"),
            ));
        }
        std::fs::create_dir_all(root).map_err(|e| DiskError::io("creating", root, e))?;
        // Restored after the node rebooted: the filesystem is the alloc's, as it was.
        if mount::loop_fs::mount_image(image, root).is_ok() {
            return Ok(AllocDiskLimit::Kernel);
        }
        // An image the agent died making (`mkfs` cut short): the alloc wrote nothing
        // into it, so it is made again.
        let _ = std::fs::remove_file(image);
    } else if holds_files {
        return Ok(AllocDiskLimit::Measured);
    }
    let bytes = image_bytes(size, inodes);
    let dir = image.parent().unwrap_or(data_dir);
    {
        // Images are sparse: what the other allocs' images may still take is promised,
        // not free. Checked and the image's file made at its full length under one lock,
        // so two starts do not promise the same room; formatted outside it, so starts
        // format at once (under it, a thousand starts formatted one by one).
        let mut making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
        let free = free_bytes(data_dir)?;
        let promised = making.promised_at_most(dir, free, bytes);
        if free.saturating_sub(promised) < bytes {
            return Err(DiskError::NoRoom {
                data_dir: data_dir.to_path_buf(),
                free_mb: free / MIB,
                promised_mb: promised / MIB,
                needed_mb: bytes.div_ceil(MIB),
            });
        }
        std::fs::create_dir_all(dir).map_err(|e| DiskError::io("creating", dir, e))?;
        std::fs::create_dir_all(root).map_err(|e| DiskError::io("creating", root, e))?;
        reserve(image, bytes).inspect_err(|_| {
            let _ = std::fs::remove_file(image);
        })?;
        making.made(dir, bytes);
    }
    fill_from_template(dir, image, bytes, inodes).inspect_err(|_| {
        let _ = std::fs::remove_file(image);
    })?;
    mount::loop_fs::mount_image(image, root)
        .map_err(|e| DiskError::io("mounting the alloc's image at", root, e))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(image);
        })?;
    // mkfs's `lost+found` is for fsck, which never runs on an alloc's image.
    let _ = std::fs::remove_dir(root.join("lost+found"));
    Ok(AllocDiskLimit::Kernel)
}

/// Held while an image's room is checked and its file made.
static MAKING: std::sync::Mutex<Promises> = std::sync::Mutex::new(Promises::new());

/// Per directory of images, an upper bound of what its images may still take: the sum
/// of their lengths, counted once from the directory and then kept as images are made
/// and removed. A start that fits under the bound checks nothing more; only one that
/// does not reads every image for the exact promise (a thousand files at a thousand
/// allocs, under the lock every start takes: it was most of what an image added to a
/// start at that density).
struct Promises {
    lengths: Vec<(std::path::PathBuf, u64)>,
}

impl Promises {
    const fn new() -> Self {
        Self {
            lengths: Vec::new(),
        }
    }

    fn bound(&mut self, dir: &Path) -> Option<&mut u64> {
        self.lengths
            .iter_mut()
            .find(|(known, _)| known == dir)
            .map(|(_, bound)| bound)
    }

    /// What the images in `dir` may still take, or a bound above it when that leaves
    /// `needed` of `free` (then it need not be exact).
    fn promised_at_most(&mut self, dir: &Path, free: u64, needed: u64) -> u64 {
        if let Some(bound) = self.bound(dir)
            && free.saturating_sub(*bound) >= needed
        {
            return *bound;
        }
        let (promised, lengths) = promised_bytes(dir);
        match self.bound(dir) {
            Some(bound) => *bound = lengths,
            None => self.lengths.push((dir.to_path_buf(), lengths)),
        }
        promised
    }

    /// An image of `bytes` was made in `dir`.
    fn made(&mut self, dir: &Path, bytes: u64) {
        if let Some(bound) = self.bound(dir) {
            *bound = bound.saturating_add(bytes);
        }
    }

    /// An image of `bytes` was removed from `dir`.
    fn removed(&mut self, dir: &Path, bytes: u64) {
        if let Some(bound) = self.bound(dir) {
            *bound = bound.saturating_sub(bytes);
        }
    }
}

/// What the images in `dir` may still take of the host's disk (their lengths less what
/// they hold already), and the sum of their lengths.
fn promised_bytes(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    entries
        .flatten()
        .filter_map(|entry| entry.metadata().ok())
        .filter(|meta| meta.is_file())
        .fold((0u64, 0u64), |(promised, lengths), meta| {
            let unwritten = meta.len().saturating_sub(meta.blocks().saturating_mul(512));
            (
                promised.saturating_add(unwritten),
                lengths.saturating_add(meta.len()),
            )
        })
}

/// Whether the data dir's filesystem has `needed` bytes free beyond what the images in
/// `dir` may still take.
pub fn has_room(data_dir: &Path, dir: &Path, needed: u64) -> bool {
    let mut making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let free = free_bytes(data_dir).unwrap_or(0);
    free.saturating_sub(making.promised_at_most(dir, free, needed)) >= needed
}

/// Bytes of the data dir's filesystem an unprivileged writer may still take.
fn free_bytes(data_dir: &Path) -> Result<u64, DiskError> {
    let stat =
        rustix::fs::statvfs(data_dir).map_err(|e| DiskError::io("reading", data_dir, e.into()))?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// The image's file: sparse, `bytes` long (its length is its promise).
fn reserve(image: &Path, bytes: u64) -> Result<(), DiskError> {
    let file = std::fs::File::create(image).map_err(|e| DiskError::io("creating", image, e))?;
    file.set_len(bytes)
        .map_err(|e| DiskError::io("sizing", image, e))
}

/// Where the formatted templates live: beside the images, a directory (so neither the
/// promise nor the orphan sweep counts it).
const TEMPLATES: &str = ".templates";

/// Held while a template is made.
static TEMPLATING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Writes a new ext4 filesystem of `bytes` and `inodes` into the image's file (made at
/// that length): a copy of the formatted template of that shape, its holes kept, made
/// with `mkfs.ext4` the first time the shape is asked for. A copy costs the few hundred
/// KiB of tables the template holds, in-process; `mkfs` cost a process and its CPU per
/// alloc (at a thousand allocs started at once, the image round took x2.4 the plain one).
/// The copies share the template's UUID, which the kernel does not look at.
fn fill_from_template(dir: &Path, image: &Path, bytes: u64, inodes: u64) -> Result<(), DiskError> {
    let from = template(dir, bytes, inodes)?;
    let io = |e: io::Error| DiskError::io("copying the formatted template into", image, e);
    let to = std::fs::OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(io)?;
    let mut at = 0u64;
    while at < bytes {
        // The next extent of data, and where it ends: holes stay holes.
        let start = match rustix::fs::seek(&from, rustix::fs::SeekFrom::Data(at)) {
            Ok(start) => start,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(io(e.into())),
        };
        let end = rustix::fs::seek(&from, rustix::fs::SeekFrom::Hole(start))
            .map_err(|e| io(e.into()))?
            .min(bytes);
        let (mut from_at, mut to_at) = (start, start);
        while from_at < end {
            let left = (end - from_at) as usize;
            let copied =
                rustix::fs::copy_file_range(&from, Some(&mut from_at), &to, Some(&mut to_at), left)
                    .map_err(|e| io(e.into()))?;
            if copied == 0 {
                return Err(io(io::Error::other("the template ended early")));
            }
        }
        at = end;
    }
    Ok(())
}

/// How many templates are kept. Each holds its tables' blocks, which no alloc's disk
/// counts: a job author who asks for a new size with each job must not fill the data
/// dir with them. A shape used within the last this many shapes is a copy; an older one
/// is formatted again.
const TEMPLATES_KEPT: usize = 8;

/// The formatted template of `bytes` and `inodes` in `dir`'s templates (made once),
/// open: removed to make room for another shape meanwhile, it is still whole to copy.
fn template(dir: &Path, bytes: u64, inodes: u64) -> Result<std::fs::File, DiskError> {
    let templates = dir.join(TEMPLATES);
    let template = templates.join(format!("{bytes}-{inodes}.ext4"));
    let open = |path: &Path| -> Result<std::fs::File, DiskError> {
        let file = std::fs::File::open(path).map_err(|e| DiskError::io("opening", path, e))?;
        // Its last use, which decides which template goes first.
        file.set_modified(std::time::SystemTime::now())
            .map_err(|e| DiskError::io("marking the use of", path, e))?;
        Ok(file)
    };
    let _templating = TEMPLATING.lock().unwrap_or_else(|e| e.into_inner());
    if template.exists() {
        return open(&template);
    }
    std::fs::create_dir_all(&templates).map_err(|e| DiskError::io("creating", &templates, e))?;
    // Made aside and renamed into place: a template is whole or absent, even after a
    // crash in `mkfs`.
    let draft = templates.join(format!(".{bytes}-{inodes}.draft"));
    reserve(&draft, bytes)?;
    format(&draft, inodes).inspect_err(|_| {
        let _ = std::fs::remove_file(&draft);
    })?;
    std::fs::rename(&draft, &template).map_err(|e| DiskError::io("naming", &template, e))?;
    let made = open(&template)?;
    remove_least_recently_used(&templates, TEMPLATES_KEPT);
    Ok(made)
}

/// Removes all but the `kept` most recently used templates in `templates`.
fn remove_least_recently_used(templates: &Path, kept: usize) {
    let Ok(entries) = std::fs::read_dir(templates) else {
        return;
    };
    let mut made: Vec<_> = entries
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".ext4"))
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .collect();
    if made.len() <= kept {
        return;
    }
    made.sort();
    for (_, path) in &made[..made.len() - kept] {
        let _ = std::fs::remove_file(path);
    }
}

/// A new ext4 filesystem in the image's file: no journal (what an alloc writes does not
/// outlive a crash of the node in a usable state anyway), no blocks reserved for root
/// (the tasks' root is not the host's), no growth reserve.
fn format(image: &Path, inodes: u64) -> Result<(), DiskError> {
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode"])
        .args(["-N", &inodes.to_string()])
        .args(["-E", "nodiscard,root_owner=0:0"])
        .arg(image)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| DiskError::Mkfs {
            image: image.to_path_buf(),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        let message = String::from_utf8_lossy(&out.stderr);
        return Err(DiskError::Mkfs {
            image: image.to_path_buf(),
            message: format!("{} ({})", message.trim(), out.status),
        });
    }
    Ok(())
}

/// See [`super::DiskLimits::usage`]: `statvfs` of the mounted image.
pub fn usage(root: &Path) -> Option<DiskUsage> {
    if !is_filesystem_root(root) {
        return None;
    }
    let stat = rustix::fs::statvfs(root).ok()?;
    let block = stat.f_frsize;
    Some(DiskUsage {
        used_bytes: stat
            .f_blocks
            .saturating_sub(stat.f_bfree)
            .saturating_mul(block),
        used_inodes: stat.f_files.saturating_sub(stat.f_ffree),
        max_inodes: stat.f_files,
        // ext4 refuses a write a little before its last block (delayed allocation keeps
        // some for the metadata it will need): full within a few blocks.
        full: stat.f_bavail.saturating_mul(block) < FULL_WITHIN || stat.f_favail == 0,
    })
}

/// Whether `root` is the root of a mounted filesystem (no link followed): the image.
fn is_filesystem_root(root: &Path) -> bool {
    use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};
    match rustix::fs::statx(
        rustix::fs::CWD,
        root,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    ) {
        Ok(stat) => {
            stat.stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT)
                && stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)
        }
        Err(_) => false,
    }
}

/// See [`super::DiskLimits::release`]: unmounts the image (refused while anything is
/// mounted below the alloc's directory) and removes it.
pub fn release(data_dir: &Path, image: &Path, root: &Path) -> Result<(), DiskError> {
    if mount::shared::mounted_below(root)
        .map_err(|e| DiskError::io("reading mounts below", root, e))?
    {
        return Err(DiskError::io(
            "unmounting the alloc's image at",
            root,
            io::Error::other("something is still mounted below it"),
        ));
    }
    let canonical = |path: &Path| path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let image_path = canonical(image);
    // Its loop device, read while the image is still mounted (after, the directory is
    // on the data dir's own device), and trusted only if the kernel says it holds this
    // image: a mount stacked on the root (a tmpfs, say) would name its own device, and
    // the image would be taken for let go while still mounted below.
    let device = is_filesystem_root(root)
        .then(|| mount::loop_fs::device_of(root))
        .flatten()
        .filter(|device| device.is_backing(&image_path));
    // Not lazily: a filesystem something still holds (a process of another job or of
    // the host that kept a file or a directory of it) would live on, writable, after its
    // image left the count of what images promise. It stays, and is tried again.
    mount::shared::unmount_unless_busy(&canonical(data_dir), &canonical(root)).map_err(|e| {
        DiskError::Held {
            root: root.to_path_buf(),
            why: e.to_string(),
        }
    })?;
    // Unmounted here, the filesystem may live on in another mount namespace that holds
    // a copy; its loop device lets go of the image once it is gone everywhere.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let still_attached = || match device {
        Some(device) => device.is_backing(&image_path),
        // Unmounted already (by an agent that died before removing the image), or under
        // another mount: any device may hold it.
        None => mount::loop_fs::is_backing(&image_path),
    };
    while still_attached() {
        if std::time::Instant::now() > deadline {
            return Err(DiskError::Held {
                root: root.to_path_buf(),
                why: "its loop device is still in use elsewhere".into(),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let length = std::fs::metadata(image).map(|meta| meta.len());
    match std::fs::remove_file(image) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(DiskError::io("removing", image, e)),
        Err(_) => Ok(()),
        Ok(()) => {
            if let (Ok(length), Some(dir)) = (length, image.parent()) {
                making.removed(dir, length);
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// Unmounts what a failed test left mounted in its data dir.
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            if let Some(parent) = self.0.parent() {
                let _ = mount::shared::unmount_all_below(parent, &self.0);
            }
        }
    }
    use std::path::PathBuf;

    #[test]
    fn an_image_gives_at_least_the_size_and_not_much_more() {
        for size_mb in [10, 300, 1024] {
            let size = size_mb * MIB;
            let inodes = size_mb * 256;
            let data = tempfile::tempdir().unwrap();
            let root = data.path().join("allocs/a1");
            let image = data.path().join("alloc-disks/a1.ext4");
            let _unmount = Unmount(root.clone());
            assert_eq!(
                limit(data.path(), &image, &root, size, inodes).unwrap(),
                AllocDiskLimit::Kernel
            );
            let stat = rustix::fs::statvfs(&root).unwrap();
            let room = stat.f_bavail * stat.f_frsize;
            assert!(
                (size..size + size / 50 + 3 * MIB).contains(&room),
                "{size_mb} MB: {} MB of room",
                room / MIB
            );
            assert!(
                stat.f_files >= inodes - inodes / 100 && stat.f_files < inodes + inodes / 8 + 64,
                "{size_mb} MB: {} inodes",
                stat.f_files
            );
            // Sparse: the host holds a few hundred KiB of it.
            let held = std::fs::metadata(&image).unwrap();
            use std::os::unix::fs::MetadataExt as _;
            assert!(held.blocks() * 512 < 4 * MIB, "{}", held.blocks() * 512);
            release(data.path(), &image, &root).unwrap();
            assert!(!image.exists());
        }
    }

    /// Allocs of one shape get copies of one formatted template: each its own
    /// filesystem (what one writes the other does not see), sparse, and the template,
    /// made once, is no alloc's promise.
    #[test]
    fn images_of_one_shape_are_copies_of_one_template_and_independent() {
        let data = tempfile::tempdir().unwrap();
        let images = data.path().join("alloc-disks");
        let (size, inodes) = (10 * MIB, 2560);
        let mut made = Vec::new();
        for id in ["a1", "a2"] {
            let root = data.path().join("allocs").join(id);
            let image = images.join(format!("{id}.ext4"));
            made.push((Unmount(root.clone()), root.clone(), image.clone()));
            assert_eq!(
                limit(data.path(), &image, &root, size, inodes).unwrap(),
                AllocDiskLimit::Kernel
            );
        }
        std::fs::write(made[0].1.join("mine"), "a1's").unwrap();
        assert!(
            !made[1].1.join("mine").exists(),
            "the copies share a filesystem"
        );
        let templates: Vec<_> = std::fs::read_dir(images.join(TEMPLATES))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(templates.len(), 1, "{templates:?}");
        // The promise is the two images' room, not the template's.
        let bytes = image_bytes(size, inodes);
        let (promised, lengths) = promised_bytes(&images);
        assert!(promised <= 2 * bytes && promised > bytes, "{promised}");
        assert_eq!(lengths, 2 * bytes);
        for (_, root, image) in &made {
            release(data.path(), image, root).unwrap();
        }
    }

    /// The kernel refuses past the size and past the inodes, whatever hides the bytes (an
    /// unlinked file held open), and the usage says so in one call; released, nothing
    /// stays mounted and the image is gone.
    #[test]
    fn the_kernel_refuses_past_the_size_and_the_inodes() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("allocs/a1");
        let image = data.path().join("alloc-disks/a1.ext4");
        let _unmount = Unmount(root.clone());
        limit(data.path(), &image, &root, 10 * MIB, 2560).unwrap();
        // Again (a restored alloc): the same filesystem, nothing made anew.
        std::fs::write(root.join("kept"), "x").unwrap();
        assert_eq!(
            limit(data.path(), &image, &root, 10 * MIB, 2560).unwrap(),
            AllocDiskLimit::Kernel
        );
        assert!(root.join("kept").exists());
        let mut hidden = std::fs::File::create(root.join("hidden")).unwrap();
        std::fs::remove_file(root.join("hidden")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut written = 0u64;
        let refused = loop {
            match hidden.write_all(&chunk).and_then(|()| hidden.sync_all()) {
                Ok(()) => written += chunk.len() as u64,
                Err(e) => break e,
            }
            assert!(
                written < 40 * MIB,
                "wrote {written} bytes into a 10 MB alloc"
            );
        };
        assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC), "{refused}");
        assert!(written >= 9 * MIB, "{written}");
        let usage = usage(&root).unwrap();
        let stat = rustix::fs::statvfs(&root).unwrap();
        assert!(
            usage.full,
            "{usage:?} {} blocks of {} left",
            stat.f_bavail, stat.f_frsize
        );
        assert!(usage.used_bytes >= 10 * MIB, "{usage:?}");
        drop(hidden);
        // Its blocks are freed with its last reference, a moment after the close.
        let mut usage_after = super::usage(&root).unwrap();
        for _ in 0..100 {
            if !usage_after.full {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            usage_after = super::usage(&root).unwrap();
        }
        assert!(
            !usage_after.full && usage_after.used_bytes < MIB,
            "{usage_after:?}"
        );
        let mut made = 0;
        let refused = loop {
            match std::fs::File::create(root.join(format!("f{made}"))) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
            assert!(made < 30_000, "30,000 empty files in a 10 MB alloc");
        };
        assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC), "{refused}");
        assert!((2500..2560).contains(&made), "{made}");
        let usage = super::usage(&root).unwrap();
        assert!(
            usage.full && usage.used_inodes == usage.max_inodes,
            "{usage:?}"
        );
        assert!(usage.max_inodes >= 2560, "{usage:?}");
        release(data.path(), &image, &root).unwrap();
        assert!(!is_filesystem_root(&root));
        assert!(!image.exists());
        assert_eq!(super::usage(&root), None);
    }

    /// A filesystem something still holds (a directory kept open by a process outside
    /// the alloc) is not let go: the image stays, mounted and counted, until it is free.
    #[test]
    fn a_held_filesystem_is_not_released_until_it_is_let_go() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("allocs/a1");
        let image = data.path().join("alloc-disks/a1.ext4");
        let _unmount = Unmount(root.clone());
        limit(data.path(), &image, &root, 10 * MIB, 2560).unwrap();
        std::fs::create_dir(root.join("data")).unwrap();
        let held = std::fs::File::open(root.join("data")).unwrap();
        let error = release(data.path(), &image, &root).unwrap_err();
        assert!(matches!(error, DiskError::Held { .. }), "{error}");
        assert!(error.to_string().contains("still in use"), "{error}");
        assert!(image.exists() && is_filesystem_root(&root));
        assert!(promised_bytes(image.parent().unwrap()).0 > 10 * MIB);
        drop(held);
        release(data.path(), &image, &root).unwrap();
        assert!(!image.exists() && !is_filesystem_root(&root));
    }

    /// A mount stacked on the alloc's root (a tmpfs here) names its own device: the
    /// release does not take the image for let go while it is still mounted below, and
    /// keeps it until it is (an attack review saw it unlinked while mounted).
    #[test]
    fn an_image_under_another_mount_is_not_removed_while_mounted() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("allocs/a1");
        let image = data.path().join("alloc-disks/a1.ext4");
        let _unmount = Unmount(root.clone());
        limit(data.path(), &image, &root, 10 * MIB, 2560).unwrap();
        let stacked = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "stacked"])
            .arg(&root)
            .status()
            .unwrap();
        assert!(stacked.success());
        let error = release(data.path(), &image, &root).unwrap_err();
        assert!(matches!(error, DiskError::Held { .. }), "{error}");
        assert!(image.exists(), "the image was removed while mounted");
        assert!(mount::loop_fs::is_backing(&image.canonicalize().unwrap()));
        // The stacked mount is gone now, the image's filesystem on top: let go.
        release(data.path(), &image, &root).unwrap();
        assert!(!image.exists() && !is_filesystem_root(&root));
    }

    /// Templates are kept for the shapes used last: a ninth shape removes the one used
    /// least recently, not one just copied.
    #[test]
    fn only_the_templates_of_the_shapes_used_last_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let shape = |n: u64| (image_bytes(MIB * (n + 1), 64), 64);
        for n in 0..TEMPLATES_KEPT as u64 {
            let (bytes, inodes) = shape(n);
            template(dir.path(), bytes, inodes).unwrap();
        }
        // The first shape is used again: the second is now the least recently used.
        let (bytes, inodes) = shape(0);
        template(dir.path(), bytes, inodes).unwrap();
        let (bytes, inodes) = shape(TEMPLATES_KEPT as u64);
        let newest = template(dir.path(), bytes, inodes).unwrap();
        let kept = |n: u64| {
            let (bytes, inodes) = shape(n);
            dir.path()
                .join(TEMPLATES)
                .join(format!("{bytes}-{inodes}.ext4"))
                .exists()
        };
        assert!(kept(0) && !kept(1), "the least recently used goes");
        assert!((2..=TEMPLATES_KEPT as u64).all(kept));
        let count = std::fs::read_dir(dir.path().join(TEMPLATES))
            .unwrap()
            .count();
        assert_eq!(count, TEMPLATES_KEPT);
        assert_eq!(newest.metadata().unwrap().len(), bytes);
    }

    /// The bound on what images may take stands in for reading them only while it
    /// leaves the room asked for; past it, the exact promise is read (written blocks are
    /// no longer promised) and becomes the new bound's base.
    #[test]
    fn the_promise_is_read_exactly_only_when_its_bound_leaves_no_room() {
        let dir = tempfile::tempdir().unwrap();
        let image = |name: &str, length: u64, written: usize| {
            let file = std::fs::File::create(dir.path().join(name)).unwrap();
            file.set_len(length).unwrap();
            std::os::unix::fs::FileExt::write_all_at(&file, &vec![1u8; written], 0).unwrap();
            file.sync_all().unwrap();
        };
        image("a.ext4", 10 * MIB, 4 * MIB as usize);
        let mut promises = Promises::new();
        // First asked: read (10 MiB long, 4 written: 6 promised), the bound is 10 MiB.
        assert_eq!(
            promises.promised_at_most(dir.path(), 100 * MIB, MIB),
            6 * MIB
        );
        image("b.ext4", 10 * MIB, 0);
        promises.made(dir.path(), 10 * MIB);
        // Room under the bound (20 MiB): the bound is the answer, nothing is read.
        assert_eq!(
            promises.promised_at_most(dir.path(), 100 * MIB, 50 * MIB),
            20 * MIB
        );
        // No room under it: read again, 16 MiB promised, 84 of 100 free is enough.
        assert_eq!(
            promises.promised_at_most(dir.path(), 100 * MIB, 84 * MIB),
            16 * MIB
        );
        std::fs::remove_file(dir.path().join("b.ext4")).unwrap();
        promises.removed(dir.path(), 10 * MIB);
        assert_eq!(
            promises.promised_at_most(dir.path(), 100 * MIB, 90 * MIB),
            10 * MIB
        );
        assert_eq!(
            promises.promised_at_most(dir.path(), 100 * MIB, 95 * MIB),
            6 * MIB
        );
    }

    #[test]
    fn a_data_dir_without_room_is_refused_naming_the_fix() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("allocs/a1");
        let image = data.path().join("alloc-disks/a1.ext4");
        // Should a refusal fail to come, the image it mounted goes with the test.
        let _unmount = Unmount(root.clone());
        let error = limit(data.path(), &image, &root, 1 << 50, 1 << 20).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("MB free (") && text.contains("lower ephemeral_disk size"),
            "{text}"
        );
        assert!(!image.exists());
        // What other allocs' images may still take is not free: an image as large as
        // the free space, made, leaves no room for another of a few MB.
        let free = free_bytes(data.path()).unwrap();
        let other = data.path().join("alloc-disks/other.ext4");
        std::fs::create_dir_all(other.parent().unwrap()).unwrap();
        std::fs::File::create(&other)
            .unwrap()
            .set_len(free - 4 * MIB)
            .unwrap();
        // Made as `limit` makes images: counted in the bound.
        MAKING
            .lock()
            .unwrap()
            .made(other.parent().unwrap(), free - 4 * MIB);
        let error = limit(data.path(), &image, &root, 10 * MIB, 2560).unwrap_err();
        assert!(
            matches!(error, DiskError::NoRoom { promised_mb, .. } if promised_mb > 0),
            "{error}"
        );
    }

    /// An alloc directory an older build filled is measured, not hidden under an image.
    #[test]
    fn an_older_allocs_directory_is_measured_not_covered() {
        let data = tempfile::tempdir().unwrap();
        let root = data.path().join("allocs/a1");
        std::fs::create_dir_all(root.join("alloc/data")).unwrap();
        let image = data.path().join("alloc-disks/a1.ext4");
        assert_eq!(
            limit(data.path(), &image, &root, 10 * MIB, 2560).unwrap(),
            AllocDiskLimit::Measured
        );
        assert!(!image.exists() && !is_filesystem_root(&root));
    }
}
