//! OCI images without a daemon: pulled from a registry ([`registry`]), every blob
//! checked against its digest, each layer unpacked once ([`layer`]) into a
//! content-addressed store under the agent's data dir:
//!
//! ```text
//! images/
//!   layers/<sha256 of the layer blob>/   one layer, unpacked, an overlayfs lower dir
//!   manifests/<sha256 of the manifest>.json   what a task needs: config and layers
//!   refs/<sha256 of the reference>.json       a tag's last pull (its manifest digest)
//!   tmp/                                      downloads and unpacks under way
//! ```
//!
//! **A layer is in the store only whole.** It is downloaded into an unnamed file,
//! checked, unpacked into a staging directory in `tmp/`, synced, and only then renamed
//! into `layers/`; the manifest record is written (renamed into place) after all its
//! layers are. An agent killed during a pull leaves only `tmp/`, emptied at the next
//! start, and the next pull takes up where the layers stop. Tasks pulling the same
//! reference at once share one pull, and a layer two images share is unpacked once.

pub mod archive;
pub mod docker_config;
pub mod gc;
pub mod layer;
pub mod reference;
pub mod registry;

use std::collections::HashMap;
use std::io::{self, Read, Seek};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_artifact::networks::Network;
pub use layer::LayerLimits;
pub use reference::Reference;
pub use registry::Credentials;
use registry::{Registry, RegistryError};

/// The operator's settings for images (the agent config's `image` block).
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// `<data_dir>/images`.
    pub root: PathBuf,
    /// Registries spoken to over plain HTTP (this machine's always are).
    pub insecure_registries: Vec<String>,
    /// Where no pull may connect.
    pub denied_networks: Arc<[Network]>,
    /// The largest layer blob downloaded.
    pub max_layer_bytes: u64,
    pub layer_limits: LayerLimits,
}

impl StoreConfig {
    pub fn new(root: PathBuf) -> StoreConfig {
        StoreConfig {
            root,
            insecure_registries: Vec::new(),
            denied_networks: default_denied(),
            max_layer_bytes: 8 << 30,
            layer_limits: LayerLimits {
                max_unpacked: 16 << 30,
                max_entries: 1 << 20,
            },
        }
    }
}

/// Link-local (cloud metadata services) and 0.0.0.0/8; unlike artifacts, loopback is
/// allowed: a registry on the node is a common way to serve images.
pub fn default_denied() -> Arc<[Network]> {
    ["0.0.0.0/8", "169.254.0.0/16", "::/128", "fe80::/10"]
        .iter()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// What Docker takes from an image's config as a container's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageConfig {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `NAME=value`, as the image has them.
    pub env: Vec<String>,
    pub working_dir: String,
    pub user: String,
}

/// An image in the store, ready to be a task's root.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Image {
    /// The reference it was pulled by, as written in full.
    pub reference: String,
    /// The manifest's digest (`sha256:…`): the image's identity.
    pub digest: String,
    pub config: ImageConfig,
    /// The layers' blob digests, the base first.
    pub layers: Vec<String>,
    /// Pulled with credentials the registry asked for: another task uses it from the
    /// store only once the registry took its own credentials.
    #[serde(default)]
    pub private: bool,
}

impl Image {
    /// Each layer's directory, the top first (overlayfs's `lowerdir` order).
    pub fn lower_dirs(&self, store: &ImageStore) -> Vec<PathBuf> {
        self.layers
            .iter()
            .rev()
            .map(|digest| store.layer_dir(digest))
            .collect()
    }
}

/// How a pull goes.
#[derive(Debug, Clone)]
pub struct PullOptions {
    pub credentials: Option<Credentials>,
    /// Ask the registry again even when the reference was pulled before.
    pub force: bool,
    pub timeout: Duration,
}

