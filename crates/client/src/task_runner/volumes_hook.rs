//! Turns the group's volumes and the task's `volume_mount`s into driver mounts, and
//! checks MountConfig again (with the message of the submit-time check), so a job that
//! skipped validation still fails cleanly here.

use super::hooks::{Prestart, TaskHook, TaskHookContext, TaskPrepare};
use crate::validate::{bidirectional_refusal, mount_config_refusal};
use berth_jobspec::VolumeType;
use berth_jobspec::interpolate::interpolate;
use berth_jobspec::names::normalise_task_path;
use berth_model::mount::HandedMount;

pub struct VolumesHook;

impl TaskHook for VolumesHook {
    fn name(&self) -> &'static str {
        "volumes"
    }

    fn prestart<'a>(
        &'a self,
        ctx: &'a TaskHookContext,
        prepare: &'a mut TaskPrepare,
    ) -> Prestart<'a> {
        Box::pin(async move {
            let fail = |message: String| self.fail(message);
            for mount in &ctx.task.volume_mounts {
                if let Some(refusal) = mount_config_refusal(&ctx.task.name, &ctx.driver, mount) {
                    return Err(fail(refusal));
                }
                let volume = ctx
                    .group
                    .volumes
                    .iter()
                    .find(|v| v.name == mount.volume)
                    .ok_or_else(|| {
                        fail(format!(
                            "volume {:?} is not declared in group {:?}",
                            mount.volume, ctx.group.name
                        ))
                    })?;
                let (host_path, host_read_only, allow_setuid, source_below) = match volume
                    .volume_type
                {
                    VolumeType::Host => {
                        let host = ctx.config.host_volume(&volume.source).ok_or_else(|| {
                            fail(format!(
                                "host volume {:?} is not configured on this agent",
                                volume.source
                            ))
                        })?;
                        (host.path.clone(), host.read_only, host.allow_setuid, None)
                    }
                    VolumeType::Csi => {
                        let mounted = ctx.resources.csi_mount(&volume.name).ok_or_else(|| {
                            fail(format!(
                                "CSI volume {:?} was not mounted for this alloc",
                                volume.name
                            ))
                        })?;
                        // The plugin writes below the CSI root: no link of its is followed.
                        (
                            mounted.host_path,
                            mounted.read_only,
                            false,
                            Some(ctx.csi.root.clone()),
                        )
                    }
                };
                if let Some(refusal) =
                    bidirectional_refusal(&ctx.task.name, mount, volume, host_read_only)
                {
                    return Err(fail(refusal));
                }
                if !host_path.exists() {
                    return Err(fail(format!(
                        "volume {:?}: its source {} does not exist on this host",
                        volume.name,
                        host_path.display()
                    )));
                }
                let destination = if mount.destination.contains("${") {
                    let lookup = super::interpolate_hook::runtime_names(ctx, &prepare.env);
                    let interpolated = interpolate(&mount.destination, &lookup);
                    normalise_task_path(&interpolated).map_err(|error| {
                        fail(format!(
                            "volume_mount {:?}: destination {:?} is {interpolated:?} here, \
                             and {error}",
                            mount.volume, mount.destination
                        ))
                    })?
                } else {
                    mount.destination.clone()
                };
                prepare.mounts.push(HandedMount {
                    host_path,
                    task_path: destination.into(),
                    read_only: volume.read_only || mount.read_only || host_read_only,
                    propagation: mount.propagation,
                    allow_setuid,
                    source_below,
                });
            }
            Ok(())
        })
    }
}
