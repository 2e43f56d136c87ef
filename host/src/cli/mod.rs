//! The `berth` command line, in Nomad's shape.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod agent;
mod alloc;
mod driver;
mod exec;
mod hook;
mod image;
mod job;
mod node;
mod nomad_shapes;
mod output;
mod placement;
mod service;
mod volume;

use berth_api::access::SOCKET_NAME;
use berth_api::client::{Client, ClientError, DEFAULT_ADDRESS};
use berth_client::config::AgentConfig;
use berth_client::driver_set::DriverSet;
use berth_client::hook_set::HookSet;
use berth_runtime::{Runtime, RuntimeConfig};
use berth_sys::process::ProcessTable;
use driver::DriverCommand;

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
    /// The agent's API, for commands that talk to a running agent: `unix:///path` or
    /// `http://host:port`. By default the Unix socket (`api.sock`) in the data dir that
    /// --data-dir or --config names; with neither, the default data dir's, then a dev
    /// agent's (`/tmp/berth-dev/api.sock`), then http://127.0.0.1:4646.
    #[arg(long, global = true, env = "BERTH_ADDR")]
    address: Option<String>,
    /// The token for an agent's TCP listener.
    #[arg(long, global = true, env = "BERTH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: the HTTP API, the jobs, restore after a restart.
    Agent {
        /// Development mode: data dir /tmp/berth-dev unless one is given, info logs.
        /// Nomad's `-dev` spelling works too.
        #[arg(long)]
        dev: bool,
        /// A TCP listener for the API besides the Unix socket (as `http.address` in the
        /// config): it needs a token, except in dev mode, which listens on
        /// 127.0.0.1:4646 without one unless told otherwise.
        #[arg(long)]
        http_addr: Option<std::net::SocketAddr>,
    },
    /// Run a job to completion on an embedded agent, streaming its events.
    Run {
        /// The jobspec (HCL).
        jobspec: PathBuf,
        #[command(flatten)]
        vars: job::VarArgs,
    },
    /// Jobs.
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
    /// Allocations.
    Alloc {
        #[command(subcommand)]
        command: AllocCommand,
    },
    /// Task drivers.
    Driver {
        #[command(subcommand)]
        command: DriverCommand,
    },
    /// The operator's WASM lifecycle hooks (declared in the agent config).
    Hook {
        #[command(subcommand)]
        command: HookCommand,
    },
    /// CSI volumes: register, create, status.
    Volume {
        #[command(subcommand)]
        command: VolumeCommand,
    },
    /// CSI plugins (run as tasks with a `csi_plugin` block).
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// The agent's housekeeping.
    System {
        #[command(subcommand)]
        command: SystemCommand,
    },
    /// The services of running tasks and groups (`service` blocks).
    Service {
        #[command(subcommand)]
        command: ServiceCommand,
    },
    /// The cluster's nodes (one, on an agent without a cluster block).
    Node {
        #[command(subcommand)]
        command: NodeCommand,
    },
    /// This node's images (docker tasks): list, pull, load an archive.
    Image {
        #[command(subcommand)]
        command: image::ImageCommand,
    },
}

