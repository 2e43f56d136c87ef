//! The group's own `/etc` files, written by the host before any task starts and bound
//! read-only over the host's in every confined task's `/etc`:
//!
//! - `resolv.conf`: the `network { dns { … } }` block's, as Nomad writes it. Without one,
//!   the host's, copied when a task could not read or use it: the host's is a link (to
//!   systemd-resolved's file under `/run`, which no task root has), or, in bridge mode,
//!   names only loopback resolvers (`127.0.0.53`), unreachable from the group's own
//!   namespace; then systemd-resolved's list of upstream servers is used, as Docker does.
//! - `hosts` (bridge mode): `localhost`, and the alloc's address under its host name
//!   (`network { hostname }`, or the alloc id's first 8 characters).
//!
//! They live in the alloc's root (`etc/`), which only berth writes, and go with it.

use std::path::Path;

use berth_jobspec::{Group, NetworkMode};
use berth_sys::alloc_dir::GROUP_ETC_FILES;

use super::{AllocHook, AllocRunner};
use crate::task_runner::hooks::{BoxFuture, HookError};

/// The host's resolver configuration, and systemd-resolved's list of the servers behind
/// its loopback stub.
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";
const RESOLVED_UPSTREAM: &str = "/run/systemd/resolve/resolv.conf";

/// The most of a host resolver file read (they are a few lines).
const MAX_HOST_FILE: u64 = 64 * 1024;

pub(super) struct EtcFilesHook;

/// Why the group's own `/etc` files could not be given to it.
#[derive(Debug, thiserror::Error)]
pub(super) enum EtcFilesError {
    #[error(
        "the group's network {{ dns }} needs an /etc/resolv.conf on the node to cover, and it has none"
    )]
    NoHostResolvConf,
    #[error("writing the group's /etc files in {dir}: {source}")]
    Write {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl AllocHook for EtcFilesHook {
    fn name(&self) -> &'static str {
        "etc_files"
    }

    fn prerun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            let Some(dir) = alloc.alloc_dir.group_etc() else {
                return Ok(());
            };
            let address = alloc.resources.network().and_then(|n| n.address);
            let fail = |error: EtcFilesError| HookError {
                hook: "etc_files".into(),
                message: error.to_string(),
            };
            let files = group_files(alloc, address.as_deref()).map_err(fail)?;
            berth_sys::blocking::run(|| write_all(&dir, &files)).map_err(|source| {
                fail(EtcFilesError::Write {
                    dir: dir.clone(),
                    source,
                })
            })
        })
    }
}

/// What the group's tasks should see, by file name; a file absent here is the host's.
/// A group that asked for its own resolver on a node without `/etc/resolv.conf` to
/// cover is refused (its tasks' `/etc` is the host's, read-only); a bridge group's
/// `hosts` on a node without one is left out, as the host's is.
fn group_files(
    alloc: &AllocRunner,
    address: Option<&str>,
) -> Result<Vec<(&'static str, String)>, EtcFilesError> {
    let bridge = alloc.group.network_mode == NetworkMode::Bridge;
    files_for(&alloc.group, &alloc.id, bridge, address)
}

/// An image task's own network's files (Docker's default bridge, in a host-mode
/// group), as a bridge group's: a resolver a namespace on the bridge can reach, and
/// `hosts` with the task's address.
pub(super) fn own_network_files(
    group: &Group,
    alloc_id: &str,
    address: Option<&str>,
) -> Result<Vec<(&'static str, String)>, EtcFilesError> {
    files_for(group, alloc_id, true, address)
}

fn files_for(
    group: &Group,
    alloc_id: &str,
    bridge: bool,
    address: Option<&str>,
) -> Result<Vec<(&'static str, String)>, EtcFilesError> {
    let on_host = |name: &str| std::fs::symlink_metadata(Path::new("/etc").join(name)).is_ok();
    let mut files = Vec::new();
    let linked = std::fs::symlink_metadata(HOST_RESOLV_CONF).is_ok_and(|m| m.is_symlink());
    if group.dns.is_some() || bridge || linked {
        let host = host_resolver(bridge);
        let resolv = match &group.dns {
            Some(dns) => {
                if !on_host("resolv.conf") {
                    return Err(EtcFilesError::NoHostResolvConf);
                }
                Some(dns.resolv_conf(host.as_ref().map_or("", |(text, _)| text)))
            }
            None => host.filter(|(_, copy)| *copy).map(|(text, _)| text),
        };
        if let Some(resolv) = resolv {
            files.push(("resolv.conf", resolv));
        }
    }
    if bridge
        && let Some(address) = address
        && on_host("hosts")
    {
        let name = group
            .hostname
            .clone()
            .filter(|name| berth_jobspec::names::is_host_name(name))
            .unwrap_or_else(|| alloc_id.chars().take(8).collect());
        files.push(("hosts", hosts(address, &name)));
    }
    Ok(files)
}

