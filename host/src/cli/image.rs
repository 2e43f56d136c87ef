//! `berth image list|pull|rm|load`: the node's image store (`<data_dir>/images`), read and
//! filled on this machine as the agent's docker tasks fill it, under the agent config's
//! `image` block. `load` is for nodes without a registry: a `docker save` archive or an
//! OCI image layout archive.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;

use super::output::print_line;
use berth_client::config::AgentConfig;
use berth_client::images::NodeImages;
use berth_image::{PullOptions, PullProgress, Reference};

#[derive(Subcommand)]
pub(super) enum ImageCommand {
    /// The images in this node's store.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Pull an image into this node's store, as a docker task's start does.
    Pull {
        /// `[registry/]repository[:tag][@sha256:…]`, as Docker reads it.
        reference: String,
        /// Ask the registry again even when the store has the reference.
        #[arg(long)]
        force: bool,
        /// The registry user; the password is read from BERTH_REGISTRY_PASSWORD.
        #[arg(long)]
        username: Option<String>,
    },
    /// Remove an image, its tags and the layers only it has. Refused while a task on
    /// this node stands on it.
    Rm {
        /// `[registry/]repository[:tag][@sha256:…]`, as `image list` shows it.
        reference: String,
    },
    /// Load the images of a `docker save` archive or an OCI layout archive.
    Load {
        /// The archive (a tar).
        archive: PathBuf,
        /// The reference to load it as, when the archive tags no image (or to retag it).
        reference: Option<String>,
    },
}

pub(super) async fn run(
    command: ImageCommand,
    data_dir: &Path,
    config: &AgentConfig,
) -> anyhow::Result<ExitCode> {
    let images = NodeImages::open(data_dir, &config.image)?;
    let store = images.store().clone();
    match command {
        ImageCommand::List { json } => {
            let list = store.list();
            if json {
                print_line!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<[String; 3]> = list
                .iter()
                .map(|image| {
                    [
                        image.reference.clone(),
                        image.digest.clone(),
                        image.layers.len().to_string(),
                    ]
                })
                .collect();
            super::driver::print_table(&["Reference", "Digest", "Layers"], &rows);
        }
        ImageCommand::Pull {
            reference,
            force,
            username,
        } => {
            let reference = Reference::parse(&reference)?;
            let credentials = username.map(|username| berth_image::Credentials {
                username,
                password: std::env::var("BERTH_REGISTRY_PASSWORD").unwrap_or_default(),
            });
            let options = PullOptions {
                credentials,
                force,
                timeout: Duration::from_secs(3600),
            };
            let progress = |step: PullProgress| match step {
                PullProgress::Resolved {
                    layers,
                    missing,
                    bytes,
                } => print_line!(
                    "{}: {} layers, {} to download ({} KiB)",
                    reference,
                    layers,
                    missing,
                    bytes >> 10
                ),
                PullProgress::LayerDone { index, of, bytes } => {
                    print_line!("  layer {}/{}: {} KiB", index, of, bytes >> 10)
                }
                PullProgress::Retrying {
                    attempt,
                    wait,
                    error,
                } => print_line!(
                    "  attempt {} failed: {}; trying again in {}s",
                    attempt,
                    error,
                    wait.as_secs()
                ),
            };
            let image = store.pull(&reference, &options, &progress).await?;
            print_line!("{} {}", image.reference, image.digest);
        }
        ImageCommand::Rm { reference } => {
            let reference = Reference::parse(&reference)?;
            let reference_shown = reference.to_string();
            let data_dir = data_dir.to_path_buf();
            let removed = tokio::task::spawn_blocking(move || {
                // A task dir's layers whose list cannot be read keep the image.
                let in_use = berth_client::images::layers_in_use(&data_dir).ok_or_else(|| {
                    anyhow::anyhow!(
                        "the task dirs under {} could not all be read: nothing removed",
                        data_dir.display()
                    )
                })?;
                anyhow::Ok(store.remove(&reference, &in_use)?)
            })
            .await??;
            if removed.images.is_empty() {
                print_line!("untagged {} (the image has other tags)", reference_shown);
            } else {
                print_line!(
                    "removed {} ({} layers only it had)",
                    removed.images.join(", "),
                    removed.layers
                );
            }
        }
        ImageCommand::Load { archive, reference } => {
            let reference = reference.as_deref().map(Reference::parse).transpose()?;
            let loaded =
                tokio::task::spawn_blocking(move || store.load(&archive, reference.as_ref()))
                    .await??;
            for image in loaded {
                print_line!(
                    "loaded {} {} ({} layers)",
                    image.reference,
                    image.digest,
                    image.layers.len()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
