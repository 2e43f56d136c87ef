//! A task's log collector, as Nomad's logmon: `berth-keeper __task-logmon`, one small process
//! per task that reads the task's stdout and stderr from pipes and writes them to
//! `<task>.stdout.<n>` / `<task>.stderr.<n>` in the alloc's `logs/`, starting a new file
//! when one reaches `max_file_size` and deleting the oldest beyond `max_files` (Nomad's
//! `logs` block).
//!
//! - It is a process of its own, not a thread of the agent: it outlives an agent killed
//!   with `kill -9`, so the task never writes into a pipe nobody reads (it would block,
//!   or die of SIGPIPE), and it ends by itself once every process of the task has closed
//!   the pipes (the task's cgroup sees to that).
//! - The task can write into `logs/` (it is under the shared `/alloc`) and may plant
//!   symlinks, FIFOs or directories where a log file goes. The collector works from a
//!   descriptor of the directory opened by the agent, opens files with `O_NOFOLLOW` and
//!   `O_NONBLOCK`, keeps only regular files, and skips an index it cannot use; deleting
//!   removes names, never what a link points to.
//! - It runs in `berth-keeper`, started without a fork of the agent ([`keeper`]).
//!
//! Descriptors: 3 the stdout pipe, 4 the stderr pipe, 5 the `logs/` directory; every
//! other one above stderr is closed first thing.
//! Arguments: the stdout and stderr file bases (`web.stdout`), max files, max file size.

use std::convert::Infallible;
use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use rustix::fs::{Mode, OFlags};

use super::keeper;
use berth_model::driver::LogRotation;

/// The hidden command of `berth-keeper` (and of `berth`).
pub const COMMAND: &std::ffi::CStr = c"__task-logmon";

/// The descriptors the collector starts with.
pub const STDOUT_FD: i32 = 3;
pub const STDERR_FD: i32 = 4;
pub const DIR_FD: i32 = 5;

/// Indices from here on are not berth's (a task can name files in `logs/` as it likes):
/// a log reader's offset holds the index in 24 bits.
pub const MAX_INDEX: u64 = (1 << 24) - 1;

/// The file `index` of a stream: `<base>.<index>`.
pub fn file_name(base: &str, index: u64) -> String {
    format!("{base}.{index}")
}

/// The indices of `base`'s files in `dir`, lowest first.
pub fn indices(dir: BorrowedFd<'_>, base: &str) -> Vec<u64> {
    let prefix = format!("{base}.");
    let Ok(listing) = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&listing) else {
        return Vec::new();
    };
    let mut found: Vec<u64> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_str().ok()?;
            let digits = name.strip_prefix(&prefix)?;
            // "0" or digits without a leading zero: one name per index.
            if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
                return None;
            }
            digits.parse().ok().filter(|index| *index <= MAX_INDEX)
        })
        .collect();
    found.sort_unstable();
    found
}

/// Opens `name` in `dir` the way the collector and the log reader must: no symlink
/// followed, no FIFO waited on, a regular file or nothing.
pub fn open_regular(dir: BorrowedFd<'_>, name: &str, flags: OFlags) -> io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o640),
    )?;
    let stat = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(io::Error::other(format!("{name} is not a regular file")));
    }
    // Back to blocking writes and reads.
    rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd)? - OFlags::NONBLOCK)?;
    Ok(File::from(fd))
}

/// Writes one stream into its rotated files.
struct Rotator {
    dir: OwnedFd,
    base: String,
    rotation: LogRotation,
    index: u64,
    file: Option<File>,
    size: u64,
}

impl Rotator {
    /// Goes on from the newest file of the stream (a collector started again for the
    /// same task appends).
    fn new(dir: OwnedFd, base: String, rotation: LogRotation) -> Rotator {
        let index = indices(dir.as_fd(), &base).last().copied().unwrap_or(0);
        let mut rotator = Rotator {
            dir,
            base,
            rotation,
            index,
            file: None,
            size: 0,
        };
        rotator.open_current();
        rotator
    }

