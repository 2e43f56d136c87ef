//! `berth image load`: images from an archive, for nodes without a registry. Two shapes:
//! an OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`, as `skopeo copy …
//! oci-archive:` and Docker 25+ write), and `docker save`'s own (`manifest.json` naming
//! each image's config, tags and layer tars). Each blob is checked against its digest
//! where the archive names one; a layer is unpacked as a pulled one is, keyed by its
//! digest, so an image loaded and one pulled share the layers they have in common.
//!
//! The archive is read once, entry by entry: only the names those two shapes use are
//! kept (as unnamed files), each at most the operator's layer size, and at most
//! [`MAX_ENTRIES`] of them; nothing is written under a name the archive chose.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::fd::AsFd;
use std::path::Path;

use sha2::Digest;

use crate::{Image, ImageError, ImageStore, Manifest, Reference, reference, registry};

/// The most files an archive may hold.
pub const MAX_ENTRIES: usize = 4096;
/// The most images an archive's index may list.
const MAX_IMAGES: usize = 64;

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("reading the archive: {0}")]
    Read(#[source] io::Error),
    #[error("the archive is neither an OCI image layout nor a `docker save` archive")]
    Unknown,
    #[error("the archive holds more than {MAX_ENTRIES} files")]
    TooManyEntries,
    #[error("{name} in the archive is larger than the operator's max_layer_size ({limit} bytes)")]
    TooLarge { name: String, limit: u64 },
    #[error("the archive names {name}, which it does not hold")]
    Missing { name: String },
    #[error("{name} in the archive does not match its digest (it is {actual})")]
    DigestMismatch { name: String, actual: String },
    #[error("{0}")]
    Format(String),
    #[error(
        "the archive tags no image; give the reference to load it as (berth image load FILE REFERENCE)"
    )]
    Untagged,
    #[error(
        "the archive holds {0} images and one reference names one: load it without a reference, each image with its own tags"
    )]
    OneReferenceForMany(usize),
}

/// The files of an archive berth reads, by their name in it.
struct Entries {
    files: HashMap<String, File>,
    /// Names that are links to another entry (`docker save` before Docker 25 links a
    /// layer tar whose content another has: `b/layer.tar -> ../a/layer.tar`), with the
    /// archive name each leads to. Only followed to a file the archive holds.
    links: HashMap<String, String>,
    /// Each file's digest, taken once.
    digests: HashMap<String, String>,
}

/// The most links followed to reach a file.
const MAX_LINK_HOPS: usize = 8;

/// `target` of a link at `name`, as an archive name: a symlink's is relative to the
/// link's directory, a hard link's is the archive's own. `None` when it leads out of
/// the archive.
fn link_target(name: &str, target: &str, symbolic: bool) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    if symbolic {
        if target.starts_with('/') {
            return None;
        }
        parts.extend(name.split('/'));
        parts.pop();
    }
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

impl Entries {
    fn read(archive: &Path, tmp: &Path, limit: u64) -> Result<Entries, ArchiveError> {
        let tmp_dir = File::open(tmp).map_err(ArchiveError::Read)?;
        let file = File::open(archive).map_err(ArchiveError::Read)?;
        let mut tar = tar::Archive::new(file);
        let mut files = HashMap::new();
        let mut links = HashMap::new();
        let mut seen = 0usize;
        for entry in tar.entries().map_err(ArchiveError::Read)? {
            let mut entry = entry.map_err(ArchiveError::Read)?;
            seen += 1;
            if seen > MAX_ENTRIES {
                return Err(ArchiveError::TooManyEntries);
            }
            let kind = entry.header().entry_type();
            if !kind.is_file() && !kind.is_symlink() && !kind.is_hard_link() {
                continue;
            }
            let name = entry
                .path()
                .map_err(ArchiveError::Read)?
                .to_string_lossy()
                .trim_start_matches("./")
                .to_string();
            let wanted = matches!(name.as_str(), "index.json" | "manifest.json" | "oci-layout")
                || name.starts_with("blobs/sha256/")
                || name.ends_with("/layer.tar")
                || (name.ends_with(".json") && !name.contains('/'));
            if !wanted {
                continue;
            }
            if !kind.is_file() {
                let target = entry
                    .link_name()
                    .map_err(ArchiveError::Read)?
                    .map(|t| t.to_string_lossy().into_owned());
                if let Some(to) = target.and_then(|t| link_target(&name, &t, kind.is_symlink())) {
                    links.insert(name, to);
                }
                continue;
            }
            if entry.size() > limit {
                return Err(ArchiveError::TooLarge { name, limit });
            }
            let mut kept =
                berth_artifact::tree::unnamed_file(tmp_dir.as_fd()).map_err(ArchiveError::Read)?;
            io::copy(&mut (&mut entry).take(limit), &mut kept).map_err(ArchiveError::Read)?;
            files.insert(name, kept);
        }
        Ok(Entries {
            files,
            links,
            digests: HashMap::new(),
        })
    }

