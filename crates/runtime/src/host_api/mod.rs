//! `berth:host`: what the host offers guests, one glue file per WIT interface. Each
//! checks the request against the plugin's identity and task scope, then calls into
//! [`berth_sys::process`]; logic does not live here.

pub(crate) mod image;
pub mod log;
pub(crate) mod process;

pub(crate) use process::to_wit_propagation;
mod timer;

use wasmtime::component::{HasSelf, Linker};

use crate::bindings::host;
use crate::sandbox::PluginCtx;

/// Adds WASI (no capabilities are granted by the context) and `berth:host` to a linker.
pub fn add_to_linker(linker: &mut Linker<PluginCtx>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)?;
    host::log::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    host::timer::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    host::process::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    host::image::add_to_linker::<_, HasSelf<_>>(linker, |ctx| ctx)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use wasmtime::component::Component;

    use super::*;
    use crate::{Runtime, RuntimeConfig};

    /// A component that imports `berth:host/timer` at `version` with `functions`, as a
    /// guest built against that version does.
    fn timer_importer(version: &str, functions: &str) -> String {
        format!("(component (import \"berth:host/timer@{version}\" (instance {functions})))")
    }

    const SLEEP: &str = "(export \"sleep\" (func (param \"millis\" u64)))";
    const ENDS_AFTER: &str = "(export \"task-ends-after\" (func (param \"millis\" u64) \
                              (result (result (error string)))))";

    /// The host serves 0.1.2: guests built against 0.1.0 and 0.1.1 (which know only
    /// `sleep`) link unchanged, a 0.1.2 guest gets `task-ends-after`, and a guest asking
    /// for a function the host does not have is refused before it runs.
    #[test]
    fn guests_of_every_0_1_version_link_and_unknown_functions_do_not() {
        let runtime = Runtime::new(RuntimeConfig::new(None)).unwrap();
        let mut linker = Linker::new(runtime.engine());
        add_to_linker(&mut linker).unwrap();
        let links = |source: String| {
            let component = Component::new(runtime.engine(), source).unwrap();
            linker.instantiate_pre(&component).map(|_| ())
        };
        for version in ["0.1.0", "0.1.1", "0.1.2"] {
            links(timer_importer(version, SLEEP))
                .unwrap_or_else(|e| panic!("a {version} guest does not link: {e:#}"));
        }
        links(timer_importer("0.1.2", &format!("{SLEEP} {ENDS_AFTER}"))).unwrap();
        let unknown = "(export \"travel-in-time\" (func (param \"millis\" u64)))";
        assert!(links(timer_importer("0.1.2", unknown)).is_err());
    }
}
