//! Renders the task's `template` blocks into its directory before it starts, and adds
//! the `env = true` ones to its environment; writes a dispatched job's payload to the
//! task's `dispatch_payload` file.
//!
//! The task's directory is the task's to write, and a task restarts: by then a
//! destination may be a symlink it planted to a host file. So each file is opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` from the task's directory: the
//! agent, as root, never writes outside it, whatever the task did there.

use std::io::Write as _;
use std::os::fd::AsFd as _;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::hooks::{Prestart, TaskHook, TaskHookContext, TaskPrepare};
use berth_jobspec::template::{env_lines, render};

pub struct TemplateHook;

impl TaskHook for TemplateHook {
    fn name(&self) -> &'static str {
        "template"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            // A task with ids of its own owns what is written for it (a template of
            // mode 0600 is then readable by it, and by no other user but root).
            let owner = ctx.dynamic_user.map(|user| (user, &*ctx.sys));
            if let (Some(file), Some(payload)) = (&ctx.task.dispatch_payload, &ctx.job.payload) {
                write_beneath_for(&prepare.task_dir, file, payload, 0o644, owner).map_err(|e| {
                    self.fail(format!("writing the dispatch payload to {file}: {e}"))
                })?;
            }
            if ctx.task.templates.is_empty() {
                return Ok(());
            }
            let env: std::collections::BTreeMap<String, String> =
                prepare.env.iter().cloned().collect();
            let mut added = Vec::new();
            for template in &ctx.task.templates {
                let fail = |message: &dyn std::fmt::Display| {
                    self.fail(format!("{}: {message}", template.destination))
                };
                let rendered =
                    render(&template.data, &|name| env.get(name).cloned()).map_err(|e| fail(&e))?;
                write_beneath_for(
                    &prepare.task_dir,
                    &template.destination,
                    rendered.as_bytes(),
                    template.perms,
                    owner,
                )
                .map_err(|e| fail(&e))?;
                if template.env {
                    for (key, value) in env_lines(&rendered).map_err(|e| fail(&e))? {
                        let valid = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                        if !valid || value.contains('\0') {
                            return Err(fail(&format!(
                                "{key:?} is not an environment variable name"
                            )));
                        }
                        added.push((key, value));
                    }
                }
            }
            for (key, value) in added {
                match prepare.env.iter_mut().find(|(k, _)| *k == key) {
                    Some(existing) => existing.1 = value,
                    None => prepare.env.push((key, value)),
                }
            }
            Ok(())
        })
    }
}

/// Writes `bytes` to `relative` under `root`, never through a symlink or out of `root`;
/// the file then given to `owner` (the task's user) through `sys`.
pub(super) fn write_beneath_for(
    root: &std::path::Path,
    relative: &str,
    bytes: &[u8],
    perms: u32,
    owner: Option<(berth_model::driver::TaskUser, &dyn berth_sys::Sys)>,
) -> std::io::Result<()> {
    let not_a_file = || {
        std::io::Error::other(
            "the destination is not a regular file (the task left a FIFO, a device or a \
             socket there); berth writes regular files only",
        )
    };
    let refused = |e: rustix::io::Errno| -> std::io::Error {
        if e == rustix::io::Errno::XDEV || e == rustix::io::Errno::LOOP {
            std::io::Error::other(
                "the path leads out of the task's directory or through a symlink; berth \
                 does not follow it",
            )
        } else {
            e.into()
        }
    };
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    // The directories on the way are made as Nomad makes them, one at a time from the
    // one before, never through a symlink.
    let mut current: std::os::fd::OwnedFd = std::fs::File::open(root)?.into();
    let parts: Vec<&str> = relative.split('/').collect();
    let Some((name, parents)) = parts.split_last() else {
        return Err(std::io::Error::other("an empty destination"));
    };
    for part in parents {
        match rustix::fs::mkdirat(&current, *part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(error) => return Err(refused(error)),
        }
        current = rustix::fs::openat2(
            &current,
            *part,
            OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            resolve,
        )
        .map_err(refused)?;
    }
    use berth_sys::mount::beneath::{WriteOpenError, open_file_for_writing};
    let fd = open_file_for_writing(current.as_fd(), *name, perms).map_err(|e| match e {
        WriteOpenError::NotAFile => not_a_file(),
        WriteOpenError::Open(e) => refused(e),
    })?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(perms))?;
    if let Some((user, sys)) = owner {
        sys.give_file(fd.as_fd(), user)?;
    }
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    Ok(())
}
