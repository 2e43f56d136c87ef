//! `artifact` blocks: what go-getter's everyday forms mean, read into a [`FetchPlan`]
//! once the task's names are known. The source is `http://` or `https://`; `checksum`
//! (in `options`, or the source's query, as go-getter takes it) is `md5`, `sha1`,
//! `sha256` or `sha512` and a hex digest; an archive is known by its extension (or
//! `archive = "<kind>"`, or not unpacked with `archive = "false"`); the destination
//! stays in the task's `local/` or `secrets/` directory. Everything else go-getter
//! reads (git, s3, gcs, hg, `file::`) is refused by name at submit.

use serde::{Deserialize, Serialize};

use berth_hcl::Location;

/// An `artifact` block as written (its strings may still hold `${...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    pub source: String,
    /// Relative to the task's directory; `local/` unless set.
    pub destination: String,
    /// `any`, `file` or `dir`.
    pub mode: String,
    /// go-getter's `options`: berth reads `checksum` and `archive`.
    pub options: Vec<(String, String)>,
    /// Sent with the request (`headers`), never across to another host on a redirect.
    pub headers: Vec<(String, String)>,
    /// The files are given to the task's user.
    pub chown: bool,
    pub at: Location,
}

/// The options berth reads; go-getter's others concern getters berth does not have.
pub const OPTIONS: &[&str] = &["checksum", "archive"];

/// The most `artifact` blocks a task may have.
pub const MAX_ARTIFACTS: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChecksumKind {
    Md5,
    Sha1,
    Sha256,
    Sha512,
}

impl ChecksumKind {
    pub fn name(self) -> &'static str {
        match self {
            ChecksumKind::Md5 => "md5",
            ChecksumKind::Sha1 => "sha1",
            ChecksumKind::Sha256 => "sha256",
            ChecksumKind::Sha512 => "sha512",
        }
    }

    /// The digest's length in bytes.
    pub fn digest_len(self) -> usize {
        match self {
            ChecksumKind::Md5 => 16,
            ChecksumKind::Sha1 => 20,
            ChecksumKind::Sha256 => 32,
            ChecksumKind::Sha512 => 64,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    pub kind: ChecksumKind,
    pub digest: Vec<u8>,
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:", self.kind.name())?;
        self.digest.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// How a download is unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    Tar,
    TarGz,
    TarXz,
    TarBz2,
    Zip,
    /// One compressed file, decompressed (`app.gz` → `app`).
    Gz,
    Xz,
    Bz2,
}

/// go-getter's extensions, longest first so `.tar.gz` wins over `.gz`.
const EXTENSIONS: &[(&str, ArchiveKind)] = &[
    ("tar.gz", ArchiveKind::TarGz),
    ("tar.xz", ArchiveKind::TarXz),
    ("tar.bz2", ArchiveKind::TarBz2),
    ("tgz", ArchiveKind::TarGz),
    ("txz", ArchiveKind::TarXz),
    ("tbz2", ArchiveKind::TarBz2),
    ("tar", ArchiveKind::Tar),
    ("zip", ArchiveKind::Zip),
    ("gz", ArchiveKind::Gz),
    ("xz", ArchiveKind::Xz),
    ("bz2", ArchiveKind::Bz2),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchMode {
    /// An archive is unpacked into the destination directory; a file lands in it under
    /// its name.
    Any,
    /// The destination is the file itself.
    File,
    /// The source must be an archive, unpacked into the destination directory.
    Dir,
}

/// What the host fetches, checks and writes for one artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPlan {
    /// The URL fetched, without the `checksum` and `archive` query parameters.
    pub url: String,
    pub https: bool,
    pub checksum: Option<Checksum>,
    pub archive: Option<ArchiveKind>,
    pub mode: FetchMode,
    /// Relative to the task's directory, in `local/` or `secrets/`, no `..`.
    pub destination: String,
    /// The file's name in the destination directory when it is not unpacked (mode `any`):
    /// the last part of the URL's path (an archive of one file: without its extension).
    pub file_name: String,
    pub headers: Vec<(String, String)>,
    pub chown: bool,
}

/// Why an artifact cannot be fetched as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactProblem {
    #[error("source {0:?} uses the {1} getter; berth fetches http:// and https:// sources only")]
    Getter(String, String),
    #[error("source {0:?} is not an http:// or https:// URL")]
    NotHttp(String),
    #[error("source {0:?} names no host")]
    NoHost(String),
    #[error("source {0:?} holds a space, a control character or a fragment")]
    BadUrl(String),
    #[error(
        "checksum {0:?} is not <type>:<hex digest> with type md5, sha1, sha256 or sha512 \
         (a checksum file URL is not supported)"
    )]
    Checksum(String),
    #[error("checksum {given:?} has {got} hex digits; a {kind} digest has {want}")]
    ChecksumLength {
        given: String,
        kind: &'static str,
        got: usize,
        want: usize,
    },
    #[error(
        "archive {0:?} is not \"false\" or one of tar, tar.gz, tgz, tar.xz, txz, tar.bz2, \
         tbz2, zip, gz, xz, bz2"
    )]
    Archive(String),
    #[error("option {0:?} is not one berth reads (it reads checksum and archive)")]
    UnknownOption(String),
    #[error("mode {0:?} is not any, file or dir")]
    Mode(String),
    #[error("mode \"dir\" needs an archive, and {0:?} is not one")]
    DirNeedsArchive(String),
    #[error(
        "the source's path names no file ({0:?}); set mode = \"file\" and a destination \
         file to keep it"
    )]
    NoFileName(String),
    #[error(
        "destination {0:?} must be in the task's local/ or secrets/ directory (as \"local/\", \
         \"local/bin\" or \"${{NOMAD_TASK_DIR}}/conf\")"
    )]
    Destination(String),
    #[error("mode \"file\" needs a destination file, not the directory {0:?}")]
    FileModeDirectory(String),
    #[error(
        "mode \"file\" keeps one file, and {0:?} is an archive of many: use mode = \"dir\" \
         (or \"any\") to unpack it, or options {{ archive = \"false\" }} to keep it whole"
    )]
    FileModeArchive(String),
    #[error("header {0:?} is not a valid HTTP header name or value")]
    Header(String),
}

