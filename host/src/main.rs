//! The `berth` binary: everything lives in the library; see [`berth::cli`].

fn main() -> std::process::ExitCode {
    // A task's shim or init, re-executed by the agent's child (see `process::shim`):
    // nothing of the command line below runs in it.
    if let Some(never) = berth::process::shim::supervisor_main() {
        match never {}
    }
    // A task's log collector (see `process::logmon`).
    if let Some(never) = berth::process::logmon::logmon_main() {
        match never {}
    }
    berth::cli::main()
}
