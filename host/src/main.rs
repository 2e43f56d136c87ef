//! The `berth` binary: everything lives in the library; see [`berth::cli`].

fn main() -> std::process::ExitCode {
    berth::cli::main()
}