impl ArtifactProblem {
    /// The `artifact` field it concerns.
    pub fn field(&self) -> &'static str {
        use crate::fields::artifact as f;
        match self {
            ArtifactProblem::Destination(_)
            | ArtifactProblem::FileModeDirectory(_)
            | ArtifactProblem::FileModeArchive(_) => f::DESTINATION.hcl,
            ArtifactProblem::Mode(_) | ArtifactProblem::DirNeedsArchive(_) => f::MODE.hcl,
            ArtifactProblem::Checksum(_)
            | ArtifactProblem::ChecksumLength { .. }
            | ArtifactProblem::Archive(_)
            | ArtifactProblem::UnknownOption(_) => f::OPTIONS.hcl,
            ArtifactProblem::Header(_) => f::HEADERS.hcl,
            _ => f::SOURCE.hcl,
        }
    }
}

impl Artifact {
    /// The plan, with `names` applied to each string first (`${NOMAD_META_version}`),
    /// after the task's own directories are given their task-relative names.
    pub fn plan(&self, names: &dyn Fn(&str) -> String) -> Result<FetchPlan, ArtifactProblem> {
        let names = |text: &str| names(&task_relative(text));
        let source = names(&self.source);
        let (getter, rest) = match source.split_once("::") {
            Some((getter, rest)) if !getter.contains('/') => (Some(getter), rest),
            _ => (None, source.as_str()),
        };
        if let Some(getter) = getter
            && getter != "http"
            && getter != "https"
        {
            return Err(ArtifactProblem::Getter(source.clone(), getter.to_string()));
        }
        let https = if rest.starts_with("https://") {
            true
        } else if rest.starts_with("http://") {
            false
        } else {
            return Err(match guess_getter(rest) {
                Some(getter) => ArtifactProblem::Getter(source.clone(), getter.into()),
                None => ArtifactProblem::NotHttp(source.clone()),
            });
        };
        if rest
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == '#')
        {
            return Err(ArtifactProblem::BadUrl(source.clone()));
        }
        let after_scheme = &rest[if https { 8 } else { 7 }..];
        let authority_end = after_scheme.find(['/', '?']).unwrap_or(after_scheme.len());
        if after_scheme[..authority_end]
            .rsplit('@')
            .next()
            .is_none_or(str::is_empty)
        {
            return Err(ArtifactProblem::NoHost(source.clone()));
        }
        // go-getter reads `checksum` and `archive` from the query and fetches without them.
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut kept = Vec::new();
        let mut options: Vec<(String, String)> = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((key, value)) if OPTIONS.contains(&key) => {
                    options.push((key.to_string(), value.to_string()))
                }
                _ => kept.push(pair),
            }
        }
        for (key, value) in &self.options {
            if !OPTIONS.contains(&key.as_str()) {
                return Err(ArtifactProblem::UnknownOption(key.clone()));
            }
            options.push((key.clone(), names(value)));
        }
        let url = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let checksum = options
            .iter()
            .rev()
            .find(|(k, _)| k == "checksum")
            .map(|(_, v)| checksum(v))
            .transpose()?;
        let path = &after_scheme[authority_end..];
        let path = path.split('?').next().unwrap_or("");
        let last = path.rsplit('/').next().unwrap_or("");
        let archive = match options.iter().rev().find(|(k, _)| k == "archive") {
            Some((_, v)) if v == "false" => None,
            Some((_, v)) => Some(
                EXTENSIONS
                    .iter()
                    .find(|(ext, _)| ext == v)
                    .map(|(_, kind)| *kind)
                    .ok_or_else(|| ArtifactProblem::Archive(v.clone()))?,
            ),
            None => archive_of(last),
        };
        let mode = match self.mode.as_str() {
            "" | "any" => FetchMode::Any,
            "file" => FetchMode::File,
            "dir" => FetchMode::Dir,
            other => return Err(ArtifactProblem::Mode(other.to_string())),
        };
        if mode == FetchMode::Dir && !archive.is_some_and(ArchiveKind::is_tree) {
            return Err(ArtifactProblem::DirNeedsArchive(source.clone()));
        }
        let written = names(&self.destination);
        let destination = destination(&written)?;
        if mode == FetchMode::File && matches!(destination.as_str(), "local" | "secrets") {
            return Err(ArtifactProblem::FileModeDirectory(written));
        }
        if mode == FetchMode::File && archive.is_some_and(ArchiveKind::is_tree) {
            return Err(ArtifactProblem::FileModeArchive(source.clone()));
        }
        let file_name = match archive {
            Some(kind) if !kind.is_tree() => {
                let ext = EXTENSIONS.iter().find(|(_, k)| *k == kind).map(|(e, _)| *e);
                ext.and_then(|ext| last.strip_suffix(ext)?.strip_suffix('.'))
                    .unwrap_or(last)
                    .to_string()
            }
            _ => last.to_string(),
        };
        let file_name = percent_decoded(&file_name);
        let needs_name = mode == FetchMode::Any && archive.is_none_or(|kind| !kind.is_tree());
        if needs_name
            && (file_name.is_empty()
                || file_name == "."
                || file_name == ".."
                || file_name.contains(['/', '\0']))
        {
            return Err(ArtifactProblem::NoFileName(source.clone()));
        }
        let mut headers = Vec::new();
        for (name, value) in &self.headers {
            let value = names(value);
            // The request's framing is the agent's to say.
            let framing = ["host", "content-length", "transfer-encoding", "connection"]
                .iter()
                .any(|f| name.eq_ignore_ascii_case(f));
            let name_ok = !name.is_empty()
                && !framing
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if !name_ok || value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                return Err(ArtifactProblem::Header(name.clone()));
            }
            headers.push((name.clone(), value));
        }
        Ok(FetchPlan {
            url,
            https,
            checksum,
            archive,
            mode,
            destination,
            file_name,
            headers,
            chown: self.chown,
        })
    }
}

