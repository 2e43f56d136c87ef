//! `berth-keeper`: what runs beside every task, kept out of the agent's binary.
//!
//! The agent starts it (with `posix_spawn`, never a fork of itself) to start a task: it
//! runs the task's spawn plan, stays as the task's shim and init, and executes the task
//! (`process::spawn_plan`). It is also each task's log collector (`process::logmon`).
//! From the 47 MB `berth` binary every exec paid for the dynamic loader's 60,000
//! relocations and about 2 MB of private memory per process; this binary holds only
//! that code. The agent runs it from beside its own executable and falls back to
//! `berth` itself (which answers the same hidden commands) when it is missing.

fn main() -> std::process::ExitCode {
    if let Some(never) = berth_sys::process::spawn_plan::keeper_main() {
        match never {}
    }
    if let Some(never) = berth_sys::process::logmon::logmon_main() {
        match never {}
    }
    eprintln!("berth-keeper: runs beside the tasks of a berth agent, started by the agent only");
    std::process::ExitCode::from(2)
}