    /// The name of the file `name` is, through its links.
    fn resolve(&self, name: &str) -> String {
        let mut name = name.to_string();
        for _ in 0..MAX_LINK_HOPS {
            match self.links.get(&name) {
                Some(to) if !self.files.contains_key(&name) => name = to.clone(),
                _ => break,
            }
        }
        name
    }

    fn file(&mut self, name: &str) -> Result<&mut File, ArchiveError> {
        let resolved = self.resolve(name);
        let file = self
            .files
            .get_mut(&resolved)
            .ok_or_else(|| ArchiveError::Missing {
                name: name.to_string(),
            })?;
        file.rewind().map_err(ArchiveError::Read)?;
        Ok(file)
    }

    /// A small JSON file (at most a manifest's size).
    fn json<T: serde::de::DeserializeOwned>(&mut self, name: &str) -> Result<T, ArchiveError> {
        let bytes = self.bytes(name)?;
        serde_json::from_slice(&bytes).map_err(|e| ArchiveError::Format(format!("{name}: {e}")))
    }

    fn bytes(&mut self, name: &str) -> Result<Vec<u8>, ArchiveError> {
        let mut bytes = Vec::new();
        self.file(name)?
            .take(registry::MAX_MANIFEST)
            .read_to_end(&mut bytes)
            .map_err(ArchiveError::Read)?;
        Ok(bytes)
    }

    /// The sha256 of a file, as `sha256:<hex>`.
    fn digest(&mut self, name: &str) -> Result<String, ArchiveError> {
        let resolved = self.resolve(name);
        if let Some(digest) = self.digests.get(&resolved) {
            return Ok(digest.clone());
        }
        let file = self.file(name)?;
        let mut hasher = sha2::Sha256::new();
        io::copy(file, &mut hasher).map_err(ArchiveError::Read)?;
        let digest = format!("sha256:{}", registry::hex(&hasher.finalize()));
        self.digests.insert(resolved, digest.clone());
        Ok(digest)
    }

    /// The blob `digest` of an OCI layout, checked against it.
    fn blob(&mut self, digest: &str) -> Result<String, ArchiveError> {
        if !reference::is_digest(digest) {
            return Err(ArchiveError::Format(format!(
                "{digest:?} is not a sha256 digest"
            )));
        }
        let name = format!("blobs/sha256/{}", &digest["sha256:".len()..]);
        let actual = self.digest(&name)?;
        if actual != digest {
            return Err(ArchiveError::DigestMismatch { name, actual });
        }
        Ok(name)
    }
}

/// One image of the archive: its tags, its config's bytes, its layers (name in the
/// archive, digest), and its identity.
struct Found {
    tags: Vec<String>,
    digest: String,
    config: Vec<u8>,
    layers: Vec<(String, String)>,
}

#[derive(serde::Deserialize)]
struct DockerSaveEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