impl ArchiveKind {
    /// Unpacks to a tree of files (a tar or a zip), not to one file.
    pub fn is_tree(self) -> bool {
        !matches!(self, ArchiveKind::Gz | ArchiveKind::Xz | ArchiveKind::Bz2)
    }
}

/// `${NOMAD_TASK_DIR}` and `${NOMAD_SECRETS_DIR}` as the destination is checked
/// against (`local`, `secrets`): inside the task they are absolute paths, which no
/// destination may be.
pub fn task_relative(text: &str) -> String {
    text.replace("${NOMAD_TASK_DIR}", "local")
        .replace("${NOMAD_SECRETS_DIR}", "secrets")
}

fn archive_of(file: &str) -> Option<ArchiveKind> {
    let lower = file.to_ascii_lowercase();
    EXTENSIONS
        .iter()
        .find(|(ext, _)| {
            lower
                .strip_suffix(ext)
                .is_some_and(|stem| stem.ends_with('.') && stem.len() > 1)
        })
        .map(|(_, kind)| *kind)
}

/// go-getter's detectors berth would be asked for by a source without a scheme.
fn guess_getter(source: &str) -> Option<&'static str> {
    let git_hosts = ["github.com/", "gitlab.com/", "bitbucket.org/"];
    if source.starts_with("git@")
        || source.ends_with(".git")
        || git_hosts.iter().any(|h| source.starts_with(h))
    {
        Some("git")
    } else if source.starts_with("s3://") || source.contains(".amazonaws.com/") {
        Some("s3")
    } else if source.starts_with("gs://") || source.starts_with("www.googleapis.com/storage") {
        Some("gcs")
    } else if source.starts_with('/') || source.starts_with("file://") {
        Some("file")
    } else {
        None
    }
}

