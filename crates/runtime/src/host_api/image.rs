//! `berth:host/image`: a driver that declared `fs-isolation: image` pulls an image
//! through the agent's store and spawns its task on it. The reference and credentials
//! are bounded; a pull is made only while a task starts, and its time is the host's,
//! not the guest's, within a cap that leaves start-task room to finish. A spawn names
//! an image pulled during the same call; everything else about it is checked as
//! `process.spawn` checks it, and the task's root becomes the image's layers under an
//! overlay whose upper directory is in the task's own directory.

use std::path::Path;
use std::time::Duration;

use crate::bindings::host::image::{Host, ImageConfig, PullRequest};
use crate::bindings::host::process::{Isolation as WitIsolation, ProcessRef, SpawnRequest};
use crate::images::{ImagePull, PulledImage};
use crate::sandbox::PluginCtx;
use berth_model::driver::FsIsolation;
use berth_sys::process::Isolation;
use berth_sys::process::isolation::{IMAGE_ETC_FILES, ImageRoot};
use berth_sys::process::user_namespace::UserNamespace;

/// The longest a pull may take: start-task's own wall budget is 5 minutes.
pub const MAX_PULL: Duration = Duration::from_secs(240);
const MAX_REFERENCE: usize = 512;
const MAX_CREDENTIAL: usize = 4096;

#[derive(Debug, thiserror::Error)]
enum ImageRefusal {
    #[error("driver {driver:?} may only pull or spawn images while starting a task")]
    OutsideTaskStart { driver: String },
    #[error(
        "driver {driver:?} uses images but declared fs-isolation {declared:?}: a driver that \
         runs tasks on images declares fs-isolation \"image\""
    )]
    NotDeclared {
        driver: String,
        declared: FsIsolation,
    },
    #[error("this agent has no image store")]
    NoStore,
    #[error(
        "the image reference or its credentials are longer than berth reads ({MAX_REFERENCE} and {MAX_CREDENTIAL} bytes)"
    )]
    TooLong,
    #[error(
        "driver {driver:?} asked to spawn on image {digest:?}, which it did not pull while starting this task"
    )]
    NotPulled { driver: String, digest: String },
    #[error("driver {driver:?} asked to spawn on an image without isolation \"chroot\"")]
    NotIsolated { driver: String },
}

impl PluginCtx {
    fn image_refusal(&self) -> Option<ImageRefusal> {
        let driver = self.plugin.name.to_string();
        if self.task.is_none() {
            Some(ImageRefusal::OutsideTaskStart { driver })
        } else if self.plugin.isolation != FsIsolation::Image {
            Some(ImageRefusal::NotDeclared {
                driver,
                declared: self.plugin.isolation,
            })
        } else {
            None
        }
    }

    fn refuse(&mut self, refusal: ImageRefusal) -> String {
        let refusal = refusal.to_string();
        self.violations.push(refusal.clone());
        refusal
    }
}

impl PluginCtx {
    /// The task's own user namespace, when the host gave it one: its user is the job's
    /// `user` or else the image's, found in the image's own files.
    fn image_user_namespace(&self, image: &PulledImage) -> Result<Option<UserNamespace>, String> {
        let Some(task) = &self.task else {
            return Ok(None);
        };
        if task.user.is_none() && !task.privileged {
            // The host gives every image task a user of its own; without one it would run
            // as the agent's (root).
            return Err(format!(
                "task {} has no user of its own to run its image as",
                task.task_id
            ));
        }
        let (Some(decided), Some(host)) = (&task.image_user_namespace, task.user) else {
            return Ok(None);
        };
        let (spec, whose) = match &decided.user {
            Some(user) => (user.as_str(), "the task's user"),
            None => (image.user.as_str(), "the image's User"),
        };
        let inside = berth_sys::process::image_user::resolve(&image.lower, spec)
            .map_err(|e| format!("{whose} {spec:?}: {e}"))?;
        UserNamespace::for_image_task(host, decided.subordinate, inside)
            .map(Some)
            .map_err(|e| format!("{whose} {spec:?}: {e}"))
    }
}

impl Host for PluginCtx {
    async fn pull(
        &mut self,
        request: PullRequest,
    ) -> wasmtime::Result<Result<ImageConfig, String>> {
        if let Some(refusal) = self.image_refusal() {
            return Ok(Err(self.refuse(refusal)));
        }
        let too_long = request.reference.len() > MAX_REFERENCE
            || request.credentials.as_ref().is_some_and(|c| {
                c.username.len() > MAX_CREDENTIAL || c.password.len() > MAX_CREDENTIAL
            });
        if too_long {
            return Ok(Err(self.refuse(ImageRefusal::TooLong)));
        }
        let Some(images) = self.images.clone() else {
            return Ok(Err(ImageRefusal::NoStore.to_string()));
        };
        let timeout = request
            .timeout_millis
            .map(Duration::from_millis)
            .unwrap_or(MAX_PULL)
            .min(MAX_PULL);
        let pull = ImagePull {
            reference: request.reference,
            credentials: request.credentials.map(|c| (c.username, c.password)),
            force: request.force,
            timeout,
            task_id: self
                .task
                .as_ref()
                .map(|t| t.task_id.clone())
                .unwrap_or_default(),
            progress: self.task.as_ref().and_then(|t| t.progress.clone()),
        };
        let pulled = self.clock.exempt(images.pull(pull)).await;
        Ok(pulled.map_err(|e| e.0).map(|image| {
            let config = ImageConfig {
                digest: image.digest.clone(),
                entrypoint: image.entrypoint.clone(),
                cmd: image.cmd.clone(),
                env: image.env.clone(),
                working_dir: image.working_dir.clone(),
                user: image.user.clone(),
            };
            self.pulled.push(image);
            config
        }))
    }

    async fn spawn(
        &mut self,
        digest: String,
        request: SpawnRequest,
    ) -> wasmtime::Result<Result<ProcessRef, String>> {
        if let Some(refusal) = self.image_refusal() {
            return Ok(Err(self.refuse(refusal)));
        }
        let driver = self.plugin.name.to_string();
        let Some(image) = self.pulled.iter().find(|i| i.digest == digest).cloned() else {
            return Ok(Err(self.refuse(ImageRefusal::NotPulled { driver, digest })));
        };
        if request.isolation != WitIsolation::Chroot {
            return Ok(Err(self.refuse(ImageRefusal::NotIsolated { driver })));
        }
        let mut spec = match self.check_spawn(request) {
            Ok(spec) => spec,
            Err(refusal) => {
                let refusal = refusal.to_string();
                self.violations.push(refusal.clone());
                return Ok(Err(refusal));
            }
        };
        let user_namespace = match self.image_user_namespace(&image) {
            Ok(namespace) => namespace,
            Err(message) => return Ok(Err(message)),
        };
        let owner = user_namespace
            .as_ref()
            .and_then(UserNamespace::root_on_host);
        spec.user_namespace = user_namespace;
        if let Isolation::Chroot(chroot) = &mut spec.isolation {
            let dir = chroot.root.join("image");
            chroot.root = dir.join("root");
            chroot.image = Some(ImageRoot {
                lower: image.lower,
                upper: dir.join("upper"),
                work: dir.join("work"),
                owner,
            });
            // On the host's network an image gets the host's resolver and hosts, as
            // Docker gives them; in a group's network, the group's.
            if chroot.etc_files.is_empty() {
                chroot.etc_files = IMAGE_ETC_FILES
                    .iter()
                    .map(|name| Path::new("/etc").join(name))
                    .collect();
            }
        }
        Ok(self.spawn_checked(spec).map_err(|e| e.to_string()))
    }
}