/// What a pull reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullProgress {
    /// The manifest is read: this many layers, this many bytes still to download.
    Resolved {
        layers: usize,
        missing: usize,
        bytes: u64,
    },
    /// One layer is in the store (`index` counts from 1).
    LayerDone { index: usize, of: usize, bytes: u64 },
    /// Attempt `attempt` of [`PULL_ATTEMPTS`] failed on something that may pass (the
    /// registry unreachable, or answering 429 or 5xx): the next starts after `wait`.
    Retrying {
        attempt: u32,
        wait: Duration,
        error: String,
    },
}

/// How many times a pull is tried when the registry fails in a way that may pass.
pub const PULL_ATTEMPTS: u32 = 3;

/// The wait before the second attempt; it doubles for each after.
pub const FIRST_RETRY_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Reference(#[from] reference::ReferenceError),
    #[error("pulling {reference}: {error}")]
    Registry {
        reference: String,
        #[source]
        error: RegistryError,
    },
    #[error("pulling {reference}: {reason}")]
    Manifest { reference: String, reason: String },
    #[error("pulling {reference}: layer {digest}: {error}")]
    Layer {
        reference: String,
        digest: String,
        #[source]
        error: layer::LayerError,
    },
    #[error("loading {path}: {error}")]
    Archive {
        path: String,
        #[source]
        error: archive::ArchiveError,
    },
    #[error("pulling {reference}: no answer within {after:?} (the task's image_pull_timeout)")]
    TimedOut { reference: String, after: Duration },
    #[error("{error} (gave up after {attempts} attempts)")]
    GaveUp {
        attempts: u32,
        #[source]
        error: Box<ImageError>,
    },
    #[error("no image {reference} in the store")]
    NotInStore { reference: String },
    #[error(
        "image {reference} is used by a task on this node (its alloc dir stands on the \
         image's layers): stop and collect that alloc first"
    )]
    InUse { reference: String },
    #[error("the image store at {path}: {error}")]
    Store {
        path: String,
        #[source]
        error: io::Error,
    },
}

impl ImageError {
    /// A failure another attempt may not meet: the registry unreachable or cut off, or
    /// answering "too many requests" or a server error. Never a refusal, a digest that
    /// does not match or a limit.
    pub fn may_pass(&self) -> bool {
        match self {
            ImageError::Registry { error, .. } => match error {
                registry::RegistryError::Failed { .. } => true,
                registry::RegistryError::Status { status, .. } => {
                    *status == 429 || (500..=599).contains(status)
                }
                _ => false,
            },
            _ => false,
        }
    }
}

/// The node's images.
pub struct ImageStore {
    config: StoreConfig,
    /// One lock per reference being pulled: tasks waiting for the same image share a pull.
    pulls: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// This store's staging directory in `tmp/`, and the lock that says it is open.
    tmp: PathBuf,
    _tmp_lock: std::fs::File,
    /// Held shared by every pull and load, exclusively by a garbage collection: nothing
    /// is collected while a pull is deciding what it has or writing what it got. Across
    /// processes (an agent, a `berth image` command), the same with `flock` on
    /// [`STORE_LOCK`] ([`ImageStore::lock_store`]).
    collecting: tokio::sync::RwLock<()>,
}

/// The file in the store's root every open store locks: shared by a pull or a load,
/// exclusively by a collection or a removal.
pub const STORE_LOCK: &str = ".lock";

/// Locks the store at `root` against other processes' (an agent's, a `berth image`
/// command's) collections and removals, or (`exclusive`) against their pulls and loads
/// too; released when the file is dropped. Blocks until it has the lock.
fn lock_store(root: &Path, exclusive: bool) -> Result<std::fs::File, ImageError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = root.join(STORE_LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .map_err(store_error(&path))?;
    let how = match exclusive {
        true => rustix::fs::FlockOperation::LockExclusive,
        false => rustix::fs::FlockOperation::LockShared,
    };
    rustix::fs::flock(&file, how).map_err(|e| store_error(&path)(e.into()))?;
    Ok(file)
}

fn store_error(path: &Path) -> impl FnOnce(io::Error) -> ImageError + '_ {
    move |error| ImageError::Store {
        path: path.display().to_string(),
        error,
    }
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

