//! What a task's templates read from outside the template: the task's environment,
//! files in the task's directory, Nomad's service catalog (the cluster's), the node's
//! addresses, and Consul's keys and services ([`super::template_consul`]). Every read is
//! bounded: a file by the render's byte limit, beneath the
//! task's directory, through no link the task planted.
//!
//! Rendering runs on a blocking thread (the catalog is read with blocking calls), and
//! this records which service names it read, so the watcher knows what to wait for.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use berth_cluster::services::ServiceRecord;
use berth_template::{CallError, Data, Value};

/// The largest file `file` reads.
pub(super) const MAX_FILE: u64 = 1 << 20;

/// The most files one render of a template reads (each is watched while the task runs).
pub(super) const MAX_FILES: usize = 64;

/// A task's answers to its templates' data functions.
pub(super) struct TaskTemplateData {
    pub env: Arc<BTreeMap<String, String>>,
    /// The task's directory: `file` paths are read beneath it.
    pub task_dir: PathBuf,
    pub services: Arc<crate::consul::ServiceClient>,
    /// The node's address on its default route (`sockaddr "GetPrivateIP"`).
    pub node_address: String,
    /// Whether the template read anything that changes while the task runs.
    pub watched: BTreeSet<Watched>,
    /// What this render read from the catalog, by service name (`""`: the names):
    /// read once per render, however often the template asks.
    pub services_read: BTreeMap<String, Value>,
    /// What this render asked Consul.
    pub consul: super::template_consul::ConsulReads,
}

/// What a render read that may change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Watched {
    Services,
    File(String),
    Consul(super::template_consul::ConsulRead),
}

/// `relative` beneath `task_dir` as a path only (`O_PATH`: nothing of it is opened),
/// through no link, with what it is.
fn open_beneath(
    task_dir: &std::path::Path,
    relative: &str,
) -> Result<(std::os::fd::OwnedFd, rustix::fs::Stat), rustix::io::Errno> {
    let dir = rustix::fs::open(
        task_dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let fd = rustix::fs::openat2(
        &dir,
        relative,
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    let stat = rustix::fs::fstat(&fd)?;
    Ok((fd, stat))
}

/// What the watcher compares to tell that a file a template read has changed: its
/// inode, size and modification time (`None`: gone or unreachable).
pub(super) fn file_fingerprint(
    task_dir: &std::path::Path,
    relative: &str,
) -> Option<(u64, i64, i64, i64)> {
    let (_, stat) = open_beneath(task_dir, relative).ok()?;
    Some((
        stat.st_ino,
        stat.st_size,
        stat.st_mtime,
        stat.st_mtime_nsec as i64,
    ))
}

/// A template's file as it is on disk (after an agent restart), read as `file` reads:
/// beneath the task's directory, through no link, a regular file, at most `limit` bytes
/// of it. `None` for anything else.
pub(super) fn read_back(task_dir: &std::path::Path, relative: &str, limit: u64) -> Option<String> {
    let (fd, stat) = open_beneath(task_dir, relative).ok()?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return None;
    }
    let fd = rustix::fs::open(
        format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)),
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .ok()?;
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(limit)
        .read_to_end(&mut bytes)
        .ok()?;
    String::from_utf8(bytes).ok()
}

