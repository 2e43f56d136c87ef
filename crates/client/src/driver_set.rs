//! The drivers an agent offers: the built-in ones plus every `*.wasm` in the plugin dir.
//! A file that fails to load is reported and skipped; the rest keep working.

use std::path::Path;
use std::sync::Arc;

use berth_model::pins::{DriverPins, sha256_hex};
use berth_runtime::Runtime;
use berth_runtime::driver::{Driver, DriverOrigin, LoadError};

#[derive(Default, Clone)]
pub struct DriverSet {
    drivers: Vec<Arc<Driver>>,
    /// The registry of the runtime the drivers were loaded into (the agent's), which the
    /// agent records its own figures in too.
    metrics: berth_telemetry::Metrics,
}

impl DriverSet {
    /// Loads the built-in drivers and those in `plugin_dir`, held to `pins`. Returns the
    /// problems with files that were skipped, each naming the file.
    pub async fn load(
        runtime: &Runtime,
        plugin_dir: Option<&Path>,
        pins: &DriverPins,
    ) -> (DriverSet, Vec<LoadError>) {
        let mut set = DriverSet {
            drivers: Vec::new(),
            metrics: runtime.metrics().clone(),
        };
        let mut problems = Vec::new();
        for (name, bytes) in berth_builtin::DRIVERS {
            match Driver::load(runtime, DriverOrigin::Builtin, bytes).await {
                Ok(driver) => set.drivers.push(Arc::new(driver)),
                Err(error) => {
                    tracing::error!(driver = name, %error, "built-in driver failed to load");
                    problems.push(error);
                }
            }
        }
        if let Some(dir) = plugin_dir {
            match plugin_files(dir) {
                Ok(files) => {
                    // In parallel: one slow file (its load-time calls run up to
                    // LOAD_CALL_WALL) holds up none of the others.
                    let mut loading = tokio::task::JoinSet::new();
                    for (index, file) in files.into_iter().enumerate() {
                        let (runtime, pins) = (runtime.clone(), pins.clone());
                        loading.spawn(
                            async move { (index, load_pinned(&runtime, &file, &pins).await) },
                        );
                    }
                    let mut results = Vec::new();
                    while let Some(joined) = loading.join_next().await {
                        if let Ok(result) = joined {
                            results.push(result);
                        }
                    }
                    // In file order, as before: the problems read the same every time.
                    results.sort_by_key(|(index, _)| *index);
                    let mut loaded = Vec::new();
                    for (_, result) in results {
                        match result {
                            Ok(driver) => loaded.push(driver),
                            Err(error) => problems.push(error),
                        }
                    }
                    set.add_files(loaded, &mut problems);
                }
                Err(source) => problems.push(LoadError::Read {
                    origin: dir.display().to_string(),
                    source,
                }),
            }
        }
        (set, problems)
    }

    /// Adds the plugin dir's drivers. A name taken by a built-in driver, or reported by
    /// two files, is refused for every file that reports it: which file is meant is not
    /// for load order to decide (an operator's grant to one name must not pass to a
    /// squatter that sorts first).
    fn add_files(&mut self, loaded: Vec<Driver>, problems: &mut Vec<LoadError>) {
        let mut origins: std::collections::BTreeMap<String, Vec<String>> = Default::default();
        for driver in &loaded {
            origins
                .entry(driver.name().to_string())
                .or_default()
                .push(driver.origin().to_string());
        }
        for driver in loaded {
            let name = driver.name().to_string();
            let problem = if let Some(existing) = self.get(&name) {
                format!(
                    "name {name:?}, already taken by the driver from {}",
                    existing.origin()
                )
            } else if origins[&name].len() > 1 {
                format!(
                    "name {name:?}, which {} all report: none of them is loaded; remove all \
                     but one",
                    origins[&name].join(", ")
                )
            } else {
                self.drivers.push(Arc::new(driver));
                continue;
            };
            problems.push(LoadError::Nonsense {
                origin: driver.origin().to_string(),
                problem,
            });
        }
    }

    /// The registry the drivers' calls are recorded in.
    pub fn metrics(&self) -> &berth_telemetry::Metrics {
        &self.metrics
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Driver>> {
        self.drivers.iter().find(|d| d.name() == name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Driver>> {
        self.drivers.iter()
    }
}

/// Loads the driver in `file` if the operator's pins allow it. Under `require_pinned`
/// a digest no pin names is refused before any of its code runs; a driver whose name is
/// pinned to another digest is refused after it tells its name.
async fn load_pinned(
    runtime: &Runtime,
    file: &Path,
    pins: &DriverPins,
) -> Result<Driver, LoadError> {
    let origin = DriverOrigin::File(file.to_path_buf());
    let bytes = std::fs::read(file).map_err(|source| LoadError::Read {
        origin: origin.to_string(),
        source,
    })?;
    let digest = sha256_hex(&bytes);
    let pinned_as = pins.name_for(&digest).map(str::to_string);
    if pins.require_pinned && pinned_as.is_none() {
        return Err(LoadError::Unpinned {
            origin: origin.to_string(),
            actual: digest,
        });
    }
    let shown = origin.to_string();
    let driver = Driver::load(runtime, origin, &bytes).await?;
    let name = driver.name().to_string();
    match pins.by_name.get(&name) {
        Some(pinned) if *pinned != digest => Err(LoadError::DigestMismatch {
            origin: shown,
            name,
            pinned: pinned.clone(),
            actual: digest,
        }),
        // Approved bytes that now call themselves something else are not what was approved.
        None if pins.require_pinned => Err(LoadError::PinnedUnderOtherName {
            origin: shown,
            name,
            pinned_as: pinned_as.unwrap_or_default(),
        }),
        _ => Ok(driver),
    }
}

/// `*.wasm` files in `dir`, sorted so load order (and the order of problems) is stable.
fn plugin_files(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
        .collect();
    files.sort();
    Ok(files)
}
