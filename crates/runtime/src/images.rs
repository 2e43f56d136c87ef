//! What the runtime needs of the node's image store, as a trait the agent implements
//! (the store is `berth-image`, above this crate): a pull by reference, answered with
//! the image's layers on disk and its config.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

/// A driver's pull, bounded and checked by the host.
#[derive(Debug, Clone)]
pub struct ImagePull {
    pub reference: String,
    /// Username and password for the registry.
    pub credentials: Option<(String, String)>,
    pub force: bool,
    pub timeout: Duration,
    /// The task pulling (`<alloc id>/<task>`), for the agent's log and events.
    pub task_id: String,
    /// The task's events: the pull's progress goes there.
    pub progress: Option<berth_model::driver::TaskProgress>,
}

/// An image in the store, ready to be a task's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledImage {
    /// The manifest's digest.
    pub digest: String,
    /// The layers' directories, the top first.
    pub lower: Vec<PathBuf>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

/// Why a pull failed, in words for the task's events.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ImagePullError(pub String);

/// The node's images, as drivers reach them through `berth:host/image`.
pub trait ImageSource: Send + Sync {
    fn pull(
        &self,
        pull: ImagePull,
    ) -> Pin<Box<dyn Future<Output = Result<PulledImage, ImagePullError>> + Send + '_>>;

    /// The capabilities the operator lets a job add to a task on an image (`image {
    /// allow_caps }`), as `CapabilitySet` bits.
    fn allowed_capabilities(&self) -> u64;
}
