//! The node's image store (`berth-image`) as drivers reach it through the runtime
//! (`berth:host/image`): a pull by reference, answered with the image's layers on disk
//! and its config. Opened at `<data_dir>/images` under the agent config's `image` block.

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_image::{
    ImageError, ImageStore, PULL_ATTEMPTS, PullOptions, PullProgress, Reference, docker_config,
};
use berth_runtime::images::{ImagePull, ImagePullError, ImageSource, PulledImage};

use crate::config::ImageSettings;

/// The store, shared by every driver of the agent.
pub struct NodeImages {
    store: Arc<ImageStore>,
    /// The operator's Docker `config.json`, for pulls whose job has no `auth`.
    auth_config: Option<PathBuf>,
    /// What a job's `cap_add` may name (`image { allow_caps }`).
    allow_caps: u64,
}

impl NodeImages {
    /// Opens (making it) the store at `<data_dir>/images`, emptying what a pull killed
    /// earlier left half done.
    pub fn open(data_dir: &Path, settings: &ImageSettings) -> Result<NodeImages, ImageError> {
        let store = ImageStore::open(settings.store_config(data_dir.join("images")))?;
        Ok(NodeImages {
            store: Arc::new(store),
            auth_config: settings.auth_config.clone(),
            allow_caps: settings.allow_caps,
        })
    }

    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    /// Collects the store's garbage now and then from now on (at most every minute, and
    /// more often for a shorter `delay`), keeping every layer a task dir on the node
    /// stands on. Needs a tokio runtime; ends with it.
    pub fn collect_garbage_every(self: &Arc<Self>, data_dir: PathBuf, delay: Duration) {
        let images = self.clone();
        let every = delay.clamp(Duration::from_secs(1), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                let (store, dir) = (images.store.clone(), data_dir.clone());
                // A round whose in-use set cannot be read whole is skipped.
                let collected = tokio::task::spawn_blocking(move || {
                    layers_in_use(&dir).map(|in_use| store.collect_garbage(&in_use, delay))
                })
                .await;
                if let Ok(Some(collected)) = collected
                    && (!collected.images.is_empty() || collected.layers > 0)
                {
                    tracing::info!(
                        images = ?collected.images,
                        layers = collected.layers,
                        "removed images no task used for {delay:?}"
                    );
                }
                tokio::time::sleep(every).await;
            }
        });
    }
}

/// The layers (digests' hex) the task dirs on the node stand on
/// (`allocs/*/tasks/*/image/layers`, written at each start): an alloc's dir keeps its
/// layers until it is collected. `None` when something could not be read (the caller
/// then collects nothing): a layer missed here would be taken from a running task.
pub fn layers_in_use(data_dir: &Path) -> Option<HashSet<String>> {
    use std::io::Read;
    let mut in_use = HashSet::new();
    let dirs = |path: PathBuf| -> Option<Vec<PathBuf>> {
        match std::fs::read_dir(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(Vec::new()),
            Err(_) => None,
            Ok(entries) => entries.map(|e| e.ok().map(|e| e.path())).collect(),
        }
    };
    for alloc in dirs(data_dir.join("allocs"))? {
        for task in dirs(alloc.join("tasks"))? {
            let image = task.join("image");
            if !image.is_dir() {
                continue;
            }
            // Written by the agent in a directory only it reaches; read bounded all the
            // same. An image dir without its list keeps every layer.
            let file =
                std::fs::File::open(image.join(berth_sys::process::isolation::IMAGE_LAYERS_FILE))
                    .ok()?;
            let mut text = String::new();
            file.take(1 << 20).read_to_string(&mut text).ok()?;
            in_use.extend(
                text.lines()
                    .filter_map(|line| Path::new(line).file_name())
                    .map(|name| name.to_string_lossy().into_owned()),
            );
        }
    }
    Some(in_use)
}

impl NodeImages {
    /// `registry`'s credentials in the operator's `image { auth_config }`, if any.
    fn operator_credentials(
        &self,
        registry: &str,
    ) -> Result<Option<berth_image::Credentials>, ImagePullError> {
        use std::io::Read as _;
        let Some(path) = &self.auth_config else {
            return Ok(None);
        };
        let failed = |why: String| {
            ImagePullError(format!(
                "the agent's image {{ auth_config }} file {}: {why}",
                path.display()
            ))
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|file| {
                file.take(docker_config::MAX_CONFIG)
                    .read_to_string(&mut text)
            })
            .map_err(|e| failed(e.to_string()))?;
        docker_config::credentials_for(&text, registry).map_err(|e| failed(e.to_string()))
    }
}

/// The task event a pull starts with, as Nomad's docker driver says it.
fn pull_message(reference: &str, layers: usize, missing: usize, bytes: u64) -> String {
    if missing == 0 {
        format!("Image {reference} is on the node ({layers} layers)")
    } else {
        format!(
            "Downloading image {reference}: {missing} of its {layers} layers ({})",
            size(bytes)
        )
    }
}

/// Bytes as people read them: `1.1 MB`.
fn size(bytes: u64) -> String {
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", bytes as f64 / 1e6),
        _ => format!("{:.1} GB", bytes as f64 / 1e9),
    }
}

impl ImageSource for NodeImages {
    fn allowed_capabilities(&self) -> u64 {
        self.allow_caps
    }

    fn pull(
        &self,
        pull: ImagePull,
    ) -> Pin<Box<dyn Future<Output = Result<PulledImage, ImagePullError>> + Send + '_>> {
        Box::pin(async move {
            let reference =
                Reference::parse(&pull.reference).map_err(|e| ImagePullError(e.to_string()))?;
            let credentials = match pull.credentials {
                Some((username, password)) => Some(berth_image::Credentials { username, password }),
                None => self.operator_credentials(&reference.registry)?,
            };
            let options = PullOptions {
                credentials,
                force: pull.force,
                timeout: pull.timeout,
            };
            let task = pull.task_id.clone();
            let events = pull.progress.clone();
            let shown = reference.to_string();
            let progress = move |step: PullProgress| {
                let message = match step {
                    PullProgress::Resolved {
                        layers,
                        missing,
                        bytes,
                    } => {
                        tracing::info!(task = %task, layers, missing, bytes, "pulling an image");
                        pull_message(&shown, layers, missing, bytes)
                    }
                    PullProgress::LayerDone { index, of, bytes } => {
                        tracing::info!(task = %task, index, of, bytes, "pulled an image layer");
                        format!("Downloaded layer {index} of {of} ({})", size(bytes))
                    }
                    PullProgress::Retrying {
                        attempt,
                        wait,
                        error,
                    } => {
                        tracing::warn!(task = %task, attempt, %error, "retrying an image pull");
                        format!(
                            "Attempt {attempt} of {PULL_ATTEMPTS} failed: {error}; trying again in {}s",
                            wait.as_secs()
                        )
                    }
                };
                if let Some(events) = &events {
                    (events.0)(message);
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