impl TaskTemplateData {
    fn file(&mut self, path: &str) -> Result<Value, CallError> {
        // Nomad's sandbox: paths are the task directory's; an absolute path must be in
        // it.
        let task_dir = self.task_dir.to_string_lossy().to_string();
        let relative = match path.strip_prefix(&format!("{task_dir}/")) {
            Some(rest) => rest,
            None if path.starts_with('/') => {
                return Err(format!(
                    "{path:?} is outside the task's directory; templates read files only \
                     inside it (as \"local/app.json\")"
                )
                .into());
            }
            None => path,
        };
        // One spelling per file (`./local//a` is `local/a`), none that goes up: what is
        // watched is a short list of files, not of ways to write one.
        let parts: Vec<&str> = relative
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if parts.contains(&"..") {
            return Err(format!("{path:?}: template file paths do not go up (..)").into());
        }
        let relative = parts.join("/");
        let relative = relative.as_str();
        let watched = Watched::File(relative.to_string());
        let files = self
            .watched
            .iter()
            .filter(|w| matches!(w, Watched::File(_)))
            .count();
        if !self.watched.contains(&watched) && files >= MAX_FILES {
            return Err(format!("a template reads at most {MAX_FILES} files").into());
        }
        self.watched.insert(watched);
        let (fd, stat) = open_beneath(&self.task_dir, relative).map_err(|e| {
            CallError(match e {
                rustix::io::Errno::XDEV | rustix::io::Errno::LOOP => format!(
                    "{path:?} leads out of the task's directory or through a symlink; berth \
                     does not follow it"
                ),
                rustix::io::Errno::NOENT => format!("{path:?} does not exist"),
                other => format!("{path:?}: {other}"),
            })
        })?;
        match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
            rustix::fs::FileType::RegularFile => {}
            // O_PATH with O_NOFOLLOW opens the link itself.
            rustix::fs::FileType::Symlink => {
                return Err(format!(
                    "{path:?} is a symlink; berth does not follow links in the task's \
                     directory"
                )
                .into());
            }
            _ => return Err(format!("{path:?} is not a regular file").into()),
        }
        // Opened for reading only now that it is known to be a regular file (a device
        // or FIFO the task left there is never opened).
        let fd = rustix::fs::open(
            format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)),
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| CallError(format!("{path:?}: {e}")))?;
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(MAX_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| CallError(e.to_string()))?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(format!("{path:?} is larger than {MAX_FILE} bytes").into());
        }
        String::from_utf8(bytes)
            .map(Value::str)
            .map_err(|_| CallError(format!("{path:?} is not UTF-8 text")))
    }

    fn nomad_service(&mut self, args: &[Value]) -> Result<Value, CallError> {
        self.watched.insert(Watched::Services);
        // `nomadService "name"`, or Nomad's sharding form `nomadService COUNT KEY "name"`:
        // the COUNT instances that rendezvous hashing picks for KEY.
        let (name, pick) = match args {
            [Value::Str(name)] => (name.to_string(), None),
            [count, Value::Str(key), Value::Str(name)] => {
                let count = count
                    .as_int()
                    .filter(|c| *c > 0)
                    .ok_or("the count of instances must be a whole number above 0")?;
                (name.to_string(), Some((count as usize, key.to_string())))
            }
            _ => {
                return Err(
                    "takes a service name, or a count, a key and a name (nomadService 2 \
                     $key \"web\")"
                        .into(),
                );
            }
        };
        let name = match name.split_once('@') {
            Some((name, "default")) => name.to_string(),
            Some((_, namespace)) => {
                return Err(format!(
                    "namespace {namespace:?}: berth has the \"default\" namespace only"
                )
                .into());
            }
            None => name,
        };
        if pick.is_none()
            && let Some(read) = self.services_read.get(&name)
        {
            return Ok(read.clone());
        }
        let mut records =
            (self.services.nomad_service(&name)).map_err(|e| CallError(e.to_string()))?;
        if let Some((count, key)) = &pick {
            records.sort_by_key(|r| std::cmp::Reverse(rendezvous(key, &r.id)));
            records.truncate(*count);
        }
        let value = Value::list(records.iter().map(service_value).collect());
        if pick.is_none() {
            self.services_read.insert(name, value.clone());
        }
        Ok(value)
    }

    fn nomad_services(&mut self, args: &[Value]) -> Result<Value, CallError> {
        self.watched.insert(Watched::Services);
        if !args.is_empty() {
            return Err("takes no arguments in berth (one namespace: \"default\")".into());
        }
        if let Some(read) = self.services_read.get("") {
            return Ok(read.clone());
        }
        let names = (self.services.nomad_service_names()).map_err(|e| CallError(e.to_string()))?;
        let value = Value::list(
            names
                .into_iter()
                .map(|n| {
                    Value::object(
                        "service",
                        BTreeMap::from([
                            ("Name", Value::str(n.name)),
                            ("Namespace", Value::str("default")),
                            (
                                "Tags",
                                Value::list(n.tags.into_iter().map(Value::str).collect()),
                            ),
                        ]),
                    )
                })
                .collect(),
        );
        self.services_read.insert(String::new(), value.clone());
        Ok(value)
    }

    fn sockaddr(&self, args: &[Value]) -> Result<Value, CallError> {
        let [Value::Str(expression)] = args else {
            return Err("takes one go-sockaddr expression, as \"GetPrivateIP\"".into());
        };
        let address: std::net::IpAddr = self.node_address.parse().map_err(|_| {
            format!(
                "the node's address {:?} is not an IP address",
                self.node_address
            )
        })?;
        let private = match address {
            std::net::IpAddr::V4(v4) => v4.is_private() || v4.is_loopback(),
            std::net::IpAddr::V6(v6) => v6.is_unique_local() || v6.is_loopback(),
        };
        match expression.trim() {
            "GetPrivateIP" if private => Ok(Value::str(self.node_address.clone())),
            "GetPublicIP" if !private => Ok(Value::str(self.node_address.clone())),
            "GetPrivateIP" | "GetPublicIP" => Ok(Value::str("")),
            other => Err(format!(
                "{other:?}: berth answers GetPrivateIP and GetPublicIP (the node's address \
                 on its default route), not other go-sockaddr expressions"
            )
            .into()),
        }
    }
}

