//! A filesystem image on a loop device, mounted: an alloc's own filesystem of its
//! `ephemeral_disk` size (made and chosen by `disk`).
//!
//! The loop device is configured with `LO_FLAGS_AUTOCLEAR`: it lets go of the image by
//! itself once the filesystem is unmounted (and unused: a file a process still holds
//! keeps it until that process lets go), so nothing but the mount needs undoing, and a
//! killed agent leaves only the mount, which a restarted one finds at the alloc's root.

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::mount::MountFlags;

/// `<linux/loop.h>`.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_NAME_SIZE: usize = 64;
const LO_KEY_SIZE: usize = 32;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; LO_KEY_SIZE],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// How many times a free loop device is asked for when another process takes the one
/// the kernel named first.
const ATTACH_TRIES: usize = 16;

/// Attaches `image` (an ext4 filesystem) to a free loop device and mounts it at `target`
/// with `nosuid,nodev,noatime` (and `noinit_itable`: the kernel does not zero the inode
/// tables in the background, which would write the whole table into a sparse image).
pub fn mount_image(image: &Path, target: &Path) -> io::Result<()> {
    let backing = rustix::fs::open(image, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
    let (device, path) = attach(&backing)?;
    let mounted = rustix::mount::mount(
        &path,
        target,
        "ext4",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME,
        c"noinit_itable",
    );
    if let Err(error) = mounted {
        // SAFETY: LOOP_CLR_FD takes no argument; `device` is an open loop device.
        unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CLR_FD, 0) };
        return Err(io::Error::new(
            io::Error::from(error).kind(),
            format!(
                "mounting {} ({}) at {}: {error}",
                image.display(),
                path.display(),
                target.display()
            ),
        ));
    }
    Ok(())
}

/// Held while a loop device is found and configured. Two attaches at once may be given
/// the same free device: the loser's open descriptor then makes the winner's mount fail
/// with EBUSY (the kernel refuses to mount a block device someone else has open for
/// writing). The mounts themselves run at once.
static ATTACHING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A free loop device with `backing` attached (auto-clearing), and its path.
fn attach(backing: &OwnedFd) -> io::Result<(OwnedFd, PathBuf)> {
    let _attaching = ATTACHING.lock().unwrap_or_else(|e| e.into_inner());
    let control = rustix::fs::open(
        "/dev/loop-control",
        OFlags::RDWR | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("/dev/loop-control: {e}")))?;
    let mut last = io::Error::other("no loop device was free");
    for _ in 0..ATTACH_TRIES {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if number < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = PathBuf::from(format!("/dev/loop{number}"));
        let device = match rustix::fs::open(&path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty()) {
            Ok(device) => device,
            // The kernel made the device a moment ago; devtmpfs may not show it yet.
            Err(rustix::io::Errno::NOENT) => {
                last = io::Error::other(format!("{} did not appear", path.display()));
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let mut config = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            // SAFETY: all-zero is a valid `loop_info64` (plain integers and arrays).
            info: unsafe { std::mem::zeroed() },
            reserved: [0; 8],
        };
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        // SAFETY: `config` is a `struct loop_config` that outlives the call.
        let answer = unsafe {
            libc::ioctl(
                device.as_raw_fd(),
                LOOP_CONFIGURE,
                &config as *const LoopConfig,
            )
        };
        if answer == 0 {
            return Ok((device, path));
        }
        last = io::Error::last_os_error();
        // Another process configured it first: ask for the next free one.
        if last.raw_os_error() != Some(libc::EBUSY) {
            return Err(last);
        }
    }
    Err(last)
}

/// The image behind the loop device `source` (a mount's source, `/dev/loopN`), as the
/// kernel records it; `None` for anything else.
pub fn backing_file(source: &str) -> Option<PathBuf> {
    let name = Path::new(source).file_name()?.to_str()?;
    if !name.starts_with("loop") || !name[4..].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let text = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}

/// The block device a mounted filesystem lives on (`root` is the mount's root, reached
/// through no link): the loop device of an image, once mounted.
pub fn device_of(root: &Path) -> Option<LoopDevice> {
    use rustix::fs::{AtFlags, StatxFlags};
    let stat = rustix::fs::statx(
        rustix::fs::CWD,
        root,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    )
    .ok()?;
    Some(LoopDevice {
        major: stat.stx_dev_major,
        minor: stat.stx_dev_minor,
    })
}

/// A block device by its numbers (see [`device_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopDevice {
    major: u32,
    minor: u32,
}

impl LoopDevice {
    /// Whether this device still has `image` attached: one file read, where
    /// [`is_backing`] reads every loop device's (a thousand at a thousand allocs, for
    /// each alloc released).
    pub fn is_backing(self, image: &Path) -> bool {
        let file = format!(
            "/sys/dev/block/{}:{}/loop/backing_file",
            self.major, self.minor
        );
        std::fs::read_to_string(file)
            .is_ok_and(|text| Path::new(text.trim_end_matches('\n')) == image)
    }
}

/// Whether any loop device still has `image` attached.
pub fn is_backing(image: &Path) -> bool {
    let Ok(devices) = std::fs::read_dir("/sys/block") else {
        return false;
    };
    devices.flatten().any(|device| {
        std::fs::read_to_string(device.path().join("loop/backing_file"))
            .is_ok_and(|text| Path::new(text.trim_end_matches('\n')) == image)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_structures_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[test]
    fn only_a_loop_device_has_a_backing_file() {
        assert_eq!(backing_file("/dev/vda"), None);
        assert_eq!(backing_file("/dev/loopx"), None);
        assert_eq!(backing_file("tmpfs"), None);
    }
}