    /// Opens the file of the current index, or the next usable one.
    fn open_current(&mut self) {
        // An index the task spoiled (a symlink, a FIFO, a directory) is skipped; a few
        // tries, then output is dropped rather than stalling the task.
        for _ in 0..16 {
            let name = file_name(&self.base, self.index);
            match open_regular(
                self.dir.as_fd(),
                &name,
                OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND,
            ) {
                Ok(file) => {
                    self.size = file.metadata().map_or(0, |m| m.len());
                    self.file = Some(file);
                    self.purge();
                    return;
                }
                Err(_) => self.index = (self.index + 1).min(MAX_INDEX),
            }
        }
        self.file = None;
    }

    fn rotate(&mut self) {
        self.index = (self.index + 1).min(MAX_INDEX);
        self.file = None;
        self.open_current();
    }

    /// Deletes the files beyond `max_files`, oldest first.
    fn purge(&self) {
        let keep_from = (self.index + 1).saturating_sub(u64::from(self.rotation.max_files));
        for index in indices(self.dir.as_fd(), &self.base) {
            if index < keep_from {
                let name = file_name(&self.base, index);
                let _ =
                    rustix::fs::unlinkat(&self.dir, name.as_str(), rustix::fs::AtFlags::empty());
            }
        }
    }

    fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.size >= self.rotation.max_file_size {
                if self.index >= MAX_INDEX {
                    // The last index is full (a task that named a file so): drop, rather
                    // than reopen one file for every byte.
                    return;
                }
                self.rotate();
            }
            let room = self.rotation.max_file_size.saturating_sub(self.size).max(1);
            let chunk = &data[..data.len().min(room as usize)];
            let Some(file) = &mut self.file else {
                // Nowhere to write: keep reading, so the task never blocks on us.
                return;
            };
            if let Err(error) = file.write_all(chunk) {
                // The alloc's disk is full (its filesystem or its quota): another file
                // would not take it either, and rotating for every write would spin
                // through the indices and push the task's last lines out. Dropped; the
                // alloc runner stops an alloc whose disk is full.
                if matches!(error.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
                    return;
                }
                self.rotate();
                if self.file.is_none() {
                    return;
                }
                continue;
            }
            self.size += chunk.len() as u64;
            data = &data[chunk.len()..];
        }
    }
}