/// A service instance as Nomad's templates see it.
fn service_value(record: &ServiceRecord) -> Value {
    Value::object(
        "service",
        BTreeMap::from([
            ("Address", Value::str(record.address.clone())),
            ("AllocID", Value::str(record.alloc_id.clone())),
            ("Datacenter", Value::str(record.datacenter.clone())),
            ("ID", Value::str(record.id.clone())),
            ("JobID", Value::str(record.job_id.clone())),
            ("Name", Value::str(record.service_name.clone())),
            ("Namespace", Value::str(record.namespace.clone())),
            ("NodeID", Value::str(record.node_id.clone())),
            ("Port", Value::Int(i64::from(record.port))),
            ("ServiceName", Value::str(record.service_name.clone())),
            (
                "Tags",
                Value::list(record.tags.iter().map(|t| Value::str(t.clone())).collect()),
            ),
        ]),
    )
}

/// Rendezvous (highest random weight) hashing: each instance's weight for a key, the
/// same on every node, so that a subset picked for a key moves little as instances come
/// and go.
fn rendezvous(key: &str, id: &str) -> u64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(format!("{key}\0{id}").as_bytes());
    u64::from_be_bytes(digest[..8].try_into().unwrap_or([0; 8]))
}

impl Data for TaskTemplateData {
    fn call(&mut self, function: &str, args: &[Value]) -> Result<Value, CallError> {
        match function {
            "env" => match args {
                [Value::Str(name)] => Ok(Value::str(
                    self.env.get(&**name).cloned().unwrap_or_default(),
                )),
                _ => Err("takes one name, as env \"HOME\"".into()),
            },
            "file" => match args {
                [Value::Str(path)] => self.file(path),
                _ => Err("takes one path, as file \"local/app.json\"".into()),
            },
            "nomadService" => self.nomad_service(args),
            "nomadServices" => self.nomad_services(args),
            "sockaddr" => self.sockaddr(args),
            consul if crate::consul::TEMPLATE_READS.contains(&consul) => {
                self.consul.call(consul, args)
            }
            other => Err(format!("berth has no answer for {other}").into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(task_dir: &std::path::Path) -> TaskTemplateData {
        TaskTemplateData {
            env: Arc::new(BTreeMap::from([("A".to_string(), "1".to_string())])),
            task_dir: task_dir.to_path_buf(),
            services: Arc::new(crate::consul::ServiceClient::disabled()),
            node_address: "10.1.2.3".into(),
            watched: BTreeSet::new(),
            services_read: BTreeMap::new(),
            consul: super::super::template_consul::ConsulReads::new(
                None,
                super::super::template_consul::tests::runtime(),
            ),
        }
    }

    /// `file` reads the task's own files, and nothing a link it planted points at, nor
    /// anything outside its directory, nor what is not a regular file.
    #[test]
    fn file_reads_beneath_the_task_directory_through_no_link() {
        let root = tempfile::tempdir().unwrap();
        let task_dir = root.path().join("task");
        std::fs::create_dir_all(task_dir.join("local")).unwrap();
        std::fs::write(root.path().join("host-secret"), "host").unwrap();
        std::fs::write(task_dir.join("local/app.json"), "{\"a\":1}").unwrap();
        std::os::unix::fs::symlink(root.path().join("host-secret"), task_dir.join("local/link"))
            .unwrap();
        std::os::unix::fs::symlink("app.json", task_dir.join("local/inside-link")).unwrap();
        std::os::unix::fs::symlink(root.path(), task_dir.join("local/dir-link")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            task_dir.join("local/fifo"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let mut data = data(&task_dir);
        let read = |data: &mut TaskTemplateData, path: &str| {
            data.call("file", &[Value::str(path)])
                .map(|v| v.to_go_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(read(&mut data, "local/app.json"), Ok("{\"a\":1}".into()));
        let absolute = format!("{}/local/app.json", task_dir.display());
        assert_eq!(read(&mut data, &absolute), Ok("{\"a\":1}".into()));
        for (path, refusal) in [
            ("local/link", "is a symlink"),
            ("local/inside-link", "is a symlink"),
            ("local/./link", "is a symlink"),
            ("local/dir-link/host-secret", "through a symlink"),
            ("../host-secret", "do not go up"),
            ("local/./../local/app.json", "do not go up"),
            ("/etc/passwd", "outside the task's directory"),
            ("local/fifo", "not a regular file"),
            ("local/none", "does not exist"),
        ] {
            let error = read(&mut data, path).unwrap_err();
            assert!(error.contains(refusal), "{path}: {error}");
        }
        // What it read is watched, under one spelling.
        assert_eq!(
            read(&mut data, "./local//./app.json"),
            Ok("{\"a\":1}".into())
        );
        let files: Vec<&Watched> = data
            .watched
            .iter()
            .filter(|w| matches!(w, Watched::File(_)))
            .collect();
        assert!(
            files.contains(&&Watched::File("local/app.json".into())),
            "{files:?}"
        );
        // No more than MAX_FILES of them.
        for i in 0..MAX_FILES {
            let _ = read(&mut data, &format!("local/none-{i}"));
        }
        let error = read(&mut data, "local/one-more").unwrap_err();
        assert!(error.contains("at most 64 files"), "{error}");
    }

    #[test]
    fn a_file_larger_than_the_limit_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("local")).unwrap();
        let big = vec![b'x'; (MAX_FILE + 1) as usize];
        std::fs::write(root.path().join("local/big"), big).unwrap();
        let error = data(root.path())
            .call("file", &[Value::str("local/big")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("larger than 1048576 bytes"), "{error}");
    }

    #[test]
    fn services_come_from_the_catalog_and_sockaddr_from_the_node() {
        let root = tempfile::tempdir().unwrap();
        let mut data = data(root.path());
        let none = data.call("nomadService", &[Value::str("db")]).unwrap();
        assert_eq!(none.to_go_string(), "[]");
        assert!(data.watched.contains(&Watched::Services));
        let error = data
            .call("nomadService", &[Value::str("db@other")])
            .unwrap_err()
            .to_string();
        assert!(error.contains("\"default\" namespace only"), "{error}");
        assert_eq!(
            data.call("sockaddr", &[Value::str("GetPrivateIP")])
                .unwrap()
                .to_go_string(),
            "10.1.2.3"
        );
        assert_eq!(
            data.call("env", &[Value::str("A")]).unwrap().to_go_string(),
            "1"
        );
    }
}
