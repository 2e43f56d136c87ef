//! A `berth:hook@0.1.0` component that does nothing. Tests load it as a driver to check
//! that a component of the wrong world is refused with a clear error.

wit_bindgen::generate!({
    world: "berth:hook/hook@0.1.0",
    path: ["../../../wit/host", "../../../wit/hook"],
    generate_all,
});

use berth::hook::types::{ExitInfo, PrestartResponse, TaskContext};
use exports::berth::hook::lifecycle::Guest;

struct Noop;

impl Guest for Noop {
    fn prestart(_context: TaskContext) -> Result<PrestartResponse, String> {
        Ok(PrestartResponse {
            env: vec![],
            events: vec![],
        })
    }
    fn poststart(_context: TaskContext) {}
    fn exited(_context: TaskContext, _exit: ExitInfo) {}
    fn stop(_context: TaskContext) {}
}

export!(Noop);