#[derive(Subcommand)]
enum NodeCommand {
    /// Show all nodes, or one with its allocs.
    Status {
        id: Option<String>,
        /// Full ids, and a node's attributes.
        #[arg(long, short = 'v')]
        verbose: bool,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Allow or forbid new placements on a node (its running allocs stay).
    Eligibility {
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        #[arg(long)]
        disable: bool,
        /// The node's id (or a unique prefix), or its name.
        id: String,
    },
    /// Move a node's allocs to other nodes (-enable), or end a drain (-disable).
    Drain {
        #[arg(long, conflicts_with = "disable", required_unless_present = "disable")]
        enable: bool,
        #[arg(long)]
        disable: bool,
        /// How long allocs may take to move before they are stopped (default 1h).
        #[arg(long, value_parser = berth_model::units::parse_duration)]
        deadline: Option<std::time::Duration>,
        /// The node's id (or a unique prefix), or its name.
        id: String,
    },
}

#[derive(Subcommand)]
enum ServiceCommand {
    /// List the services, where each is registered, and whether Consul holds it.
    List {
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum SystemCommand {
    /// Collect finished allocs now, beyond the newest `gc { max_allocs }` (their
    /// records and directories), as the agent does every `gc { interval }`.
    Gc,
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Register an existing volume of a running plugin (a volume spec file, HCL).
    Register { spec: PathBuf },
    /// Create a volume through the plugin's controller (CreateVolume), then register it.
    Create { spec: PathBuf },
    /// Show all volumes, or one with its claims.
    Status {
        id: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget a volume nobody claims (its data stays with the plugin).
    Deregister { id: String },
    /// Delete a volume nobody claims through its plugin (DeleteVolume: its data is gone).
    Delete { id: String },
    /// Detach a volume from the finished allocs still giving it back; -force gives up on
    /// its plugin (unmounts here and releases the claims without it).
    Detach {
        #[arg(long)]
        force: bool,
        id: String,
    },
    /// Snapshots through the volume's plugin (CreateSnapshot, ListSnapshots,
    /// DeleteSnapshot).
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Snapshot a volume; the name defaults to <volume>-<unix time>.
    Create {
        volume: String,
        name: Option<String>,
    },
    /// List the snapshots of one plugin, or of every plugin that lists them.
    List {
        #[arg(long)]
        plugin: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot: the plugin that holds it, and its id.
    Delete { plugin: String, snapshot: String },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Show all CSI plugins, or one with its providers and their health.
    Status {
        id: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum JobCommand {
    /// Check a jobspec against this agent's drivers and config, without running it.
    Validate {
        /// The jobspec (HCL).
        jobspec: PathBuf,
        #[command(flatten)]
        vars: job::VarArgs,
    },
    /// Submit a job to the running agent and wait until its allocs have started.
    Run {
        /// The jobspec (HCL).
        jobspec: PathBuf,
        #[command(flatten)]
        vars: job::VarArgs,
        /// Return once the job is submitted.
        #[arg(long)]
        detach: bool,
    },
    /// Show what running a jobspec would do on this agent, without running it: the
    /// allocs it would place, replace or stop, and why any cannot be placed.
    Plan {
        /// The jobspec (HCL).
        jobspec: PathBuf,
        #[command(flatten)]
        vars: job::VarArgs,
    },
    /// Show all jobs, or one job with its allocs.
    Status { id: Option<String> },
    /// Stop a job's allocs.
    Stop { id: String },
    /// Launch a child of a parameterized job, with meta and a payload (a file, or - to
    /// read standard input), written to its tasks' dispatch_payload files.
    Dispatch {
        /// KEY=VALUE, once per key; the job's parameterized block says which it takes.
        #[arg(long = "meta", value_name = "KEY=VALUE")]
        meta: Vec<String>,
        /// The parameterized job.
        id: String,
        /// The payload: a file, or - for standard input.
        input: Option<PathBuf>,
    },
    /// Periodic jobs.
    Periodic {
        #[command(subcommand)]
        command: PeriodicCommand,
    },
}

#[derive(Subcommand)]
enum PeriodicCommand {
    /// Launch a child of a periodic job now, whatever its schedule.
    Force { id: String },
}

#[derive(Subcommand)]
enum AllocCommand {
    /// Show an alloc's tasks, their states, events and mounts. A unique prefix of the
    /// id is enough.
    Status {
        id: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a task's log (stdout unless -stderr); -f follows it until the alloc ends.
    Logs {
        id: String,
        /// The task; may be left out when the alloc has one.
        task: Option<String>,
        #[arg(long)]
        stderr: bool,
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Restart a running alloc's task (or all its running tasks) now; the restart
    /// policy's attempts do not count it. A unique prefix of the id is enough.
    Restart {
        id: String,
        /// The task; every running task when left out.
        task: Option<String>,
        /// Restart every task (Nomad's -all-tasks); may not be given with a task.
        #[arg(long)]
        all_tasks: bool,
    },
    /// Send a signal to a running alloc's task (or all its running tasks).
    Signal {
        id: String,
        /// The task; every running task when left out.
        task: Option<String>,
        /// The signal, for example SIGHUP (the default is SIGKILL, as Nomad's).
        #[arg(short = 's', long = "signal", default_value = "SIGKILL")]
        signal: String,
    },
    /// Stop an alloc: its tasks get their kill signal, and a service job's is replaced.
    /// Waits until it has ended unless -detach.
    Stop {
        id: String,
        /// Return once the stop is asked for.
        #[arg(long)]
        detach: bool,
    },
    /// Run a command inside a running task of the alloc, in its confinement (its user,
    /// namespaces, root, cgroup and seccomp filter), as Nomad's alloc exec. Needs a
    /// token of scope alloc-exec that owns the job, or the operator.
    Exec {
        /// The task; may be left out when the alloc has one.
        #[arg(long)]
        task: Option<String>,
        /// Pass stdin to the command (-i=false: do not).
        #[arg(short = 'i', num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        stdin: Option<bool>,
        /// Run the command on a terminal (the default when stdin is one; -t=false: not).
        #[arg(short = 't', num_args = 0..=1, require_equals = true, default_missing_value = "true")]
        tty: Option<bool>,
        id: String,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// List a directory of the alloc, or print a file of it (PATH relative to the
    /// alloc's directory, its root by default); -stat shows what the path is.
    Fs {
        id: String,
        path: Option<String>,
        /// Show the file's mode, size and time instead of its contents.
        #[arg(long)]
        stat: bool,
    },
}

#[derive(Subcommand)]
enum HookCommand {
    /// List the declared hooks: loaded or refused, with their limits.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Nomad spells its flags with one dash (`nomad agent -dev`); that spelling is taken
/// too. Not in the command `alloc exec` runs: what follows its alloc id is the
/// command's own.
fn nomad_spellings(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    const ONE_DASH: &[&str] = &[
        "-dev",
        "-var",
        "-var-file",
        "-detach",
        "-stderr",
        "-meta",
        "-plugin",
        "-force",
        "-all-tasks",
        "-task",
    ];
    let mut spelled = Vec::new();
    // Where `alloc exec` stands: its words so far, and whether the next is a value.
    let mut in_exec = false;
    let mut value_next = false;
    let mut command_started = false;
    for arg in args {
        if command_started {
            spelled.push(arg);
            continue;
        }
        let was_value = std::mem::take(&mut value_next);
        if in_exec && !was_value {
            let flag = arg.to_str().is_some_and(|a| a.starts_with('-'));
            value_next = arg == "-task" || arg == "--task";
            if !flag {
                // The alloc id: what comes after it is the command.
                command_started = true;
            }
        }
        if !in_exec && arg == "exec" && spelled.last().is_some_and(|last| last == "alloc") {
            in_exec = true;
        }
        if ONE_DASH.iter().any(|f| arg == *f) {
            let mut long = OsString::from("-");
            long.push(&arg);
            spelled.push(long);
        } else {
            spelled.push(arg);
        }
    }
    spelled
}

pub fn main() -> ExitCode {
    output::start_log(
        tracing_subscriber::EnvFilter::try_from_env("BERTH_LOG").unwrap_or_else(|_| {
            // args_os: an argument that is not UTF-8 must reach clap (a clear error), not
            // panic here.
            let agent = std::env::args_os().any(|a| a == "agent");
            if agent { "info" } else { "warn" }.into()
        }),
    );
    let cli = Cli::parse_from(nomad_spellings(std::env::args_os()));
    if !matches!(cli.command, Command::Agent { .. } | Command::Run { .. }) {
        // A client command whose reader goes away (`berth job status | head -1`) ends
        // quietly, as Unix tools do, instead of panicking on the broken pipe. The agent
        // (and `run`, which is one) keeps ignoring SIGPIPE: a client that hangs up on it
        // is an error on that connection, not the end of the agent.
        // SAFETY: at the start of main, before any thread is spawned.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = tokio::runtime::Runtime::new().expect("starting the tokio runtime");
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            output::print_error(&error);
            ExitCode::FAILURE
        }
    };
    // Dropping a runtime waits for every blocking call to return, and one stuck in the
    // kernel (an open of a FIFO a task planted, a mount that hangs) would hold the exit
    // forever: the agent gives them this long. Its tasks keep running either way, and
    // the next agent recovers them.
    runtime.shutdown_timeout(SHUTDOWN_BOUND);
    code
}

/// The most the agent waits, once asked to stop, for blocking calls still running.
pub const SHUTDOWN_BOUND: std::time::Duration = std::time::Duration::from_secs(10);

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let dev = matches!(cli.command, Command::Agent { dev: true, .. });
    let config = match &cli.config {
        // Its problems keep their lines (`output::print_error`).
        Some(path) => AgentConfig::parse_file(path)?,
        None => AgentConfig::default(),
    };
    if let (Some(path), Command::Agent { .. }) = (&cli.config, &cli.command)
        && let Some(warning) = config.exposed_secrets_warning(path)
    {
        output::eprint_line!("Warning: {}", warning);
    }
    let data_dir = cli
        .data_dir
        .clone()
        .or(config.data_dir.clone())
        .unwrap_or_else(|| {
            if dev {
                PathBuf::from(DEV_DATA_DIR)
            } else {
                default_data_dir()
            }
        });
    // Commands that only talk to a running agent need no drivers.
    if let Some(result) = run_client_command(&cli, &data_dir).await {
        return result;
    }
    if let Command::Image { command } = cli.command {
        return image::run(command, &data_dir, &config).await;
    }
    let plugin_dir = cli.plugin_dir.clone().or(config.plugin_dir.clone());
    // Exit records let an agent restarted after `kill -9` report how tasks that ended
    // meanwhile ended.
    let mut processes = ProcessTable::with_exit_records(data_dir.join("exits"));
    // Tasks' shims, inits and log collectors execute `berth-keeper`, installed beside
    // this binary (or this binary itself, which answers the same hidden commands), so
    // that they hold none of the agent's memory.
    if let Ok(berth) = std::env::current_exe() {
        let keeper = berth.with_file_name("berth-keeper");
        processes = processes.supervised_by(if keeper.is_file() { keeper } else { berth });
    }
    let mut runtime_config = RuntimeConfig::new(Some(data_dir.join("component-cache")));
    if let Some(bytes) = config.max_component_size {
        runtime_config.max_component_bytes = bytes;
    }
    if let Some(instances) = config.max_plugin_instances {
        runtime_config.max_instances = instances;
    }
    runtime_config.compile_progress = Some(driver::compile_progress());
    let runtime = Runtime::with_processes(runtime_config, std::sync::Arc::new(processes))?;
    // The image store, for drivers that run tasks on images (docker), where tasks run.
    if matches!(cli.command, Command::Run { .. } | Command::Agent { .. }) {
        let images = berth_client::images::NodeImages::open(&data_dir, &config.image)
            .map_err(|e| anyhow::anyhow!("opening the image store: {e}"))?;
        let images = std::sync::Arc::new(images);
        if config.image.gc && matches!(cli.command, Command::Agent { .. }) {
            images.collect_garbage_every(data_dir.clone(), config.image.image_delay);
        }
        runtime.set_images(images);
    }
    let (drivers, problems) =
        DriverSet::load(&runtime, plugin_dir.as_deref(), &config.driver_pins()).await;
    for problem in &problems {
        output::eprint_line!("Warning: skipped a driver: {}", problem);
    }
    // Hooks are compiled (seconds for a Python one) only for the commands that use them.
    let hooks = match cli.command {
        Command::Driver { .. } => HookSet::default(),
        _ => HookSet::load(&runtime, &config.hooks, config.require_pinned).await,
    };
    if !matches!(cli.command, Command::Hook { .. }) {
        for (_, reason) in hooks.refused() {
            output::eprint_line!("Warning: refused a hook: {}", reason);
        }
    }
    match cli.command {
        Command::Driver {
            command: DriverCommand::List { json },
        } => {
            let drops = agent_log_drops(&cli, &data_dir).await;
            driver::driver_list(&drivers, json, drops.as_ref()).await?;
            // The drivers that load are listed; a component that was refused (each said
            // once above) fails the listing.
            Ok(if problems.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Driver {
            command: DriverCommand::Inspect { name, json },
        } => driver::driver_inspect(&drivers, &runtime, &name, json).await,
        Command::Job {
            command: JobCommand::Validate { jobspec, vars },
        } => job::validate(&jobspec, &vars, &drivers, &hooks, &config).await,
        Command::Hook {
            command: HookCommand::List { json },
        } => {
            let drops = agent_log_drops(&cli, &data_dir).await;
            hook::hook_list(&hooks, json, drops.as_ref())
        }
        Command::Run { jobspec, vars } => {
            job::run(&jobspec, &vars, drivers, hooks, config, &data_dir).await
        }
        Command::Agent { http_addr, dev } => {
            let http_addr = http_addr.or(config.http.address);
            agent::run(http_addr, dev, drivers, hooks, config, data_dir).await
        }
        Command::Job { .. }
        | Command::Alloc { .. }
        | Command::Volume { .. }
        | Command::Plugin { .. }
        | Command::System { .. }
        | Command::Service { .. }
        | Command::Image { .. }
        | Command::Node { .. } => unreachable!("handled above"),
    }
}

/// Where `berth agent -dev` keeps its state unless told otherwise.
const DEV_DATA_DIR: &str = "/tmp/berth-dev";

/// The commands that talk to a running agent; `None` for the others.
async fn run_client_command(cli: &Cli, data_dir: &Path) -> Option<anyhow::Result<ExitCode>> {
    // Everything but what runs here (the agent, a one-shot run, validate, listings of
    // what this binary loads) talks to an agent.
    let is_client = !matches!(
        cli.command,
        Command::Job {
            command: JobCommand::Validate { .. }
        } | Command::Run { .. }
            | Command::Agent { .. }
            | Command::Driver { .. }
            | Command::Hook { .. }
            | Command::Image { .. }
    );
    if !is_client {
        return None;
    }
    let client = match agent_client(cli, data_dir) {
        Ok(client) => client.with_token(cli.token.clone()),
        Err(error) => return Some(Err(error.into())),
    };
    Some(match &cli.command {
        Command::Job {
            command:
                JobCommand::Run {
                    jobspec,
                    vars,
                    detach,
                },
        } => job::submit(&client, jobspec, vars, *detach).await,
        Command::Job {
            command: JobCommand::Plan { jobspec, vars },
        } => job::plan(&client, jobspec, vars).await,
        Command::Job {
            command: JobCommand::Status { id },
        } => job::status(&client, id.as_deref()).await,
        Command::Job {
            command: JobCommand::Stop { id },
        } => job::stop(&client, id).await,
        Command::Job {
            command: JobCommand::Dispatch { meta, id, input },
        } => job::dispatch(&client, id, meta, input.as_deref()).await,
        Command::Job {
            command:
                JobCommand::Periodic {
                    command: PeriodicCommand::Force { id },
                },
        } => job::force_periodic(&client, id).await,
        Command::Alloc {
            command: AllocCommand::Status { id, json },
        } => alloc::status(&client, id, *json).await,
        Command::Alloc {
            command:
                AllocCommand::Logs {
                    id,
                    task,
                    stderr,
                    follow,
                },
        } => alloc::logs(&client, id, task.as_deref(), *stderr, *follow).await,
        Command::Alloc {
            command:
                AllocCommand::Restart {
                    id,
                    task,
                    all_tasks,
                },
        } => alloc::restart(&client, id, task.as_deref(), *all_tasks).await,
        Command::Alloc {
            command: AllocCommand::Signal { id, task, signal },
        } => alloc::signal(&client, id, task.as_deref(), signal).await,
        Command::Alloc {
            command: AllocCommand::Stop { id, detach },
        } => alloc::stop(&client, id, *detach).await,
        Command::Alloc {
            command: AllocCommand::Fs { id, path, stat },
        } => alloc::fs(&client, id, path.as_deref(), *stat).await,
        Command::Alloc {
            command:
                AllocCommand::Exec {
                    task,
                    stdin,
                    tty,
                    id,
                    command,
                },
        } => {
            let args = exec::ExecArgs {
                id,
                task: task.as_deref(),
                stdin: stdin.unwrap_or(true),
                tty: *tty,
                command,
            };
            exec::exec(&client, args).await
        }
        Command::Volume { command } => match command {
            VolumeCommand::Register { spec } => volume::register(&client, spec, false).await,
            VolumeCommand::Create { spec } => volume::register(&client, spec, true).await,
            VolumeCommand::Status { id, json } => {
                volume::status(&client, id.as_deref(), *json).await
            }
            VolumeCommand::Deregister { id } => volume::deregister(&client, id).await,
            VolumeCommand::Delete { id } => volume::delete(&client, id).await,
            VolumeCommand::Detach { force, id } => volume::detach(&client, id, *force).await,
            VolumeCommand::Snapshot { command } => match command {
                SnapshotCommand::Create { volume, name } => {
                    volume::snapshot_create(&client, volume, name.as_deref()).await
                }
                SnapshotCommand::List { plugin, json } => {
                    volume::snapshot_list(&client, plugin.as_deref(), *json).await
                }
                SnapshotCommand::Delete { plugin, snapshot } => {
                    volume::snapshot_delete(&client, plugin, snapshot).await
                }
            },
        },
        Command::Plugin {
            command: PluginCommand::Status { id, json },
        } => volume::plugin_status(&client, id.as_deref(), *json).await,
        Command::System {
            command: SystemCommand::Gc,
        } => alloc::collect_garbage(&client).await,
        Command::Service {
            command: ServiceCommand::List { json },
        } => service::list(&client, *json).await,
        Command::Node {
            command: NodeCommand::Status { id, verbose, json },
        } => node::status(&client, id.as_deref(), *verbose, *json).await,
        Command::Node {
            command: NodeCommand::Eligibility { enable, id, .. },
        } => node::eligibility(&client, id, *enable).await,
        Command::Node {
            command:
                NodeCommand::Drain {
                    enable,
                    deadline,
                    id,
                    ..
                },
        } => node::drain(&client, id, *enable, *deadline).await,
        _ => unreachable!("is_client covers exactly these"),
    })
}

/// How long `driver list` and `hook list` wait for the agent's counts.
const LOG_DROPS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The log messages each driver and hook dropped past its budget, as the running agent
/// counts them (the plugins loaded here have made no calls); `None` when no agent
/// answers, which the listings show as "-".
async fn agent_log_drops(
    cli: &Cli,
    data_dir: &Path,
) -> Option<std::collections::BTreeMap<String, u64>> {
    let client = agent_client(cli, data_dir)
        .ok()?
        .with_token(cli.token.clone());
    let answer = client.get::<berth_api::nomad::metrics::LogDrops>("/v1/berth/agent/log-drops");
    match tokio::time::timeout(LOG_DROPS_WAIT, answer).await {
        Ok(Ok(drops)) => Some(drops.plugins),
        _ => None,
    }
}

/// The agent to talk to: `--address` when given; else the Unix socket of the data dir
/// when --data-dir or --config names the agent (even when the socket is not there yet:
/// an agent still starting is that agent, and a request to it fails saying so, never
/// goes to another); else the default data dir's socket, then a dev agent's, when they
/// exist; else Nomad's TCP address. The flags' environment variables count as the flags.
fn agent_client(cli: &Cli, data_dir: &Path) -> Result<Client, ClientError> {
    if let Some(address) = &cli.address {
        return Client::new(address);
    }
    if cli.data_dir.is_some() || cli.config.is_some() {
        return Ok(Client::unix(&data_dir.join(SOCKET_NAME)));
    }
    let sockets = [
        data_dir.join(SOCKET_NAME),
        Path::new(DEV_DATA_DIR).join(SOCKET_NAME),
    ];
    match sockets.iter().find(|s| s.exists() && trusted_socket(s)) {
        Some(socket) => Ok(Client::unix(socket)),
        None => Client::new(DEFAULT_ADDRESS),
    }
}

/// Whether a socket found (not named) is an agent's this user may trust: it and its
/// directory are no links and belong to this user or root. `/tmp/berth-dev` sits in a
/// directory every local user can write: another user could make it first and listen
/// there for the jobs (and secrets in them) this CLI would send.
fn trusted_socket(socket: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let me = rustix::process::geteuid().as_raw();
    let trusted = |path: &Path| {
        std::fs::symlink_metadata(path).is_ok_and(|meta| {
            !meta.file_type().is_symlink() && (meta.uid() == me || meta.uid() == 0)
        })
    };
    trusted(socket) && socket.parent().is_some_and(trusted)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket another user made (in a directory anyone could create, as
    /// `/tmp/berth-dev`) is not taken for the agent's; one of this user's or root's is,
    /// and a link to either is not.
    #[test]
    fn a_found_socket_of_another_user_is_not_trusted() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("berth-dev");
        std::fs::create_dir(&dir).unwrap();
        let socket = dir.join(SOCKET_NAME);
        std::fs::write(&socket, "").unwrap();
        assert!(trusted_socket(&socket));
        let link = dir.join("link.sock");
        std::os::unix::fs::symlink(&socket, &link).unwrap();
        assert!(!trusted_socket(&link));
        let other = Some(rustix::fs::Uid::from_raw(65534));
        rustix::fs::chown(&socket, other, None).unwrap();
        assert!(!trusted_socket(&socket), "another user's socket");
        rustix::fs::chown(&socket, Some(rustix::process::geteuid()), None).unwrap();
        rustix::fs::chown(&dir, other, None).unwrap();
        assert!(!trusted_socket(&socket), "in another user's directory");
    }

    /// Nomad's one-dash flags are read as such, but not inside the command `alloc exec`
    /// runs, which is the command's own.
    #[test]
    fn one_dash_flags_stop_at_the_command_alloc_exec_runs() {
        let spell = |line: &str| {
            let args = line.split(' ').map(OsString::from);
            nomad_spellings(args)
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            spell("berth job stop -detach web"),
            "berth job stop --detach web"
        );
        assert_eq!(
            spell("berth alloc exec -task web -i=false 1234 rm -force -task x"),
            "berth alloc exec --task web -i=false 1234 rm -force -task x"
        );
        assert_eq!(
            spell("berth alloc exec 1234 sh -detach"),
            "berth alloc exec 1234 sh -detach"
        );
        let cli = Cli::try_parse_from(nomad_spellings(
            "berth alloc exec -task web -t=false 12 ls -la"
                .split(' ')
                .map(OsString::from),
        ))
        .unwrap();
        let Command::Alloc {
            command:
                AllocCommand::Exec {
                    task,
                    stdin,
                    tty,
                    id,
                    command,
                },
        } = cli.command
        else {
            panic!("not alloc exec");
        };
        assert_eq!(task.as_deref(), Some("web"));
        assert_eq!((stdin, tty), (None, Some(false)));
        assert_eq!(id, "12");
        assert_eq!(command, ["ls", "-la"]);
    }
}
