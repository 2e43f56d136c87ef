//! The `berth` command line, in Nomad's shape.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod driver;
mod job;

use crate::config::AgentConfig;
use crate::driver_set::DriverSet;
use crate::runtime::{Runtime, RuntimeConfig};

#[derive(Parser)]
#[command(
    name = "berth",
    version,
    about = "A node agent with WebAssembly task drivers"
)]
struct Cli {
    /// Where berth keeps its state and its cache of compiled components.
    #[arg(long, global = true, env = "BERTH_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Extra driver components (`*.wasm`) to load next to the built-in ones.
    #[arg(long, global = true, env = "BERTH_PLUGIN_DIR")]
    plugin_dir: Option<PathBuf>,
    /// The agent's configuration file (host volumes, plugin dir, data dir).
    #[arg(long, global = true, env = "BERTH_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job to completion on an embedded agent, streaming its events.
    Run {
        /// The jobspec (HCL).
        jobspec: PathBuf,
    },
    /// Jobs.
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
    /// Task drivers.
    Driver {
        #[command(subcommand)]
        command: DriverCommand,
    },
}

#[derive(Subcommand)]
enum JobCommand {
    /// Check a jobspec against this agent's drivers and config, without running it.
    Validate {
        /// The jobspec (HCL).
        jobspec: PathBuf,
    },
}

#[derive(Subcommand)]
enum DriverCommand {
    /// List the loaded drivers with their capabilities and health.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().expect("starting the tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("Error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = match &cli.config {
        Some(path) => AgentConfig::parse_file(path).map_err(|e| anyhow::format_err!("{e}"))?,
        None => AgentConfig::default(),
    };
    let data_dir = cli
        .data_dir
        .clone()
        .or(config.data_dir.clone())
        .unwrap_or_else(default_data_dir);
    let plugin_dir = cli.plugin_dir.clone().or(config.plugin_dir.clone());
    let runtime = Runtime::new(RuntimeConfig::new(Some(data_dir.join("component-cache"))))?;
    let (drivers, problems) = DriverSet::load(&runtime, plugin_dir.as_deref()).await;
    for problem in &problems {
        eprintln!("Warning: skipped a driver: {problem}");
    }
    match cli.command {
        Command::Driver {
            command: DriverCommand::List { json },
        } => {
            driver::driver_list(&drivers, json).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Job {
            command: JobCommand::Validate { jobspec },
        } => job::validate(&jobspec, &drivers, &config).await,
        Command::Run { jobspec } => job::run(&jobspec, &drivers, config, &data_dir).await,
    }
}

/// `/var/lib/berth` for root, `~/.local/share/berth` otherwise.
fn default_data_dir() -> PathBuf {
    if rustix::process::geteuid().is_root() {
        return PathBuf::from("/var/lib/berth");
    }
    std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".local/share/berth"))
        .unwrap_or_else(|| std::env::temp_dir().join("berth"))
}
