//! Builds the task's directory and its environment. Chrooted tasks also get the alloc's
//! shared directory at `/alloc`; a task on an image, whose root is the image and not its
//! task dir, also gets its `local` and `secrets` at `/local` and `/secrets`.

use std::path::PathBuf;

use super::hooks::{Prestart, TaskHook, TaskHookContext, TaskPrepare};
use berth_model::driver::FsIsolation;
use berth_model::mount::{HandedMount, Propagation};

pub struct TaskDirHook;

impl TaskHook for TaskDirHook {
    fn name(&self) -> &'static str {
        "task_dir"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let fail = |e: std::io::Error| self.fail(format!("building the task directory: {e}"));
            ctx.alloc_dir.build().map_err(fail)?;
            let task_dir = ctx.alloc_dir.build_task(&ctx.task.name).map_err(fail)?;
            let isolation = ctx.driver.capabilities().fs_isolation;
            let chrooted = isolation.confines();
            let (task_view, alloc_view) = if chrooted {
                (PathBuf::from("/local"), PathBuf::from("/alloc"))
            } else {
                (task_dir.join("local"), ctx.alloc_dir.shared())
            };
            let handed = |host_path: PathBuf, task_path: &str| HandedMount {
                host_path,
                task_path: task_path.into(),
                read_only: false,
                propagation: Propagation::Private,
                allow_setuid: false,
                source_below: None,
            };
            if chrooted {
                prepare
                    .mounts
                    .push(handed(ctx.alloc_dir.shared(), "/alloc"));
            }
            if isolation == FsIsolation::Image {
                for dir in ["local", "secrets"] {
                    prepare.mounts.push(HandedMount {
                        // Resolved from the task dir through no link: the task writes
                        // inside these two.
                        source_below: Some(task_dir.clone()),
                        ..handed(task_dir.join(dir), &format!("/{dir}"))
                    });
                }
            }
            let show = |p: &PathBuf| p.display().to_string();
            let mut env = vec![(
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".to_string(),
            )];
            for prefix in ["BERTH", "NOMAD"] {
                env.extend([
                    (format!("{prefix}_ALLOC_ID"), ctx.alloc_id.clone()),
                    (format!("{prefix}_JOB_NAME"), ctx.job.name.clone()),
                    (format!("{prefix}_JOB_ID"), ctx.job.name.clone()),
                    (format!("{prefix}_GROUP_NAME"), ctx.group.name.clone()),
                    (format!("{prefix}_TASK_NAME"), ctx.task.name.clone()),
                    (format!("{prefix}_TASK_DIR"), show(&task_view)),
                    (format!("{prefix}_ALLOC_DIR"), show(&alloc_view)),
                ]);
            }
            // The group's ports, as Nomad names them. In host mode the task's port is the
            // host's; in bridge mode the task listens on `to` in the group's namespace
            // (`NOMAD_PORT_`, `NOMAD_ALLOC_PORT_`), reached on the host's port from outside.
            let ip = crate::consul::service_address(ctx.config.consul.as_ref());
            let alloc_ip = ctx.resources.network().and_then(|n| n.address);
            for port in &ctx.group.ports {
                let Some(number) = port.number else { continue };
                let inside = port.inside(ctx.group.network_mode).unwrap_or(number);
                let label = &port.label;
                env.extend([
                    (format!("NOMAD_PORT_{label}"), inside.to_string()),
                    (format!("NOMAD_HOST_PORT_{label}"), number.to_string()),
                    (format!("NOMAD_IP_{label}"), ip.clone()),
                    (format!("NOMAD_HOST_IP_{label}"), ip.clone()),
                    (format!("NOMAD_ADDR_{label}"), format!("{ip}:{number}")),
                    (format!("NOMAD_HOST_ADDR_{label}"), format!("{ip}:{number}")),
                    (format!("NOMAD_ALLOC_PORT_{label}"), inside.to_string()),
                ]);
                if let Some(alloc_ip) = &alloc_ip {
                    env.extend([
                        (format!("NOMAD_ALLOC_IP_{label}"), alloc_ip.clone()),
                        (
                            format!("NOMAD_ALLOC_ADDR_{label}"),
                            format!("{alloc_ip}:{inside}"),
                        ),
                    ]);
                }
            }
            if let Some(parent) = &ctx.job.parent {
                env.push(("NOMAD_JOB_PARENT_ID".to_string(), parent.clone()));
            }
            // As in Nomad: the job's meta, then the group's, then the task's, each over
            // the one before (a dispatch's meta is part of the job's).
            let mut meta: Vec<(&String, &String)> = Vec::new();
            for (key, value) in ctx
                .job
                .meta
                .iter()
                .chain(&ctx.group.meta)
                .chain(&ctx.task.meta)
            {
                meta.retain(|(k, _)| *k != key);
                meta.push((key, value));
            }
            for (key, value) in meta {
                env.push((format!("NOMAD_META_{key}"), value.clone()));
            }
            // The task's own env comes last, so it wins.
            env.extend(ctx.task.env.iter().cloned());
            prepare.env = dedupe_last_wins(env);
            prepare.task_dir = task_dir;
            Ok(())
        })
    }
}

fn dedupe_last_wins(env: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::with_capacity(env.len());
    for (key, value) in env {
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some(existing) => existing.1 = value,
            None => out.push((key, value)),
        }
    }
    out
}
