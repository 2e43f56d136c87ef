//! `berth-keeper`: what runs beside every task, kept out of the agent's binary.
//!
//! A task's shim and init (`process::shim`) and its log collector (`process::logmon`)
//! are executed once per task start each. From the 47 MB `berth` binary every exec paid
//! for the dynamic loader's 60,000 relocations and about 2 MB of private memory per
//! process; this binary holds only their code. The agent runs it from beside its own
//! executable and falls back to `berth` itself (which still answers the same hidden
//! commands) when it is missing.

fn main() -> std::process::ExitCode {
    if let Some(never) = berth::process::shim::supervisor_main() {
        match never {}
    }
    if let Some(never) = berth::process::logmon::logmon_main() {
        match never {}
    }
    eprintln!("berth-keeper: runs beside the tasks of a berth agent, started by the agent only");
    std::process::ExitCode::from(2)
}