/// Copies `input` into `base`'s files until every writer has closed it.
fn collect(input: OwnedFd, dir: OwnedFd, base: String, rotation: LogRotation) {
    let mut input = File::from(input);
    let mut rotator = Rotator::new(dir, base, rotation);
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match input.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => rotator.write(&buffer[..n]),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Starts `berth-keeper __task-logmon` with `args` and the stdout pipe, the stderr pipe
/// and the `logs/` directory at 3, 4 and 5 ([`keeper::launch`]). Returns its pid; the
/// caller reaps it.
pub fn spawn(
    keeper: &std::path::Path,
    args: &[String],
    handed: [BorrowedFd<'_>; 3],
) -> io::Result<i32> {
    debug_assert_eq!(keeper::FIRST_HANDED_FD, STDOUT_FD);
    keeper::launch(keeper, COMMAND, args, [None, None, None], &handed)
}

/// Moves the just spawned collector `pid` into the alloc's collectors' cgroup (each
/// hierarchy's `cgroup.procs`): out of the agent's, whose limits and lifetime are not the
/// alloc's. A collector that cannot be moved is killed (and collected), so that none is
/// left in the agent's cgroup; the caller then copies the output itself.
pub fn move_collector(pid: i32, cgroup_procs: &[std::path::PathBuf]) -> io::Result<()> {
    for procs in cgroup_procs {
        if let Err(error) = std::fs::write(procs, pid.to_string()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
            }
            return Err(io::Error::new(
                error.kind(),
                format!("moving it into {}: {error}", procs.display()),
            ));
        }
    }
    Ok(())
}

/// The entry point of `berth __task-logmon`: `Some` never returns; `None` when the
/// process was not started as one.
pub fn logmon_main() -> Option<Infallible> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1)?.as_encoded_bytes() != COMMAND.to_bytes() {
        return None;
    }
    let text = |index: usize| args.get(index).and_then(|a| a.to_str()).unwrap_or("");
    let base_ok =
        |base: &str| !base.is_empty() && !base.contains('/') && base != "." && base != "..";
    let (stdout_base, stderr_base) = (text(2).to_string(), text(3).to_string());
    let rotation = LogRotation {
        max_files: text(4).parse().unwrap_or(0),
        max_file_size: text(5).parse().unwrap_or(0),
    };
    if !base_ok(&stdout_base)
        || !base_ok(&stderr_base)
        || rotation.max_files == 0
        || rotation.max_file_size == 0
    {
        eprintln!("berth __task-logmon: internal command, started by the agent only");
        std::process::exit(2);
    }
    keeper::close_from(DIR_FD + 1);
    // SAFETY: the agent hands these descriptors over at exactly these numbers, and
    // nothing else in this process owns them.
    let (stdout, stderr, dir) = unsafe {
        (
            OwnedFd::from_raw_fd(STDOUT_FD),
            OwnedFd::from_raw_fd(STDERR_FD),
            OwnedFd::from_raw_fd(DIR_FD),
        )
    };
    let Ok(dir_for_stderr) = dir.try_clone() else {
        std::process::exit(1);
    };
    let errors = std::thread::spawn(move || collect(stderr, dir_for_stderr, stderr_base, rotation));
    collect(stdout, dir, stdout_base, rotation);
    let _ = errors.join();
    std::process::exit(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn files_rotate_at_their_size_and_the_oldest_go_beyond_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let handle = || OwnedFd::from(File::open(dir.path()).unwrap());
        let rotation = LogRotation {
            max_files: 3,
            max_file_size: 10,
        };
        let mut rotator = Rotator::new(handle(), "t.stdout".into(), rotation);
        rotator.write(b"0123456789abcdefghij");
        rotator.write(b"KLMNOPQRSTuvw");
        assert_eq!(
            names(dir.path()),
            ["t.stdout.1", "t.stdout.2", "t.stdout.3"]
        );
        let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
        assert_eq!(read("t.stdout.1"), "abcdefghij");
        assert_eq!(read("t.stdout.3"), "uvw");

        // A collector started again goes on in the newest file.
        drop(rotator);
        let mut rotator = Rotator::new(handle(), "t.stdout".into(), rotation);
        rotator.write(b"xy");
        assert_eq!(read("t.stdout.3"), "uvwxy");

        // A symlink planted where the next file goes is skipped, and its target is
        // never written; deleting old files removes the link, not its target.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("t.stdout.4")).unwrap();
        rotator.write(b"12345678901");
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(read("t.stdout.3"), "uvwxy12345");
        assert_eq!(read("t.stdout.5"), "678901");
        assert!(names(dir.path()).contains(&"outside".to_string()));
    }

    #[test]
    fn indices_a_task_planted_do_not_overflow_or_spin() {
        let dir = tempfile::tempdir().unwrap();
        let handle = || OwnedFd::from(File::open(dir.path()).unwrap());
        std::fs::write(dir.path().join("t.stdout.18446744073709551615"), "").unwrap();
        std::fs::write(
            dir.path().join(file_name("t.stdout", MAX_INDEX)),
            "0123456789",
        )
        .unwrap();
        let rotation = LogRotation {
            max_files: 2,
            max_file_size: 10,
        };
        let mut rotator = Rotator::new(handle(), "t.stdout".into(), rotation);
        assert_eq!(rotator.index, MAX_INDEX);
        // The last index is full: dropped, at once.
        rotator.write(&[b'x'; 1 << 16]);
        assert_eq!(rotator.size, 10);
    }
}
