//! Garbage collection of the store, as Nomad's docker driver does it (`gc { image,
//! image_delay }`): an image no task has used for the delay is removed, and with it each
//! of its layers no other image has. What is in use is the caller's word (the layers of
//! every task dir still on the node, by digest); a use is a pull, cached or not, which
//! touches the image's record and its layers. A collection waits for every pull under
//! way and pulls wait for it (`ImageStore::collecting`), and a layer leaves `layers/`
//! in one rename before it is removed: a pull never finds half a layer.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::{Image, ImageStore, hex_of};

/// What one collection removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collected {
    pub images: Vec<String>,
    pub layers: usize,
}

/// Marks `path` used now (its modification time).
pub(crate) fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::open(path) {
        let _ = file.set_modified(SystemTime::now());
    }
}

fn idle_for(path: &Path, delay: Duration) -> bool {
    std::fs::symlink_metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|at| at.elapsed().ok())
        .is_some_and(|idle| idle >= delay)
}

impl ImageStore {
    /// Removes the images unused for `delay` none of whose layers is in `in_use` (layer
    /// digests' hex), then the layers no image names, unused for `delay` and not in
    /// use. Blocking: not on an async thread.
    pub fn collect_garbage(&self, in_use: &HashSet<String>, delay: Duration) -> Collected {
        let _no_pull = self.collecting.blocking_write();
        let root = self.config.root.clone();
        let mut collected = Collected::default();
        let mut kept_layers: HashSet<String> = HashSet::new();
        let mut removed_digests: HashSet<String> = HashSet::new();
        let records = std::fs::read_dir(root.join("manifests"))
            .into_iter()
            .flatten()
            .flatten();
        for entry in records {
            let path = entry.path();
            let Some(image) = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Image>(&bytes).ok())
            else {
                continue;
            };
            let used = image
                .layers
                .iter()
                .any(|layer| in_use.contains(hex_of(layer)));
            if used || !idle_for(&path, delay) {
                kept_layers.extend(image.layers.iter().map(|l| hex_of(l).to_string()));
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                removed_digests.insert(image.digest.clone());
                collected.images.push(image.reference.clone());
            }
        }
        // A tag that names a removed image names nothing now.
        for entry in std::fs::read_dir(root.join("refs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let names_removed = std::fs::read_to_string(entry.path())
                .is_ok_and(|digest| removed_digests.contains(digest.trim()));
            if names_removed {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let layers = root.join("layers");
        let Ok(tmp_dir) = std::fs::File::open(self.tmp()) else {
            return collected;
        };
        for entry in std::fs::read_dir(&layers).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if kept_layers.contains(&name) || in_use.contains(&name) || !idle_for(&path, delay) {
                continue;
            }
            // Out of `layers/` whole first, then removed where no one looks.
            let doomed = berth_artifact::tree::hidden_name("collected");
            if std::fs::rename(&path, self.tmp().join(&doomed)).is_ok() {
                let _ = berth_artifact::tree::remove_tree(tmp_dir.as_fd(), &doomed);
                collected.layers += 1;
            }
        }
        collected
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ImageConfig, StoreConfig};

    fn digest(n: u8) -> String {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
    }

    fn aged(path: &Path, by: Duration) {
        let file = std::fs::File::open(path).unwrap();
        file.set_modified(SystemTime::now() - by).unwrap();
    }

    #[test]
    fn unused_images_go_after_the_delay_with_their_own_layers_and_used_ones_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(StoreConfig::new(dir.path().join("images"))).unwrap();
        let old = Duration::from_secs(600);
        // Images 1 and 2 share layer 10; 1 also has 11, 2 has 12; 3 has 13 and is fresh.
        let images = [(1, vec![10, 11]), (2, vec![10, 12]), (3, vec![13])];
        for (image, layers) in &images {
            for layer in layers {
                std::fs::create_dir_all(store.layer_dir(&digest(*layer)).join("bin")).unwrap();
            }
            let record = Image {
                reference: format!("docker.io/library/i{image}:1"),
                digest: digest(*image),
                config: ImageConfig::default(),
                layers: layers.iter().map(|l| digest(*l)).collect(),
                private: false,
            };
            let tag = crate::Reference::parse(&record.reference).unwrap();
            store.record(&record, &[tag]).unwrap();
        }
        // A layer no image names yet (a pull under way) is fresh, and stays.
        std::fs::create_dir_all(store.layer_dir(&digest(14))).unwrap();
        for n in [1, 2] {
            aged(&store.manifest_record(&digest(n)), old);
        }
        for n in [10, 11, 12, 13] {
            aged(&store.layer_dir(&digest(n)), old);
        }
        // A task stands on image 2's own layer.
        let in_use: HashSet<String> = [hex_of(&digest(12)).to_string()].into();
        let collected = store.collect_garbage(&in_use, Duration::from_secs(180));
        assert_eq!(collected.images, ["docker.io/library/i1:1"]);
        assert_eq!(collected.layers, 1, "only 11: 10 is image 2's too");
        assert!(!store.layer_dir(&digest(11)).exists());
        for kept in [10, 12, 13, 14] {
            assert!(store.layer_dir(&digest(kept)).is_dir(), "{kept}");
        }
        assert!(
            store
                .local(&crate::Reference::parse("i1:1").unwrap())
                .is_none()
        );
        assert!(
            store
                .local(&crate::Reference::parse("i2:1").unwrap())
                .is_some()
        );

        // Once no task uses image 2, it goes too, and every layer it alone had.
        let collected = store.collect_garbage(&HashSet::new(), Duration::from_secs(180));
        assert_eq!(collected.images, ["docker.io/library/i2:1"]);
        assert_eq!(collected.layers, 2);
        assert!(
            store
                .local(&crate::Reference::parse("i3:1").unwrap())
                .is_some()
        );
    }
}
