//! `berth:host`: what the host offers guests, one glue file per WIT interface. Each
//! checks the request against the plugin's identity and task scope, then calls into
//! [`crate::process`]; logic does not live here.

pub mod log;
mod process;

pub(crate) use process::to_wit_propagation;
mod timer;

use wasmtime::component::{HasSelf, Linker};

use crate::runtime::bindings::host;
use crate::runtime::sandbox::PluginCtx;

/// Adds WASI (no capabilities are granted by the context) and `berth:host` to a linker.
pub fn add_to_linker(linker: &mut Linker<PluginCtx>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    host::log::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    host::timer::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    host::process::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    Ok(())
}
