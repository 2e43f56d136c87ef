//! Compiled components on disk, keyed by the component's content hash and the engine's
//! compatibility hash, so an artifact is only ever loaded by an engine that could have
//! written it.

use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

pub struct ComponentCache {
    dir: Option<PathBuf>,
    progress: Option<CompileProgress>,
}

/// Told before a large component is compiled (an 18 MB Python hook takes seconds), so
/// the one waiting sees why: the CLI prints a line, the agent logs it.
#[derive(Clone)]
pub struct CompileProgress(pub std::sync::Arc<dyn Fn(&CompileNotice) + Send + Sync>);

impl std::fmt::Debug for CompileProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompileProgress")
    }
}

/// A compile about to start.
#[derive(Debug, Clone)]
pub struct CompileNotice {
    /// The component, as its loader names it (a path, or `hook "policy"`).
    pub label: String,
    pub bytes: u64,
    /// Where the result will be kept (`None`: compiled in memory, every time).
    pub cache_dir: Option<PathBuf>,
}

/// From this size on, a compile is announced: smaller ones take well under a second.
pub const ANNOUNCED_COMPILE_BYTES: u64 = 4 * 1024 * 1024;

/// How a component was had: from the cache, or compiled now (and how long that took).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compiled {
    FromCache,
    Now(std::time::Duration),
}

impl std::fmt::Display for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compiled::FromCache => f.write_str("loaded from the compile cache"),
            Compiled::Now(took) => write!(f, "compiled in {} ms", took.as_millis()),
        }
    }
}

impl ComponentCache {
    pub fn new(dir: Option<PathBuf>, progress: Option<CompileProgress>) -> Self {
        ComponentCache { dir, progress }
    }

    /// Compiles `bytes`, or loads the artifact compiled from them earlier. `label` names
    /// the component in the progress notice of a large compile.
    pub fn load(
        &self,
        engine: &Engine,
        bytes: &[u8],
        label: &str,
    ) -> Result<(Component, Compiled), CacheError> {
        check_header(bytes)?;
        let Some(dir) = &self.dir else {
            let start = self.announce(label, bytes);
            let component = Component::new(engine, bytes).map_err(compile_error)?;
            return Ok((component, Compiled::Now(start.elapsed())));
        };
        let artifact = dir.join(format!("{}.cwasm", cache_key(engine, bytes)));
        if artifact.exists() {
            // SAFETY: the file was written by `precompile_component` of an engine with
            // the same compatibility hash (it is part of the name) into our own cache.
            match unsafe { Component::deserialize_file(engine, &artifact) } {
                Ok(component) => return Ok((component, Compiled::FromCache)),
                Err(error) => {
                    tracing::warn!(artifact = %artifact.display(), %error, "recompiling a stale cache entry");
                }
            }
        }
        let start = self.announce(label, bytes);
        let compiled = engine.precompile_component(bytes).map_err(compile_error)?;
        let took = Compiled::Now(start.elapsed());
        if let Err(error) = write_atomically(dir, &artifact, &compiled) {
            // A cache that cannot be written costs a compile next time, nothing more.
            tracing::warn!(artifact = %artifact.display(), %error,
                "the component cache is not writable; using the compiled component from memory");
            // SAFETY: `compiled` was produced by this engine a moment ago.
            let component =
                unsafe { Component::deserialize(engine, &compiled) }.map_err(compile_error)?;
            return Ok((component, took));
        }
        // SAFETY: as above; we just wrote it.
        let component =
            unsafe { Component::deserialize_file(engine, &artifact) }.map_err(compile_error)?;
        Ok((component, took))
    }

    /// Tells the progress callback (and the log) about a large compile; the start time.
    fn announce(&self, label: &str, bytes: &[u8]) -> std::time::Instant {
        let size = bytes.len() as u64;
        if size >= ANNOUNCED_COMPILE_BYTES {
            tracing::info!(
                component = label,
                bytes = size,
                "compiling a large component"
            );
            if let Some(progress) = &self.progress {
                (progress.0)(&CompileNotice {
                    label: label.to_string(),
                    bytes: size,
                    cache_dir: self.dir.clone(),
                });
            }
        }
        std::time::Instant::now()
    }
}

fn cache_key(engine: &Engine, bytes: &[u8]) -> String {
    let content = Sha256::digest(bytes);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let hex: String = content
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{hex}-{:016x}", hasher.finish())
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    // Unique per writer, so concurrent loaders (threads or processes) never interleave.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let temporary = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&temporary, bytes).and_then(|()| std::fs::rename(&temporary, path))
}

/// Why a component could not be compiled or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("the file does not start with the WebAssembly magic bytes (\\0asm)")]
    NotWasm,
    #[error(
        "it is a core WebAssembly module, not a component (build for wasm32-wasip2, \
         or wrap the module with `wasm-tools component new`)"
    )]
    CoreModule,
    /// wasmtime's error with its causes, as text: it is shown, never matched on.
    #[error("{0}")]
    Compile(String),
}

fn compile_error(error: wasmtime::Error) -> CacheError {
    CacheError::Compile(format!("{error:#}"))
}

/// Says plainly what a file is when it is not a component, before wasmtime tries to
/// read it (it would otherwise try to parse it as text and report a syntax error).
fn check_header(bytes: &[u8]) -> Result<(), CacheError> {
    const MAGIC: &[u8] = b"\0asm";
    const COMPONENT_LAYER: [u8; 2] = [0x01, 0x00];
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err(CacheError::NotWasm);
    }
    if bytes[6..8] != COMPONENT_LAYER {
        return Err(CacheError::CoreModule);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unwritable_cache_costs_a_compile_not_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = dir.path().join("cache");
        std::fs::write(&blocked, "a file where the cache dir should be").unwrap();
        let cache = ComponentCache::new(Some(blocked), None);
        let (_, mock) = berth_builtin::DRIVERS
            .iter()
            .find(|(name, _)| *name == "mock")
            .unwrap();
        let engine = Engine::default();
        assert!(cache.load(&engine, mock, "mock").is_ok());
    }
}