/// The group's `hosts`: loopback's names, and the alloc's address under `name`.
fn hosts(address: &str, name: &str) -> String {
    format!(
        "# written by berth for the group's network\n\
         127.0.0.1 localhost\n\
         ::1 localhost ip6-localhost ip6-loopback\n\
         fe00::0 ip6-localnet\n\
         ff00::0 ip6-mcastprefix\n\
         ff02::1 ip6-allnodes\n\
         ff02::2 ip6-allrouters\n\
         \n\
         # the alloc's address in the group's network\n\
         {address} {name}\n"
    )
}

/// The resolver the group's tasks would use from the host, and whether it must be
/// copied for them (see the module's doc): the host's file (read through a link), or
/// in bridge mode, when it names only loopback servers, systemd-resolved's upstream
/// list. `None`: the node has none.
fn host_resolver(bridge: bool) -> Option<(String, bool)> {
    let linked = std::fs::symlink_metadata(HOST_RESOLV_CONF).is_ok_and(|m| m.is_symlink());
    let host = read_bounded(Path::new(HOST_RESOLV_CONF))?;
    if bridge
        && only_loopback_servers(&host)
        && let Some(upstream) = read_bounded(Path::new(RESOLVED_UPSTREAM))
            .filter(|upstream| !only_loopback_servers(upstream))
    {
        return Some((upstream, true));
    }
    Some((host, linked))
}

fn read_bounded(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_HOST_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Whether every `nameserver` of a resolver file is a loopback address (or there is
/// none, which glibc reads as the local host's).
fn only_loopback_servers(resolv_conf: &str) -> bool {
    resolv_conf
        .lines()
        .filter_map(|line| line.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .all(|server| {
            server
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
        })
}

/// Writes `files` in `dir` (made 0755 if missing), each 0644 and replaced whole (a task
/// starting meanwhile sees the old one or the new one), and removes the others of
/// [`GROUP_ETC_FILES`]: a restarted agent's group never sees another run's.
pub(super) fn write_all(dir: &Path, files: &[(&'static str, String)]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if files.is_empty() && std::fs::symlink_metadata(dir).is_err() {
        // The common case (host mode, no dns block): nothing to write or remove.
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for name in GROUP_ETC_FILES {
        let path = dir.join(name);
        match files.iter().find(|(wanted, _)| *wanted == name) {
            Some((_, text)) => {
                let staged = dir.join(format!(".{name}.new"));
                std::fs::write(&staged, text)?;
                std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))?;
                std::fs::rename(&staged, &path)?;
            }
            None => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            },
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only_resolvers_are_told_apart() {
        assert!(only_loopback_servers(
            "nameserver 127.0.0.53\noptions edns0\n"
        ));
        assert!(only_loopback_servers("nameserver ::1\n"));
        assert!(only_loopback_servers("# none\n"));
        assert!(!only_loopback_servers(
            "nameserver 127.0.0.53\nnameserver 10.0.0.2\n"
        ));
        assert!(!only_loopback_servers("  nameserver\t10.255.255.53\n"));
    }

    #[test]
    fn hosts_names_the_alloc_address() {
        let text = hosts("172.26.64.9", "web-1");
        assert!(text.contains("127.0.0.1 localhost\n"), "{text}");
        assert!(text.ends_with("\n172.26.64.9 web-1\n"), "{text}");
    }

    #[test]
    fn files_are_replaced_and_the_unwanted_removed() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        write_all(
            &etc,
            &[("resolv.conf", "a\n".into()), ("hosts", "h\n".into())],
        )
        .unwrap();
        write_all(&etc, &[("resolv.conf", "b\n".into())]).unwrap();
        assert_eq!(
            std::fs::read_to_string(etc.join("resolv.conf")).unwrap(),
            "b\n"
        );
        assert!(!etc.join("hosts").exists());
        let names: Vec<_> = std::fs::read_dir(&etc)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["resolv.conf"]);
    }
}
