//! `csi_hook`: mounts the group's CSI volumes before any task starts, and gives them
//! back when the alloc is done.
//!
//! For each CSI volume, in order: claim it in the catalog (the access mode may refuse),
//! then have the CSI manager publish it (waiting for the node plugin, controller
//! publish, stage, publish). The host paths go to the task runners through the hook
//! resources. If any step fails, everything already done is undone in reverse order
//! (unpublish, unstage, controller unpublish, release the claim), so a failed alloc
//! leaves no mount and no claim behind.
//!
//! After an agent restart, mounts recorded in the hook resources that are still
//! mounted are reused as they are: nothing is staged or published twice. An alloc that
//! was stopping when the agent died is not mounted again; its give-back finishes.

use std::collections::BTreeMap;

use super::{AllocHook, AllocRunner};
use crate::task_runner::hooks::{BoxFuture, HookError};
use berth_csi::manager::CsiVolumeError;
use berth_jobspec::{VolumeRequest, VolumeType};
use berth_model::csi::{AccessMode, AttachmentMode, CsiNameError, Usage};
use berth_model::hook_resources::MountedVolume;
use berth_state::catalog::{CatalogError, Claim, ClaimMode, short_id};

pub struct CsiHook;

/// Why one CSI volume could not be claimed, mounted or given back.
#[derive(Debug, thiserror::Error)]
enum CsiHookError {
    #[error(transparent)]
    Mode(#[from] CsiNameError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("claiming the volume: {0}")]
    Claim(CatalogError),
    #[error(transparent)]
    Volume(#[from] CsiVolumeError),
}

/// The usage a volume request asks for. Validation made sure the modes parse.
pub fn usage_of(request: &VolumeRequest) -> Result<Usage, CsiNameError> {
    let access_mode = AccessMode::parse(request.access_mode.as_deref().unwrap_or(""))?;
    let attachment_mode =
        AttachmentMode::parse(request.attachment_mode.as_deref().unwrap_or("file-system"))?;
    Ok(Usage {
        access_mode,
        attachment_mode,
        read_only: request.read_only || access_mode.read_only(),
    })
}

fn csi_requests(alloc: &AllocRunner) -> Vec<VolumeRequest> {
    alloc
        .group
        .volumes
        .iter()
        .filter(|v| v.volume_type == VolumeType::Csi)
        .cloned()
        .collect()
}

/// A step done for one volume, undone in reverse.
enum Done {
    Claimed { volume_id: String },
    Mounted { volume_id: String, usage: Usage },
}

impl CsiHook {
    fn claim_for(alloc: &AllocRunner, usage: Usage, external_node_id: Option<String>) -> Claim {
        Claim {
            alloc_id: alloc.id.clone(),
            alloc_name: alloc.name.clone(),
            mode: if usage.read_only {
                ClaimMode::Read
            } else {
                ClaimMode::Write
            },
            access_mode: usage.access_mode,
            node: alloc.node.csi.node_name.clone(),
            since: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            external_node_id,
        }
    }

    async fn mount_one(
        alloc: &AllocRunner,
        request: &VolumeRequest,
        done: &mut Vec<Done>,
    ) -> Result<MountedVolume, CsiHookError> {
        let csi = &alloc.node.csi;
        let usage = usage_of(request)?;
        let volume = csi.catalog.volume(&request.source)?.volume;
        // The claim names this node's id for the plugin when a controller publishes to
        // it: should this node be lost, the cluster unpublishes the volume from it.
        let external_node_id = csi.manager.claim_node_id(&volume.plugin_id).await?;
        csi.catalog
            .claim(&volume.id, Self::claim_for(alloc, usage, external_node_id))
            .map_err(CsiHookError::Claim)?;
        done.push(Done::Claimed {
            volume_id: volume.id.clone(),
        });
        let host_path = csi.manager.mount_volume(&alloc.id, &volume, usage).await?;
        done.push(Done::Mounted {
            volume_id: volume.id.clone(),
            usage,
        });
        Ok(MountedVolume {
            host_path,
            read_only: usage.read_only,
        })
    }

    async fn undo(alloc: &AllocRunner, done: Vec<Done>) -> Vec<String> {
        let csi = &alloc.node.csi;
        let mut problems = Vec::new();
        // A volume that could not be unmounted keeps its claim: it is still in use.
        let mut still_mounted = Vec::new();
        for step in done.into_iter().rev() {
            let result = match &step {
                Done::Mounted { volume_id, usage } => {
                    let result = csi
                        .manager
                        .unmount_volume(&alloc.id, volume_id, *usage)
                        .await;
                    if result.is_err() {
                        still_mounted.push(volume_id.clone());
                    }
                    result.map_err(CsiHookError::from)
                }
                Done::Claimed { volume_id } if still_mounted.contains(volume_id) => Ok(()),
                Done::Claimed { volume_id } => csi
                    .catalog
                    .release(volume_id, &alloc.id)
                    .map_err(CsiHookError::from),
            };
            if let Err(problem) = result {
                tracing::error!(alloc = %alloc.id, %problem, "giving back a CSI volume");
                problems.push(problem.to_string());
            }
        }
        problems
    }

    /// Gives back what the alloc holds; true when nothing is left. The alloc's resources
    /// keep its mounts until every one is given back.
    pub(super) async fn give_back(alloc: &AllocRunner) -> bool {
        let held = Self::held(alloc);
        if held.is_empty() {
            return true;
        }
        let problems = Self::undo(alloc, held).await;
        if problems.is_empty() {
            alloc.resources.set_csi_mounts(BTreeMap::new());
            alloc.save_resources(berth_state::Commit::Durable);
            true
        } else {
            tracing::error!(alloc = %short_id(&alloc.id),
                "some CSI volumes could not be given back: {}", problems.join("; "));
            false
        }
    }

    /// The steps that a finished (or restored) alloc holds for its CSI volumes.
    fn held(alloc: &AllocRunner) -> Vec<Done> {
        let mounted = alloc.resources.csi_mounts();
        let mut held = Vec::new();
        for request in csi_requests(alloc) {
            let Ok(usage) = usage_of(&request) else {
                continue;
            };
            held.push(Done::Claimed {
                volume_id: request.source.clone(),
            });
            if mounted.contains_key(&request.name) {
                held.push(Done::Mounted {
                    volume_id: request.source.clone(),
                    usage,
                });
            }
        }
        held
    }
}

impl AllocHook for CsiHook {
    fn name(&self) -> &'static str {
        "csi_hook"
    }

    fn prerun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            let requests = csi_requests(alloc);
            if requests.is_empty() {
                return Ok(());
            }
            if alloc.restored {
                let recorded = alloc.resources.csi_mounts();
                let intact = requests.iter().all(|r| {
                    recorded
                        .get(&r.name)
                        .is_some_and(|m| berth_sys::mount::shared::is_mount_point(&m.host_path))
                });
                if intact {
                    tracing::info!(alloc = %alloc.id, "reusing the alloc's CSI mounts after an agent restart");
                    return Ok(());
                }
                // Asked to stop before the restart and partly given back already: its
                // running tasks keep what they have bound, and the rest of the give-back
                // (from the recorded mounts) finishes it; mounting again would only be
                // undone.
                if alloc.stop_requested() && !recorded.is_empty() {
                    tracing::info!(alloc = %alloc.id,
                        "not mounting the CSI volumes of a stopping alloc again after an agent restart");
                    return Ok(());
                }
            }
            let mut done = Vec::new();
            let mut mounts = BTreeMap::new();
            for request in &requests {
                match Self::mount_one(alloc, request, &mut done).await {
                    Ok(mounted) => {
                        mounts.insert(request.name.clone(), mounted);
                    }
                    Err(why) => {
                        let leftovers = Self::undo(alloc, done).await;
                        let mut message = format!(
                            "volume {:?} (CSI volume {:?}): {why}",
                            request.name, request.source
                        );
                        if !mounts.is_empty() {
                            let undone: Vec<&str> = mounts.keys().map(String::as_str).collect();
                            message.push_str(&format!(
                                "; volume(s) {} mounted before it were given back",
                                undone.join(", ")
                            ));
                        }
                        if !leftovers.is_empty() {
                            message.push_str(&format!(
                                "; giving back failed too: {}",
                                leftovers.join("; ")
                            ));
                        }
                        return Err(HookError {
                            hook: "csi_hook".into(),
                            message,
                        });
                    }
                }
            }
            alloc.resources.set_csi_mounts(mounts);
            alloc.save_resources(berth_state::Commit::Durable);
            Ok(())
        })
    }

    fn postrun<'a>(&'a self, alloc: &'a AllocRunner) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // What fails here is retried by `AllocRunner::give_back_csi`.
            Self::give_back(alloc).await;
        })
    }
}