impl ImageStore {
    /// Opens (making it, 0700) the store. Each open store (an agent, a `berth image`
    /// command) stages its work in a directory of its own in `tmp/`, locked while it is
    /// open; what a store no longer open left there is removed, and nothing another
    /// one is writing.
    pub fn open(config: StoreConfig) -> Result<ImageStore, ImageError> {
        use std::os::unix::fs::DirBuilderExt;
        for dir in ["", "layers", "manifests", "refs", "tmp", "private"] {
            let path = config.root.join(dir);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(store_error(&path))?;
        }
        let tmp = config.root.join("tmp");
        let dir = std::fs::File::open(&tmp).map_err(store_error(&tmp))?;
        for entry in std::fs::read_dir(&tmp).map_err(store_error(&tmp))? {
            let name = entry.map_err(store_error(&tmp))?.file_name();
            let Some(name) = name.to_str() else { continue };
            // A store still open holds its directory's lock.
            let live = std::fs::File::open(tmp.join(name)).is_ok_and(|held| {
                rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                    .is_err()
            });
            if !live {
                let _ = berth_artifact::tree::remove_tree(dir.as_fd(), name).or_else(|_| {
                    rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::empty())
                        .map_err(io::Error::from)
                });
            }
        }
        let own = tmp.join(berth_artifact::tree::hidden_name("open"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&own)
            .map_err(store_error(&own))?;
        let held = std::fs::File::open(&own).map_err(store_error(&own))?;
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| store_error(&own)(e.into()))?;
        Ok(ImageStore {
            config,
            pulls: Mutex::new(HashMap::new()),
            tmp: own,
            _tmp_lock: held,
            collecting: tokio::sync::RwLock::new(()),
        })
    }

    /// This open store's own staging directory.
    fn tmp(&self) -> &Path {
        &self.tmp
    }

    pub fn root(&self) -> &Path {
        &self.config.root
    }

    pub fn layer_dir(&self, digest: &str) -> PathBuf {
        self.config.root.join("layers").join(hex_of(digest))
    }

    /// Marks a layer a private pull brought: another pull that names it downloads it
    /// (its digest checked) before using the store's copy, so no job gets a private
    /// layer by naming its digest in a manifest of its own.
    fn private_marker(&self, digest: &str) -> PathBuf {
        self.config.root.join("private").join(hex_of(digest))
    }

    fn manifest_record(&self, digest: &str) -> PathBuf {
        self.config
            .root
            .join("manifests")
            .join(format!("{}.json", hex_of(digest)))
    }

    fn ref_record(&self, reference: &Reference) -> PathBuf {
        let key = registry::digest_of(reference.to_string().as_bytes());
        self.config
            .root
            .join("refs")
            .join(format!("{}.json", hex_of(&key)))
    }

    /// The image `reference` last pulled, if all of it is still in the store.
    pub fn local(&self, reference: &Reference) -> Option<Image> {
        let digest = match &reference.digest {
            Some(digest) => digest.clone(),
            None => std::fs::read_to_string(self.ref_record(reference)).ok()?,
        };
        let record = std::fs::read(self.manifest_record(&digest)).ok()?;
        let image: Image = serde_json::from_slice(&record).ok()?;
        image
            .layers
            .iter()
            .all(|layer| self.layer_dir(layer).is_dir())
            .then_some(image)
    }

    /// Every image in the store.
    pub fn list(&self) -> Vec<Image> {
        let dir = self.config.root.join("manifests");
        let mut images: Vec<Image> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| serde_json::from_slice(&std::fs::read(entry.path()).ok()?).ok())
            .collect();
        images.sort_by(|a: &Image, b| a.reference.cmp(&b.reference));
        images
    }

    /// The image `reference` names, from the store or else pulled, all within
    /// `options.timeout` (waiting for another task's pull of it included).
    pub async fn pull(
        &self,
        reference: &Reference,
        options: &PullOptions,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<Image, ImageError> {
        let key = reference.to_string();
        let lock = {
            let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
            pulls.entry(key.clone()).or_default().clone()
        };
        let pulling = async {
            let _pulling = lock.lock().await;
            // No collection while this pull decides what it has and writes what it got.
            let _not_collected = self.collecting.read().await;
            let root = self.config.root.clone();
            let _nor_elsewhere = tokio::task::spawn_blocking(move || lock_store(&root, false))
                .await
                .map_err(|e| store_error(&self.config.root)(io::Error::other(e.to_string())))??;
            // A digest names one image forever: it is never pulled again.
            let cached = (!options.force || reference.digest.is_some())
                .then(|| self.local(reference))
                .flatten();
            match cached {
                Some(image) => {
                    if image.private {
                        // Asked of the registry it came from, whatever this job named.
                        let own = Reference::parse(&image.reference)?;
                        self.may_use_private(&own, options.credentials.clone())
                            .await?;
                    }
                    self.mark_used(&image);
                    Ok(image)
                }
                None => self.pull_with_retries(reference, options, progress).await,
            }
        };
        let result = match tokio::time::timeout(options.timeout, pulling).await {
            Ok(result) => result,
            Err(_) => Err(ImageError::TimedOut {
                reference: key.clone(),
                after: options.timeout,
            }),
        };
        let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&lock) <= 2 {
            pulls.remove(&key);
        }
        result
    }

    /// [`ImageStore::pull_from_registry`], again after a wait that doubles when the
    /// registry failed in a way that may pass, up to [`PULL_ATTEMPTS`] in all. A retry
    /// downloads only the layers the store still lacks.
    async fn pull_with_retries(
        &self,
        reference: &Reference,
        options: &PullOptions,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<Image, ImageError> {
        let mut wait = FIRST_RETRY_WAIT;
        let mut attempt = 1;
        loop {
            match self.pull_from_registry(reference, options, progress).await {
                Err(error) if attempt < PULL_ATTEMPTS && error.may_pass() => {
                    progress(PullProgress::Retrying {
                        attempt,
                        wait,
                        error: error.to_string(),
                    });
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(error) if attempt > 1 => {
                    return Err(ImageError::GaveUp {
                        attempts: attempt,
                        error: Box::new(error),
                    });
                }
                other => return other,
            }
        }
    }

    /// Whether the registry gives `reference` to this pull's credentials: asked of the
    /// registry (the manifest, read again) before a private image is used from the store.
    async fn may_use_private(
        &self,
        reference: &Reference,
        credentials: Option<Credentials>,
    ) -> Result<(), ImageError> {
        let registry_error = |error| ImageError::Registry {
            reference: reference.to_string(),
            error,
        };
        let mut registry = Registry::new(
            reference,
            credentials,
            &self.config.insecure_registries,
            self.config.denied_networks.clone(),
        )
        .map_err(registry_error)?;
        registry
            .manifest(reference.manifest_ref())
            .await
            .map_err(registry_error)?;
        Ok(())
    }

    /// Layer blob `digest` of `reference`, into an unnamed file in this store's staging
    /// dir, checked against its digest and bounded by the operator's layer size; and
    /// its size.
    async fn download(
        &self,
        registry: &mut Registry,
        reference: &str,
        digest: &str,
        tmp: &Path,
    ) -> Result<(std::fs::File, u64), ImageError> {
        let tmp_dir = std::fs::File::open(tmp).map_err(store_error(tmp))?;
        let mut blob =
            berth_artifact::tree::unnamed_file(tmp_dir.as_fd()).map_err(store_error(tmp))?;
        let bytes = registry
            .blob(digest, &mut blob, self.config.max_layer_bytes, &mut |_| {})
            .await
            .map_err(|error| ImageError::Registry {
                reference: reference.to_string(),
                error,
            })?;
        Ok((blob, bytes))
    }

    async fn pull_from_registry(
        &self,
        reference: &Reference,
        options: &PullOptions,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<Image, ImageError> {
        let shown = reference.to_string();
        let registry_error = |error| ImageError::Registry {
            reference: shown.clone(),
            error,
        };
        let manifest_error = |reason: String| ImageError::Manifest {
            reference: shown.clone(),
            reason,
        };
        let insecure = &self.config.insecure_registries;
        let mut registry = Registry::new(
            reference,
            options.credentials.clone(),
            insecure,
            self.config.denied_networks.clone(),
        )
        .map_err(registry_error)?;
        let (body, media_type, mut digest) = registry
            .manifest(reference.manifest_ref())
            .await
            .map_err(registry_error)?;
        let mut manifest: Manifest = serde_json::from_slice(&body)
            .map_err(|e| manifest_error(format!("the manifest is not an image manifest: {e}")))?;
        if manifest.is_index(&media_type) {
            let chosen = manifest.for_this_platform().ok_or_else(|| {
                manifest_error(format!(
                    "the image has no manifest for this node's platform (linux/{}); it has {}",
                    platform_arch(),
                    manifest.platforms()
                ))
            })?;
            // Only by digest: a tag here would let the image under a pinned index change.
            if !reference::is_digest(&chosen) {
                return Err(manifest_error(format!(
                    "the index names its manifest {chosen:?}, which is not a sha256 digest"
                )));
            }
            let (body, _, chosen_digest) =
                registry.manifest(&chosen).await.map_err(registry_error)?;
            manifest = serde_json::from_slice(&body)
                .map_err(|e| manifest_error(format!("the platform's manifest: {e}")))?;
            if manifest.is_index("") {
                return Err(manifest_error("an index names another index".into()));
            }
            digest = chosen_digest;
        }
        let config_ref = manifest
            .config
            .as_ref()
            .ok_or_else(|| manifest_error("the manifest names no config".into()))?;
        let layers = manifest.layers.clone().unwrap_or_default();
        if layers.is_empty() || layers.len() > 127 {
            return Err(manifest_error(format!(
                "the manifest has {} layers; berth stacks 1 to 127",
                layers.len()
            )));
        }
        for descriptor in std::iter::once(config_ref).chain(&layers) {
            if !reference::is_digest(&descriptor.digest) {
                return Err(manifest_error(format!(
                    "{:?} is not a sha256 digest",
                    descriptor.digest
                )));
            }
        }
        let tmp = self.tmp().to_path_buf();
        let tmp_dir = std::fs::File::open(&tmp).map_err(store_error(&tmp))?;
        // The config: small, read into memory.
        let mut config_file =
            berth_artifact::tree::unnamed_file(tmp_dir.as_fd()).map_err(store_error(&tmp))?;
        registry
            .blob(
                &config_ref.digest,
                &mut config_file,
                registry::MAX_MANIFEST,
                &mut |_| {},
            )
            .await
            .map_err(registry_error)?;
        let mut config_bytes = Vec::new();
        config_file.rewind().map_err(store_error(&tmp))?;
        config_file
            .read_to_end(&mut config_bytes)
            .map_err(store_error(&tmp))?;
        let config = read_config(&config_bytes).map_err(|e| manifest_error(e.0))?;
        let missing: Vec<usize> = (0..layers.len())
            .filter(|i| !self.layer_dir(&layers[*i].digest).is_dir())
            .collect();
        // Layers in the store that a private pull brought: this registry shows it has
        // their bytes (a download checked against the digest) before they are used.
        for layer in &layers {
            if !self.layer_dir(&layer.digest).is_dir()
                || !self.private_marker(&layer.digest).exists()
            {
                continue;
            }
            self.download(&mut registry, &shown, &layer.digest, &tmp)
                .await?;
        }
        progress(PullProgress::Resolved {
            layers: layers.len(),
            missing: missing.len(),
            bytes: missing
                .iter()
                .map(|i| layers[*i].size.unwrap_or(0))
                .fold(0, u64::saturating_add),
        });
        for &index in &missing {
            let layer = &layers[index];
            let (blob, bytes) = self
                .download(&mut registry, &shown, &layer.digest, &tmp)
                .await?;
            let (target, limits) = (self.layer_dir(&layer.digest), self.config.layer_limits);
            let (tmp_path, digest_shown) = (tmp.clone(), layer.digest.clone());
            tokio::task::spawn_blocking(move || store_layer(blob, &tmp_path, &target, limits))
                .await
                .map_err(|e| store_error(&tmp)(io::Error::other(e.to_string())))?
                .map_err(|error| match error {
                    StoreLayerError::Layer(error) => ImageError::Layer {
                        reference: shown.clone(),
                        digest: digest_shown,
                        error,
                    },
                    StoreLayerError::Io(error) => store_error(&tmp)(error),
                })?;
            progress(PullProgress::LayerDone {
                index: index + 1,
                of: layers.len(),
                bytes,
            });
        }
        let image = Image {
            reference: shown.clone(),
            digest: digest.clone(),
            config,
            layers: layers.iter().map(|l| l.digest.clone()).collect(),
            // Private only when the registry would not give it to anyone: an anonymous
            // read of it (Docker Hub challenges even those) is refused.
            private: registry.sent_credentials()
                && self.may_use_private(reference, None).await.is_err(),
        };
        // Used now, every layer, the ones it had and the ones it stored: no collection
        // takes one before the record that names it is written.
        for layer in &image.layers {
            gc::touch(&self.layer_dir(layer));
        }
        if image.private {
            for &index in &missing {
                let marker = self.private_marker(&layers[index].digest);
                std::fs::write(&marker, b"").map_err(store_error(&marker))?;
            }
        } else {
            // Anyone may read these now: this pull had them, anonymously.
            for layer in &image.layers {
                let _ = std::fs::remove_file(self.private_marker(layer));
            }
        }
        self.record(&image, std::slice::from_ref(reference))?;
        // Pinned by an index's digest: recorded under it too, so the next start finds it
        // without asking the registry.
        if let Some(pinned) = reference.digest.as_ref().filter(|p| **p != digest) {
            let record =
                serde_json::to_vec(&image).map_err(|e| store_error(&tmp)(io::Error::other(e)))?;
            write_atomically(&tmp, &self.manifest_record(pinned), &record)?;
        }
        Ok(image)
    }
}

impl ImageStore {
    /// Marks `image` and its layers used now, so garbage collection leaves them.
    fn mark_used(&self, image: &Image) {
        gc::touch(&self.manifest_record(&image.digest));
        for layer in &image.layers {
            gc::touch(&self.layer_dir(layer));
        }
    }

    /// Writes `image`'s record, then each of `tags`' (a tag names its last image).
    fn record(&self, image: &Image, tags: &[Reference]) -> Result<(), ImageError> {
        let tmp = self.tmp().to_path_buf();
        let record =
            serde_json::to_vec(image).map_err(|e| store_error(&tmp)(io::Error::other(e)))?;
        write_atomically(&tmp, &self.manifest_record(&image.digest), &record)?;
        for tag in tags.iter().filter(|t| t.digest.is_none()) {
            write_atomically(&tmp, &self.ref_record(tag), image.digest.as_bytes())?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
enum StoreLayerError {
    #[error(transparent)]
    Layer(layer::LayerError),
    #[error(transparent)]
    Io(io::Error),
}

/// An image config berth cannot use.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ConfigError(String);

/// Unpacks `blob` into a staging directory in `tmp`, syncs it, and renames it to
/// `target`; on any failure the staging directory is removed.
fn store_layer(
    blob: std::fs::File,
    tmp: &Path,
    target: &Path,
    limits: LayerLimits,
) -> Result<(), StoreLayerError> {
    let tmp_dir = std::fs::File::open(tmp).map_err(StoreLayerError::Io)?;
    let staging = berth_artifact::tree::hidden_name("layer");
    rustix::fs::mkdirat(
        &tmp_dir,
        staging.as_str(),
        rustix::fs::Mode::from_raw_mode(0o755),
    )
    .map_err(|e| StoreLayerError::Io(e.into()))?;
    let result = (|| {
        let dir = rustix::fs::openat(
            &tmp_dir,
            staging.as_str(),
            rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::CLOEXEC
                | rustix::fs::OFlags::NOFOLLOW,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| StoreLayerError::Io(e.into()))?;
        layer::unpack(&blob, dir.as_fd(), limits).map_err(StoreLayerError::Layer)?;
        rustix::fs::syncfs(&dir).map_err(|e| StoreLayerError::Io(e.into()))?;
        match std::fs::rename(tmp.join(&staging), target) {
            Ok(()) => Ok(()),
            // Another agent's pull put it there first: the same bytes.
            Err(_) if target.is_dir() => Err(StoreLayerError::Io(io::Error::from(
                io::ErrorKind::AlreadyExists,
            ))),
            Err(error) => Err(StoreLayerError::Io(error)),
        }
    })();
    let result = match result {
        Err(StoreLayerError::Io(e)) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    };
    if tmp.join(&staging).exists() {
        let _ = berth_artifact::tree::remove_tree(tmp_dir.as_fd(), &staging);
    }
    result
}

fn write_atomically(tmp: &Path, target: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    let staging = tmp.join(berth_artifact::tree::hidden_name("record"));
    let write = || -> io::Result<()> {
        let mut file = std::fs::File::create(&staging)?;
        io::Write::write_all(&mut file, bytes)?;
        file.sync_all()?;
        std::fs::rename(&staging, target)
    };
    write().map_err(|error| {
        let _ = std::fs::remove_file(&staging);
        store_error(target)(error)
    })
}

/// An OCI or Docker manifest, or an index (a manifest list): the fields berth reads.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    media_type: Option<String>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
    manifests: Option<Vec<Descriptor>>,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    digest: String,
    size: Option<u64>,
    platform: Option<Platform>,
    /// An OCI layout's names for its images (`org.opencontainers.image.ref.name`).
    annotations: Option<HashMap<String, String>>,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct Platform {
    os: String,
    architecture: String,
}

/// This node's architecture as OCI names it.
pub fn platform_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        other => other,
    }
}

impl Manifest {
    fn is_index(&self, content_type: &str) -> bool {
        let index = |t: &str| t.contains("image.index") || t.contains("manifest.list");
        self.manifests.is_some()
            || self.media_type.as_deref().is_some_and(index)
            || index(content_type)
    }

    fn for_this_platform(&self) -> Option<String> {
        self.manifests
            .iter()
            .flatten()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == platform_arch())
            })
            .map(|m| m.digest.clone())
    }

    fn platforms(&self) -> String {
        let all: Vec<String> = self
            .manifests
            .iter()
            .flatten()
            .filter_map(|m| m.platform.as_ref())
            .map(|p| format!("{}/{}", p.os, p.architecture))
            .collect();
        if all.is_empty() {
            "none".into()
        } else {
            all.join(", ")
        }
    }
}

fn read_config(bytes: &[u8]) -> Result<ImageConfig, ConfigError> {
    #[derive(serde::Deserialize)]
    struct File {
        config: Option<Inner>,
        os: Option<String>,
    }
    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "PascalCase")]
    struct Inner {
        entrypoint: Option<Vec<String>>,
        cmd: Option<Vec<String>>,
        env: Option<Vec<String>>,
        working_dir: Option<String>,
        user: Option<String>,
    }
    let file: File = serde_json::from_slice(bytes)
        .map_err(|e| ConfigError(format!("the image config is not JSON: {e}")))?;
    if let Some(os) = file.os.as_deref()
        && os != "linux"
    {
        return Err(ConfigError(format!("the image is for {os:?}, not linux")));
    }
    let inner = file.config.unwrap_or_default();
    Ok(ImageConfig {
        entrypoint: inner.entrypoint.unwrap_or_default(),
        cmd: inner.cmd.unwrap_or_default(),
        env: inner.env.unwrap_or_default(),
        working_dir: inner.working_dir.unwrap_or_default(),
        user: inner.user.unwrap_or_default(),
    })
}
