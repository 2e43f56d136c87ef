//! Garbage collection of the store, as Nomad's docker driver does it (`gc { image,
//! image_delay }`): an image no task has used for the delay is removed, and with it each
//! of its layers no other image has. What is in use is the caller's word (the layers of
//! every task dir still on the node, by digest); a use is a pull, cached or not, which
//! touches the image's record and its layers. A collection waits for every pull under
//! way and pulls wait for it (`ImageStore::collecting`, and across processes an `flock`
//! of the store's `.lock`), and a layer leaves `layers/`
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
        // Nor another process's (a `berth image` command's) pull or load.
        let Ok(_nor_elsewhere) = crate::lock_store(&root, true) else {
            return collected;
        };
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

impl ImageStore {
    /// `berth image rm`: removes the image `reference` names, every tag naming it, and
    /// its layers no other image has and no task dir uses (`in_use`: layer digests'
    /// hex). Refused while a task dir on the node stands on one of its layers: that
    /// task's root would lose it. A tag the image has others besides is only untagged
    /// (`Collected::images` is then empty), as `docker rmi` does. Blocking: not on an
    /// async thread.
    pub fn remove(
        &self,
        reference: &crate::Reference,
        in_use: &HashSet<String>,
    ) -> Result<Collected, crate::ImageError> {
        let _no_pull = self.collecting.blocking_write();
        // Nor another process's (the agent's) pull or load.
        let _nor_elsewhere = crate::lock_store(&self.config.root, true)?;
        let shown = reference.to_string();
        let digest = match &reference.digest {
            Some(digest) => digest.clone(),
            None => std::fs::read_to_string(self.ref_record(reference))
                .map(|digest| digest.trim().to_string())
                .map_err(|_| crate::ImageError::NotInStore {
                    reference: shown.clone(),
                })?,
        };
        if reference.digest.is_none() {
            let tagged = std::fs::read_dir(self.config.root.join("refs"))
                .into_iter()
                .flatten()
                .flatten()
                .filter(|entry| {
                    std::fs::read_to_string(entry.path()).is_ok_and(|named| named.trim() == digest)
                })
                .count();
            if tagged > 1 {
                let tag = self.ref_record(reference);
                std::fs::remove_file(&tag).map_err(crate::store_error(&tag))?;
                return Ok(Collected::default());
            }
        }
        let record = self.manifest_record(&digest);
        let image: Image = std::fs::read(&record)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .ok_or_else(|| crate::ImageError::NotInStore {
                reference: shown.clone(),
            })?;
        if image.layers.iter().any(|l| in_use.contains(hex_of(l))) {
            return Err(crate::ImageError::InUse { reference: shown });
        }
        let root = self.config.root.clone();
        std::fs::remove_file(&record).map_err(crate::store_error(&record))?;
        for entry in std::fs::read_dir(root.join("refs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let names_it = std::fs::read_to_string(entry.path())
                .is_ok_and(|named| named.trim() == image.digest);
            if names_it {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        // Layers another image still names stay.
        let mut named: HashSet<String> = HashSet::new();
        for entry in std::fs::read_dir(root.join("manifests"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Some(other) = std::fs::read(entry.path())
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Image>(&bytes).ok())
            {
                named.extend(other.layers.iter().map(|l| hex_of(l).to_string()));
            }
        }
        let mut removed = Collected {
            images: vec![shown],
            layers: 0,
        };
        let tmp_dir = std::fs::File::open(self.tmp()).map_err(crate::store_error(self.tmp()))?;
        for layer in &image.layers {
            let hex = hex_of(layer);
            if named.contains(hex) || in_use.contains(hex) {
                continue;
            }
            let doomed = berth_artifact::tree::hidden_name("removed");
            if std::fs::rename(self.layer_dir(layer), self.tmp().join(&doomed)).is_ok() {
                let _ = berth_artifact::tree::remove_tree(tmp_dir.as_fd(), &doomed);
                removed.layers += 1;
            }
        }
        Ok(removed)
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

    #[test]
    fn an_image_is_removed_with_its_tags_and_the_layers_only_it_has_unless_a_task_uses_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(StoreConfig::new(dir.path().join("images"))).unwrap();
        for (image, layers) in [(1u8, [10u8, 11]), (2, [10, 12])] {
            for layer in layers {
                std::fs::create_dir_all(store.layer_dir(&digest(layer)).join("bin")).unwrap();
            }
            let record = Image {
                reference: format!("docker.io/library/i{image}:1"),
                digest: digest(image),
                config: ImageConfig::default(),
                layers: layers.iter().map(|l| digest(*l)).collect(),
                private: false,
            };
            let tag = crate::Reference::parse(&record.reference).unwrap();
            store.record(&record, &[tag]).unwrap();
        }
        let one = crate::Reference::parse("i1:1").unwrap();
        let in_use: HashSet<String> = [hex_of(&digest(11)).to_string()].into();
        let refused = store.remove(&one, &in_use).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("is used by a task on this node"),
            "{refused}"
        );
        assert!(store.local(&one).is_some(), "kept while in use");
        let removed = store.remove(&one, &HashSet::new()).unwrap();
        assert_eq!(removed.layers, 1, "layer 10 is image 2's too");
        assert!(store.local(&one).is_none());
        assert!(!store.layer_dir(&digest(11)).exists());
        assert!(store.layer_dir(&digest(10)).exists());
        let two = crate::Reference::parse("i2:1").unwrap();
        assert!(store.local(&two).is_some());
        let gone = store.remove(&one, &HashSet::new()).unwrap_err();
        assert_eq!(
            gone.to_string(),
            "no image docker.io/library/i1:1 in the store"
        );
        // A second tag of image 2: removing one tag only untags it.
        let image = store.local(&two).unwrap();
        let other = crate::Reference::parse("i2:other").unwrap();
        store.record(&image, std::slice::from_ref(&other)).unwrap();
        let untagged = store.remove(&other, &HashSet::new()).unwrap();
        assert!(untagged.images.is_empty());
        assert!(store.local(&other).is_none());
        assert!(store.local(&two).is_some());
    }

    /// A removal from one process (`berth image rm`) waits for a pull or load another
    /// process (the agent) has under way: that one may have just chosen to reuse a layer.
    #[test]
    fn a_removal_waits_for_another_processs_pull() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("images");
        let agent = ImageStore::open(StoreConfig::new(root.clone())).unwrap();
        let command = ImageStore::open(StoreConfig::new(root.clone())).unwrap();
        std::fs::create_dir_all(agent.layer_dir(&digest(20)).join("bin")).unwrap();
        let record = Image {
            reference: "docker.io/library/busy:1".into(),
            digest: digest(5),
            config: ImageConfig::default(),
            layers: vec![digest(20)],
            private: false,
        };
        let tag = crate::Reference::parse(&record.reference).unwrap();
        agent.record(&record, std::slice::from_ref(&tag)).unwrap();
        let pulling = crate::lock_store(&root, false).unwrap();
        let (done, removed) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(command.remove(&tag, &HashSet::new()).map(|r| r.layers));
        });
        assert!(
            removed.recv_timeout(Duration::from_millis(300)).is_err(),
            "removed during another process's pull"
        );
        drop(pulling);
        let removed = removed
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap();
        assert_eq!(removed, 1);
    }
}
