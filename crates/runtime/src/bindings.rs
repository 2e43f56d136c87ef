//! Generated bindings for every WIT world the host speaks, in one place. The rest of this
//! crate uses the re-exports below, never the generated modules directly; no other crate
//! touches them (`host/tests/floors.rs`).

#![allow(
    missing_docs,
    clippy::all,
    clippy::allow_attributes_without_reason,
    reason = "generated code"
)]

/// `berth:driver/plugin@0.2.1`, which also generates the host-side `berth:host@0.1.4` traits
/// and the driver types every version shares.
pub mod driver_v0_2_1 {
    wasmtime::component::bindgen!({
        world: "berth:driver/plugin@0.2.1",
        path: ["../../wit/host", "../../wit/driver"],
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

/// `berth:driver/plugin@0.2.0`: 0.2.1 without `spawn-isolation` and `config-schema`. Its
/// types are those of 0.2.1, which only adds one.
pub mod driver_v0_2 {
    wasmtime::component::bindgen!({
        world: "berth:driver/plugin@0.2.0",
        path: ["../../wit/host", "../../wit/driver-0.2.0"],
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "berth:host": super::driver_v0_2_1::berth::host,
            "berth:driver/types@0.2.0": super::driver_v0_2_1::berth::driver::types,
        },
    });
}

/// `berth:driver/plugin@0.1.0`: the same functions without `capabilities`, importing
/// `berth:host@0.1.0`, which 0.1.4 extends. Its types are structurally those of 0.2.x,
/// so they map onto the same Rust types; the linker's 0.1.4 functions serve its 0.1.0
/// imports.
pub mod driver_v0_1 {
    wasmtime::component::bindgen!({
        world: "berth:driver/plugin@0.1.0",
        path: ["../../wit/host-0.1.0", "../../wit/driver-0.1"],
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "berth:host/log@0.1.0": super::driver_v0_2_1::berth::host::log,
            "berth:host/timer@0.1.0": super::driver_v0_2_1::berth::host::timer,
            "berth:host/process@0.1.0": super::driver_v0_2_1::berth::host::process,
            "berth:driver/types@0.1.0": super::driver_v0_2_1::berth::driver::types,
        },
    });
}

pub use driver_v0_2_1::berth::driver::types as driver_types;
pub use driver_v0_2_1::berth::host;

/// `berth:hook/hook@0.1.0`: third-party lifecycle hooks. They import only `berth:host/log`
/// (plus WASI, which the sandbox narrows to the task's `local/` directory).
pub mod hook_v0_1 {
    wasmtime::component::bindgen!({
        world: "berth:hook/hook@0.1.0",
        path: ["../../wit/host", "../../wit/hook"],
        imports: { default: async | trappable },
        exports: { default: async },
        with: {
            "berth:host": super::driver_v0_2_1::berth::host,
        },
    });
}
