//! Nomad's `artifact` block, fetched by the host before a task first starts: an
//! `http://` or `https://` download ([`download`]) checked against its checksum, then
//! written or unpacked ([`unpack`]) into the task's `local/` or `secrets/` directory.
//!
//! **Nothing is left behind by a failure, and nothing is written outside the
//! destination.** The download goes to an unnamed file (`O_TMPFILE`) in the destination
//! directory, on the alloc's disk so it counts against its limit, and is given a name
//! only once its checksum matched. An archive is unpacked into a staging directory
//! beside it, every entry created from a directory descriptor with `openat2(RESOLVE_BENEATH
//! | RESOLVE_NO_SYMLINKS)` ([`tree`]): an entry with `..` or an absolute path, a link
//! leading out, a device node, or one past the operator's size and file-count limits
//! ends the unpack, and the staging directory is removed. Only a whole unpack is moved
//! into place. No download reaches the operator's denied networks ([`networks`]).

pub mod download;
pub mod networks;
pub mod tree;
pub mod unpack;

#[cfg(test)]
mod tests;

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use berth_jobspec::artifact::{FetchMode, FetchPlan};
use rustix::fs::{Mode, OFlags};

/// The operator's limits (Nomad's `client.artifact` names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A whole download, redirects and retries included (`http_read_timeout`).
    pub read_timeout: Duration,
    /// The most bytes a download may be (`http_max_size`).
    pub max_download: u64,
    /// The most bytes an archive may unpack to (`decompression_size_limit`).
    pub max_unpacked: u64,
    /// The most entries an archive may hold (`decompression_file_count_limit`).
    pub max_files: u64,
    /// Where no download may connect (`denied_networks`; berth's, Nomad has none).
    pub denied_networks: std::sync::Arc<[networks::Network]>,
}

impl Default for Limits {
    /// Nomad's defaults, but for the time a download may take: 30 minutes there, 5 here
    /// (the task waits on it, and the alloc's disk bounds the size anyway).
    fn default() -> Limits {
        Limits {
            read_timeout: Duration::from_secs(5 * 60),
            max_download: 100 << 30,
            max_unpacked: 100 << 30,
            max_files: 4096,
            denied_networks: networks::default_denied(),
        }
    }
}

