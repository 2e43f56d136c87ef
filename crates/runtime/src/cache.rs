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
}

impl ComponentCache {
    pub fn new(dir: Option<PathBuf>) -> Self {
        ComponentCache { dir }
    }

    /// Compiles `bytes`, or loads the artifact compiled from them earlier.
    pub fn load(&self, engine: &Engine, bytes: &[u8]) -> Result<Component, CacheError> {
        check_header(bytes)?;
        let Some(dir) = &self.dir else {
            return Component::new(engine, bytes).map_err(compile_error);
        };
        let artifact = dir.join(format!("{}.cwasm", cache_key(engine, bytes)));
        if artifact.exists() {
            // SAFETY: the file was written by `precompile_component` of an engine with
            // the same compatibility hash (it is part of the name) into our own cache.
            match unsafe { Component::deserialize_file(engine, &artifact) } {
                Ok(component) => return Ok(component),
                Err(error) => {
                    tracing::warn!(artifact = %artifact.display(), %error, "recompiling a stale cache entry");
                }
            }
        }
        let compiled = engine.precompile_component(bytes).map_err(compile_error)?;
        if let Err(error) = write_atomically(dir, &artifact, &compiled) {
            // A cache that cannot be written costs a compile next time, nothing more.
            tracing::warn!(artifact = %artifact.display(), %error,
                "the component cache is not writable; using the compiled component from memory");
            // SAFETY: `compiled` was produced by this engine a moment ago.
            return unsafe { Component::deserialize(engine, &compiled) }.map_err(compile_error);
        }
        // SAFETY: as above; we just wrote it.
        unsafe { Component::deserialize_file(engine, &artifact) }.map_err(compile_error)
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
        let cache = ComponentCache::new(Some(blocked));
        let (_, mock) = berth_builtin::DRIVERS
            .iter()
            .find(|(name, _)| *name == "mock")
            .unwrap();
        let engine = Engine::default();
        assert!(cache.load(&engine, mock).is_ok());
    }
}
