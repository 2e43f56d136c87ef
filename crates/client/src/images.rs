//! The node's image store (`berth-image`) as drivers reach it through the runtime
//! (`berth:host/image`): a pull by reference, answered with the image's layers on disk
//! and its config. Opened at `<data_dir>/images` under the agent config's `image` block.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use berth_image::{ImageError, ImageStore, PullOptions, PullProgress, Reference};
use berth_runtime::images::{ImagePull, ImagePullError, ImageSource, PulledImage};

use crate::config::ImageSettings;

/// The store, shared by every driver of the agent.
pub struct NodeImages {
    store: Arc<ImageStore>,
}

impl NodeImages {
    /// Opens (making it) the store at `<data_dir>/images`, emptying what a pull killed
    /// earlier left half done.
    pub fn open(data_dir: &Path, settings: &ImageSettings) -> Result<NodeImages, ImageError> {
        let store = ImageStore::open(settings.store_config(data_dir.join("images")))?;
        Ok(NodeImages {
            store: Arc::new(store),
        })
    }

    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }
}

impl ImageSource for NodeImages {
    fn pull(
        &self,
        pull: ImagePull,
    ) -> Pin<Box<dyn Future<Output = Result<PulledImage, ImagePullError>> + Send + '_>> {
        Box::pin(async move {
            let reference =
                Reference::parse(&pull.reference).map_err(|e| ImagePullError(e.to_string()))?;
            let options = PullOptions {
                credentials: pull
                    .credentials
                    .map(|(username, password)| berth_image::Credentials { username, password }),
                force: pull.force,
                timeout: pull.timeout,
            };
            let task = pull.task_id.clone();
            let progress = move |step: PullProgress| match step {
                PullProgress::Resolved {
                    layers,
                    missing,
                    bytes,
                } => tracing::info!(task = %task, layers, missing, bytes, "pulling an image"),
                PullProgress::LayerDone { index, of, bytes } => {
                    tracing::info!(task = %task, index, of, bytes, "pulled an image layer")
                }
            };
            let image = self
                .store
                .pull(&reference, &options, &progress)
                .await
                .map_err(|e| ImagePullError(e.to_string()))?;
            Ok(PulledImage {
                lower: image.lower_dirs(&self.store),
                digest: image.digest,
                entrypoint: image.config.entrypoint,
                cmd: image.config.cmd,
                env: image.config.env,
                working_dir: image.config.working_dir,
                user: image.config.user,
            })
        })
    }
}
