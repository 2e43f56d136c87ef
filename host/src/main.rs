//! The `berth` binary: the command line is the library's ([`berth::cli`]); the agent is
//! in `crates/`.

fn main() -> std::process::ExitCode {
    // The binary answers `berth-keeper`'s hidden commands too, for an install without
    // `berth-keeper` beside it: a task's start (`process::spawn_plan`) and its log
    // collector (`process::logmon`). Nothing of the command line below runs in them.
    if let Some(never) = berth_sys::process::spawn_plan::keeper_main() {
        match never {}
    }
    if let Some(never) = berth_sys::process::logmon::logmon_main() {
        match never {}
    }
    // The jobspec reader, which the agent's crates parse through without depending on it.
    berth_jobspec_hcl::install();
    berth::cli::main()
}