fn checksum(written: &str) -> Result<Checksum, ArtifactProblem> {
    let (kind, hex) = written
        .split_once(':')
        .ok_or_else(|| ArtifactProblem::Checksum(written.to_string()))?;
    let kind = match kind {
        "md5" => ChecksumKind::Md5,
        "sha1" => ChecksumKind::Sha1,
        "sha256" => ChecksumKind::Sha256,
        "sha512" => ChecksumKind::Sha512,
        _ => return Err(ArtifactProblem::Checksum(written.to_string())),
    };
    if hex.len() != kind.digest_len() * 2 {
        return Err(ArtifactProblem::ChecksumLength {
            given: written.to_string(),
            kind: kind.name(),
            got: hex.len(),
            want: kind.digest_len() * 2,
        });
    }
    let digest = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("x"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| ArtifactProblem::Checksum(written.to_string()))?;
    Ok(Checksum { kind, digest })
}

/// The destination relative to the task's directory: `local` (the default), or a path in
/// `local/` or `secrets/`, from that or `${NOMAD_TASK_DIR}` / `${NOMAD_SECRETS_DIR}` (once
/// interpolated, their task-relative forms are taken as well).
fn destination(written: &str) -> Result<String, ArtifactProblem> {
    let relative = written.trim_start_matches("./");
    let parts: Vec<&str> = relative
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    let inside = matches!(parts.first(), Some(&"local" | &"secrets"));
    if !inside || parts.contains(&"..") || relative.starts_with('/') || relative.contains('\0') {
        return Err(ArtifactProblem::Destination(written.to_string()));
    }
    Ok(parts.join("/"))
}