/// Hands a file or directory the artifact made to the task's user (`chown = true`).
pub type Give = std::sync::Arc<dyn Fn(BorrowedFd<'_>) -> io::Result<()> + Send + Sync>;

/// What one artifact put in place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fetched {
    pub downloaded: u64,
    /// Files, directories and links written.
    pub entries: u64,
    pub unpacked_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error(transparent)]
    Download(#[from] download::DownloadError),
    #[error("checksum mismatch: expected {expected}, the download has {got}")]
    Checksum { expected: String, got: String },
    #[error("unpacking the {kind} archive: {error}")]
    Unpack {
        kind: &'static str,
        #[source]
        error: unpack::UnpackError,
    },
    #[error("{what}: {error}")]
    Io {
        what: String,
        #[source]
        error: io::Error,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(io::Error) -> ArtifactError {
    move |error| ArtifactError::Io {
        what: what.into(),
        error,
    }
}

/// Fetches `plan` into `task_dir`. The download and any unpack are bounded by `limits`;
/// on any failure what this call made is removed.
pub async fn fetch(
    plan: &FetchPlan,
    task_dir: &Path,
    limits: &Limits,
    give: Option<Give>,
) -> Result<Fetched, ArtifactError> {
    let root: OwnedFd = std::fs::File::open(task_dir)
        .map_err(io_error("opening the task's directory"))?
        .into();
    // The directory the download lands in, and the name it takes there.
    let parts: Vec<&str> = plan.destination.split('/').collect();
    let (dir_parts, name) = match plan.mode {
        FetchMode::File => {
            let (name, dir) = parts.split_last().unwrap_or((&"", &[]));
            (dir.to_vec(), Some(name.to_string()))
        }
        FetchMode::Any | FetchMode::Dir => (parts.clone(), None),
    };
    let mut made = tree::MadeDirs::default();
    let result = async {
        let dir = tree::make_dirs(root.as_fd(), &dir_parts, give.as_ref(), &mut made)
            .map_err(io_error(format!("making {}", plan.destination)))?;
        let download = tree::unnamed_file(dir.as_fd())
            .map_err(io_error(format!("a file in {}", plan.destination)))?;
        let sink = download.try_clone().map_err(io_error("a descriptor"))?;
        let downloaded = download::get(plan, sink, limits).await?;
        if let Some(expected) = &plan.checksum
            && downloaded.digest != expected.digest
        {
            let got = berth_jobspec::artifact::Checksum {
                kind: expected.kind,
                digest: downloaded.digest.clone(),
            };
            return Err(ArtifactError::Checksum {
                expected: expected.to_string(),
                got: got.to_string(),
            });
        }
        let plan = plan.clone();
        let limits = limits.clone();
        let name = name.clone();
        let give = give.clone();
        // Unpacking is blocking file work: off the runtime's threads.
        let placed = tokio::task::spawn_blocking(move || {
            place(
                &plan,
                dir.as_fd(),
                download,
                name.as_deref(),
                &limits,
                give.as_ref(),
            )
        })
        .await;
        let mut fetched = placed.map_err(|_| ArtifactError::Io {
            what: "unpacking".into(),
            error: io::Error::other("interrupted"),
        })??;
        fetched.downloaded = downloaded.bytes;
        Ok(fetched)
    }
    .await;
    if result.is_err() {
        made.remove(root.as_fd());
    }
    result
}

/// Gives the checked download its place: unpacked, decompressed, or named.
fn place(
    plan: &FetchPlan,
    dir: BorrowedFd<'_>,
    download: std::fs::File,
    name: Option<&str>,
    limits: &Limits,
    give: Option<&Give>,
) -> Result<Fetched, ArtifactError> {
    let name = name.unwrap_or(&plan.file_name);
    match plan.archive {
        Some(kind) if kind.is_tree() => {
            let fetched =
                unpack::tree_into(kind, download, dir, limits, give).map_err(|error| {
                    ArtifactError::Unpack {
                        kind: unpack::kind_name(kind),
                        error,
                    }
                })?;
            Ok(fetched)
        }
        Some(kind) => {
            let file = tree::unnamed_file(dir).map_err(io_error("a file for the decompressed"))?;
            let bytes =
                unpack::decompress_into(kind, download, &file, limits).map_err(|error| {
                    ArtifactError::Unpack {
                        kind: unpack::kind_name(kind),
                        error,
                    }
                })?;
            name_file(dir, &file, name, give)?;
            Ok(Fetched {
                entries: 1,
                unpacked_bytes: bytes,
                ..Fetched::default()
            })
        }
        None => {
            name_file(dir, &download, name, give)?;
            Ok(Fetched {
                entries: 1,
                ..Fetched::default()
            })
        }
    }
}

/// Links the unnamed `file` into `dir` as `name`, replacing a file there (never a
/// directory), as go-getter overwrites.
fn name_file(
    dir: BorrowedFd<'_>,
    file: &std::fs::File,
    name: &str,
    give: Option<&Give>,
) -> Result<(), ArtifactError> {
    rustix::fs::fchmod(file, Mode::from_raw_mode(0o644))
        .map_err(|e| io_error("chmod")(e.into()))?;
    if let Some(give) = give {
        give(file.as_fd()).map_err(io_error(format!("giving {name} to the task's user")))?;
    }
    tree::link_unnamed(dir, file.as_fd(), name).map_err(io_error(format!("naming {name}")))
}

/// The unnamed file's flags: created in `dir`, never visible until linked.
pub(crate) const UNNAMED: OFlags = OFlags::TMPFILE.union(OFlags::RDWR).union(OFlags::CLOEXEC);