fn oci_images(entries: &mut Entries) -> Result<Vec<Found>, ArchiveError> {
    let index: Manifest = entries.json("index.json")?;
    let listed = index.manifests.clone().unwrap_or_default();
    if listed.len() > MAX_IMAGES {
        return Err(ArchiveError::Format(format!(
            "the index lists {} images; berth loads at most {MAX_IMAGES} at once",
            listed.len()
        )));
    }
    let mut found = Vec::new();
    for descriptor in listed {
        let name = entries.blob(&descriptor.digest)?;
        let mut digest = descriptor.digest.clone();
        let mut manifest: Manifest = entries.json(&name)?;
        if manifest.is_index("") {
            let chosen = manifest.for_this_platform().ok_or_else(|| {
                ArchiveError::Format(format!(
                    "the archive's image has no manifest for linux/{}; it has {}",
                    crate::platform_arch(),
                    manifest.platforms()
                ))
            })?;
            let name = entries.blob(&chosen)?;
            manifest = entries.json(&name)?;
            digest = chosen;
        }
        let config = manifest
            .config
            .as_ref()
            .ok_or_else(|| ArchiveError::Format("a manifest names no config".into()))?;
        let config_name = entries.blob(&config.digest)?;
        let listed = manifest.layers.clone().unwrap_or_default();
        if listed.is_empty() || listed.len() > 127 {
            return Err(ArchiveError::Format(format!(
                "an image has {} layers; berth stacks 1 to 127",
                listed.len()
            )));
        }
        let mut layers = Vec::new();
        for layer in listed {
            layers.push((entries.blob(&layer.digest)?, layer.digest));
        }
        let tags = descriptor
            .annotations
            .iter()
            .flat_map(|a| {
                [
                    "io.containerd.image.name",
                    "org.opencontainers.image.ref.name",
                ]
                .iter()
                .filter_map(|key| a.get(*key).cloned())
            })
            // A bare `ref.name` (`latest`) is a tag with no repository: not a name.
            .filter(|tag| tag.contains([':', '/']) && Reference::parse(tag).is_ok())
            .take(1)
            .collect();
        found.push(Found {
            tags,
            digest,
            config: entries.bytes(&config_name)?,
            layers,
        });
    }
    Ok(found)
}

fn docker_save_images(entries: &mut Entries) -> Result<Vec<Found>, ArchiveError> {
    let listed: Vec<DockerSaveEntry> = entries.json("manifest.json")?;
    if listed.len() > MAX_IMAGES {
        return Err(ArchiveError::Format(format!(
            "manifest.json lists {} images; berth loads at most {MAX_IMAGES} at once",
            listed.len()
        )));
    }
    let mut found = Vec::new();
    for image in listed {
        if image.layers.is_empty() || image.layers.len() > 127 {
            return Err(ArchiveError::Format(format!(
                "an image has {} layers; berth stacks 1 to 127",
                image.layers.len()
            )));
        }
        let mut layers = Vec::new();
        for name in &image.layers {
            // A layer tar of the old shape has no digest of its own: its content's is it.
            let digest = entries.digest(name)?;
            layers.push((name.clone(), digest));
        }
        let config = entries.bytes(&image.config)?;
        // The digest of the OCI manifest these make: never another image's (a config
        // that is a copy of some manifest's bytes gets this digest, not that one's).
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": format!("sha256:{}", registry::hex(&sha2::Sha256::digest(&config))),
                "size": config.len(),
            },
            "layers": layers.iter().map(|(_, digest)| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": digest,
            })).collect::<Vec<_>>(),
        });
        let digest = registry::digest_of(manifest.to_string().as_bytes());
        found.push(Found {
            tags: image.repo_tags.unwrap_or_default(),
            digest,
            config,
            layers,
        });
    }
    Ok(found)
}