/// `%xx` escapes of a URL path part decoded (a name with a space is sent as `%20`).
fn percent_decoded(part: &str) -> String {
    let bytes = part.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(source: &str) -> Artifact {
        Artifact {
            source: source.into(),
            destination: "local/".into(),
            mode: "any".into(),
            options: Vec::new(),
            headers: Vec::new(),
            chown: false,
            at: Location::default(),
        }
    }

    fn plan(a: &Artifact) -> Result<FetchPlan, ArtifactProblem> {
        a.plan(&|s: &str| s.to_string())
    }

    #[test]
    fn archives_are_known_by_extension_and_the_query_options_are_taken_out() {
        let sha = "a".repeat(64);
        let p = plan(&artifact(&format!(
            "https://example.com/dl/app-1.2.tar.gz?checksum=sha256:{sha}&token=x"
        )))
        .unwrap();
        assert_eq!(p.url, "https://example.com/dl/app-1.2.tar.gz?token=x");
        assert!(p.https);
        assert_eq!(p.archive, Some(ArchiveKind::TarGz));
        assert_eq!(p.checksum.unwrap().to_string(), format!("sha256:{sha}"));
        assert_eq!(p.destination, "local");

        let p = plan(&artifact("http://h:8080/bin/tool.gz")).unwrap();
        assert_eq!(
            (p.archive, p.file_name.as_str()),
            (Some(ArchiveKind::Gz), "tool")
        );
        let mut a = artifact("http://h/a.zip");
        a.options = vec![("archive".into(), "false".into())];
        let p = plan(&a).unwrap();
        assert_eq!((p.archive, p.file_name.as_str()), (None, "a.zip"));
        let p = plan(&artifact("http://h/my%20file.txt")).unwrap();
        assert_eq!(p.file_name, "my file.txt");
        let mut a = artifact("http://h/x.tgz");
        a.destination = "${NOMAD_TASK_DIR}/bin".into();
        a.mode = "dir".into();
        assert_eq!(plan(&a).unwrap().destination, "local/bin");
    }

    #[test]
    fn what_berth_cannot_fetch_is_refused_with_its_reason() {
        let refused = |a: Artifact| plan(&a).unwrap_err().to_string();
        assert!(refused(artifact("git::https://github.com/h/r")).contains("git getter"));
        assert!(refused(artifact("github.com/hashicorp/nomad")).contains("git getter"));
        assert!(refused(artifact("s3::https://b.s3.amazonaws.com/k")).contains("s3 getter"));
        assert!(refused(artifact("/etc/passwd")).contains("file getter"));
        assert!(refused(artifact("ftp://h/x")).contains("not an http"));
        assert!(refused(artifact("http:///x")).contains("names no host"));
        assert!(refused(artifact("http://h/a b")).contains("space"));
        assert!(refused(artifact("http://h/")).contains("names no file"));
        let mut a = artifact("http://h/x?checksum=sha256:abc");
        assert!(refused(a.clone()).contains("has 3 hex digits; a sha256 digest has 64"));
        a.source = format!("http://h/x?checksum=crc32:{}", "0".repeat(8));
        assert!(refused(a.clone()).contains("md5, sha1, sha256 or sha512"));
        a.source = format!("http://h/x?checksum=md5:{}", "zz".repeat(16));
        assert!(refused(a.clone()).contains("<type>:<hex digest>"));
        a.source = "http://h/x".into();
        a.options = vec![("sshkey".into(), "k".into())];
        assert!(refused(a.clone()).contains("\"sshkey\" is not one berth reads"));
        a.options.clear();
        for escape in [
            "../x",
            "/etc",
            "alloc/data",
            "local/../../x",
            "${NOMAD_ALLOC_DIR}",
        ] {
            a.destination = escape.into();
            assert!(
                refused(a.clone()).contains("local/ or secrets/"),
                "{escape}"
            );
        }
        a.destination = "local".into();
        a.mode = "file".into();
        assert!(refused(a.clone()).contains("destination file"));
        a.mode = "dir".into();
        assert!(refused(a.clone()).contains("needs an archive"));
        a.mode = "tree".into();
        assert!(refused(a.clone()).contains("any, file or dir"));
        a.mode = "any".into();
        a.headers = vec![("X-Token".into(), "a\r\nHost: evil".into())];
        assert!(refused(a.clone()).contains("header \"X-Token\""));
        a.headers = vec![("Transfer-Encoding".into(), "chunked".into())];
        assert!(refused(a.clone()).contains("header \"Transfer-Encoding\""));
        a.headers.clear();
        a.source = "http://h/app.tgz".into();
        a.destination = "local/app".into();
        a.mode = "file".into();
        assert!(refused(a).contains("is an archive of many"));
    }
}