impl ImageStore {
    /// Loads every image of the archive at `path` (an OCI layout or a `docker save`
    /// tar) into the store, tagged as the archive tags it, or as `tag` when given.
    /// Blocking: run it off the async threads.
    pub fn load(&self, path: &Path, tag: Option<&Reference>) -> Result<Vec<Image>, ImageError> {
        let tmp = self.tmp().to_path_buf();
        let refused = |error: ArchiveError| ImageError::Archive {
            path: path.display().to_string(),
            error,
        };
        // No collection while this load decides what it has and writes what it got.
        let _not_collected = self.collecting.blocking_read();
        let _nor_elsewhere = crate::lock_store(&self.config.root, false)?;
        let mut entries =
            Entries::read(path, &tmp, self.config.max_layer_bytes).map_err(refused)?;
        let found = if entries.files.contains_key("index.json") {
            oci_images(&mut entries)
        } else if entries.files.contains_key("manifest.json") {
            docker_save_images(&mut entries)
        } else {
            Err(ArchiveError::Unknown)
        }
        .map_err(refused)?;
        if tag.is_some() && found.len() > 1 {
            return Err(refused(ArchiveError::OneReferenceForMany(found.len())));
        }
        let mut loaded = Vec::new();
        for image in found {
            let tags: Vec<Reference> = match tag {
                Some(tag) => vec![tag.clone()],
                None => image
                    .tags
                    .iter()
                    .map(|t| Reference::parse(t))
                    .collect::<Result<_, _>>()?,
            };
            let Some(first) = tags.first() else {
                return Err(refused(ArchiveError::Untagged));
            };
            let config = crate::read_config(&image.config)
                .map_err(|e| refused(ArchiveError::Format(e.0)))?;
            if image.layers.is_empty() || image.layers.len() > 127 {
                return Err(refused(ArchiveError::Format(format!(
                    "an image has {} layers; berth stacks 1 to 127",
                    image.layers.len()
                ))));
            }
            for (name, digest) in &image.layers {
                let target = self.layer_dir(digest);
                if target.is_dir() {
                    continue;
                }
                let blob = entries.file(name).map_err(refused)?.try_clone();
                let blob = blob.map_err(|e| refused(ArchiveError::Read(e)))?;
                crate::store_layer(blob, &tmp, &target, self.config.layer_limits).map_err(
                    |error| match error {
                        crate::StoreLayerError::Layer(error) => ImageError::Layer {
                            reference: first.to_string(),
                            digest: digest.clone(),
                            error,
                        },
                        crate::StoreLayerError::Io(error) => crate::store_error(&tmp)(error),
                    },
                )?;
            }
            for (_, digest) in &image.layers {
                crate::gc::touch(&self.layer_dir(digest));
            }
            let record = Image {
                reference: first.to_string(),
                digest: image.digest.clone(),
                config,
                layers: image.layers.iter().map(|(_, d)| d.clone()).collect(),
                private: false,
            };
            self.record(&record, &tags)?;
            loaded.push(record);
        }
        Ok(loaded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StoreConfig;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            header.set_cksum();
            builder.append_data(&mut header, name, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    /// `docker save` before Docker 25 links a layer tar whose content another has; a
    /// link is followed to the file the archive holds, never out of the archive. An
    /// archive of two images takes no single reference.
    #[test]
    fn a_docker_save_layer_linked_to_another_loads_and_a_link_out_of_the_archive_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(StoreConfig::new(dir.path().join("images"))).unwrap();
        let layer = tar_of(&[("hello", b"hi\n")]);
        let archive = |second: &str| {
            let mut builder = tar::Builder::new(Vec::new());
            let manifest = br#"[{"Config":"config.json","RepoTags":["t/linked:1"],"Layers":["a/layer.tar","b/layer.tar","c/layer.tar"]}]"#;
            for (name, data) in [
                ("manifest.json", &manifest[..]),
                ("config.json", br#"{"config":{}}"#),
                ("a/layer.tar", &layer),
            ] {
                let mut header = tar::Header::new_gnu();
                header.set_size(data.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                builder.append_data(&mut header, name, data).unwrap();
            }
            for (name, target, kind) in [
                ("b/layer.tar", second, tar::EntryType::Symlink),
                ("c/layer.tar", "a/layer.tar", tar::EntryType::Link),
            ] {
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(kind);
                header.set_size(0);
                header.set_mode(0o777);
                builder.append_link(&mut header, name, target).unwrap();
            }
            builder.into_inner().unwrap()
        };
        let path = dir.path().join("linked.tar");
        std::fs::write(&path, archive("../a/layer.tar")).unwrap();
        let loaded = store.load(&path, None).unwrap();
        assert_eq!(loaded[0].layers.len(), 3);
        assert!(loaded[0].layers.iter().all(|l| *l == loaded[0].layers[0]));
        // Two images, one reference: which one it names is not for berth to guess.
        let two = br#"[{"Config":"config.json","RepoTags":["t/one:1"],"Layers":["a/layer.tar"]},{"Config":"config.json","RepoTags":["t/two:1"],"Layers":["b/layer.tar"]}]"#;
        let mut builder = tar::Builder::new(Vec::new());
        for (name, data) in [
            ("manifest.json", &two[..]),
            ("config.json", br#"{"config":{}}"#),
            ("a/layer.tar", &layer),
            ("b/layer.tar", &layer),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, name, data).unwrap();
        }
        std::fs::write(&path, builder.into_inner().unwrap()).unwrap();
        let one = Reference::parse("t/which:1").unwrap();
        let error = store.load(&path, Some(&one)).unwrap_err().to_string();
        assert!(
            error.contains("holds 2 images and one reference"),
            "{error}"
        );
        assert_eq!(store.load(&path, None).unwrap().len(), 2);
        for out in ["../../a/layer.tar", "/etc/passwd"] {
            std::fs::write(&path, archive(out)).unwrap();
            let error = store.load(&path, None).unwrap_err().to_string();
            assert!(
                error.contains("the archive names b/layer.tar, which it does not hold"),
                "{out}: {error}"
            );
        }
    }

    /// A `docker save` archive whose config is a copy of another image's manifest
    /// bytes does not take that manifest's digest (and with it every job pinned to it).
    #[test]
    fn a_docker_save_image_never_takes_another_images_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(StoreConfig::new(dir.path().join("images"))).unwrap();
        let layer = tar_of(&[("hello", b"hi\n")]);
        // Someone's manifest, as bytes anyone can fetch; also a config berth can read.
        let victim = br#"{"schemaVersion":2,"config":{"digest":"sha256:00"},"layers":[]}"#;
        let archive = tar_of(&[
            (
                "manifest.json",
                br#"[{"Config":"config.json","RepoTags":["evil/x:1"],"Layers":["l/layer.tar"]}]"#,
            ),
            ("config.json", victim),
            ("l/layer.tar", &layer),
        ]);
        let path = dir.path().join("archive.tar");
        std::fs::write(&path, archive).unwrap();
        let loaded = store.load(&path, None).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_ne!(loaded[0].digest, registry::digest_of(victim));
        assert!(
            store
                .layer_dir(&loaded[0].layers[0])
                .join("hello")
                .is_file()
        );
    }

    /// Another store opened on the same directory (a `berth image` command beside the
    /// agent) leaves what the first is staging alone; once the first is gone, its
    /// staging is removed at the next open.
    #[test]
    fn a_store_opened_beside_another_leaves_its_staging_alone() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("images");
        let first = ImageStore::open(StoreConfig::new(root.clone())).unwrap();
        std::fs::write(first.tmp().join("half-a-layer"), b"...").unwrap();
        let second = ImageStore::open(StoreConfig::new(root.clone())).unwrap();
        assert!(first.tmp().join("half-a-layer").exists());
        let staged = first.tmp().to_path_buf();
        drop(first);
        drop(second);
        let _third = ImageStore::open(StoreConfig::new(root)).unwrap();
        assert!(!staged.exists());
    }
}
