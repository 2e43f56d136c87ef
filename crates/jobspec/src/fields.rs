//! The jobspec's fields that Nomad's job JSON carries too, each named once: its HCL name
//! (what the reader, `berth-jobspec-hcl`'s `decode/`, reads), its JSON name (what `berth-api`'s JSON reader,
//! `nomad/register.rs`, turns into it, and what the Nomad types of `berth-nomad-api`
//! write) and how the JSON value becomes the HCL one. A field berth reads only from HCL
//! (a `service`, a `csi_plugin`, hooks) is named where the reader reads it.
//!
//! The decoder asks for these fields by their constant (`task::KILL_TIMEOUT.hcl`), the
//! JSON reader copies the tables ([`Field::json`] to [`Field::hcl`]), and tests hold the
//! writer's types to the JSON names (`berth-api`'s `nomad::tests`).

/// How a JSON value becomes an HCL attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Number,
    /// A number where 0 means "not set" (Nomad's `MemoryMaxMB`).
    Positive,
    Bool,
    /// Nanoseconds in JSON, a duration text in HCL.
    Duration,
    /// A list, as it is.
    List,
    /// An object of strings (`meta`, `env`).
    Map,
    /// An object, as one block.
    Block,
    /// A list of objects (or, for `Volumes`, an object of them), as one block each.
    Blocks,
}

/// One field: its HCL name, its JSON name, and how one becomes the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub hcl: &'static str,
    pub json: &'static str,
    pub kind: Kind,
}

const fn field(hcl: &'static str, json: &'static str, kind: Kind) -> Field {
    Field { hcl, json, kind }
}

/// A `job` block.
pub mod job {
    use super::{Field, Kind::*, field};
    pub const TYPE: Field = field("type", "Type", Text);
    pub const DATACENTERS: Field = field("datacenters", "Datacenters", List);
    pub const META: Field = field("meta", "Meta", Map);
    pub const CONSTRAINT: Field = field("constraint", "Constraints", Blocks);
    pub const PERIODIC: Field = field("periodic", "Periodic", Block);
    pub const PARAMETERIZED: Field = field("parameterized", "ParameterizedJob", Block);
    pub const GROUP: Field = field("group", "TaskGroups", Blocks);
    /// The attributes the JSON reader copies as they are.
    pub const COPIED: &[Field] = &[TYPE, DATACENTERS];
}

/// A job's `periodic` block.
pub mod periodic {
    use super::{Field, Kind::*, field};
    /// One cron in Nomad's `Spec`, several in `Specs`: berth's `crons` takes both.
    pub const CRONS: Field = field("crons", "Specs", List);
    pub const PROHIBIT_OVERLAP: Field = field("prohibit_overlap", "ProhibitOverlap", Bool);
    pub const ENABLED: Field = field("enabled", "Enabled", Bool);
    pub const COPIED: &[Field] = &[PROHIBIT_OVERLAP, ENABLED];
}

/// A job's `parameterized` block.
pub mod parameterized {
    use super::{Field, Kind::*, field};
    pub const PAYLOAD: Field = field("payload", "Payload", Text);
    pub const META_REQUIRED: Field = field("meta_required", "MetaRequired", List);
    pub const META_OPTIONAL: Field = field("meta_optional", "MetaOptional", List);
    pub const COPIED: &[Field] = &[PAYLOAD, META_REQUIRED, META_OPTIONAL];
}

/// A `constraint` block (of a job, a group or a task).
pub mod constraint {
    use super::{Field, Kind::*, field};
    pub const ATTRIBUTE: Field = field("attribute", "LTarget", Text);
    pub const OPERATOR: Field = field("operator", "Operand", Text);
    pub const VALUE: Field = field("value", "RTarget", Text);
    pub const COPIED: &[Field] = &[ATTRIBUTE, OPERATOR, VALUE];
}

/// A `group` block.
pub mod group {
    use super::{Field, Kind::*, field};
    pub const COUNT: Field = field("count", "Count", Number);
    pub const SHUTDOWN_DELAY: Field = field("shutdown_delay", "ShutdownDelay", Duration);
    pub const META: Field = field("meta", "Meta", Map);
    pub const CONSTRAINT: Field = field("constraint", "Constraints", Blocks);
    pub const RESTART: Field = field("restart", "RestartPolicy", Block);
    pub const EPHEMERAL_DISK: Field = field("ephemeral_disk", "EphemeralDisk", Block);
    pub const VOLUME: Field = field("volume", "Volumes", Blocks);
    pub const TASK: Field = field("task", "Tasks", Blocks);
    pub const NETWORK: Field = field("network", "Networks", Blocks);
    pub const COPIED: &[Field] = &[COUNT, SHUTDOWN_DELAY];
}

/// A group's `network` block.
pub mod network {
    use super::{Field, Kind::*, field};
    pub const MODE: Field = field("mode", "Mode", Text);
    pub const HOSTNAME: Field = field("hostname", "Hostname", Text);
    pub const DNS: Field = field("dns", "DNS", Block);
    /// Static ports: `port "label" { static = Value }`.
    pub const RESERVED_PORTS: Field = field("port", "ReservedPorts", Blocks);
    /// Dynamic ports: `port "label" {}` (a `Value` given by a server is not kept).
    pub const DYNAMIC_PORTS: Field = field("port", "DynamicPorts", Blocks);
    pub const COPIED: &[Field] = &[MODE, HOSTNAME];
}

/// A port of a group's `network` block; its label is the block's.
pub mod port {
    use super::{Field, Kind::*, field};
    pub const LABEL: Field = field("", "Label", Text);
    pub const STATIC: Field = field("static", "Value", Number);
    /// Signed in JSON (-1: the host port's number), so read apart.
    pub const TO: Field = field("to", "To", Number);
}

/// A group network's `dns` block.
pub mod dns {
    use super::{Field, Kind::*, field};
    pub const SERVERS: Field = field("servers", "Servers", List);
    pub const SEARCHES: Field = field("searches", "Searches", List);
    pub const OPTIONS: Field = field("options", "Options", List);
    pub const COPIED: &[Field] = &[SERVERS, SEARCHES, OPTIONS];
}

/// A `restart` block (of a group or a task).
pub mod restart {
    use super::{Field, Kind::*, field};
    pub const ATTEMPTS: Field = field("attempts", "Attempts", Number);
    pub const INTERVAL: Field = field("interval", "Interval", Duration);
    pub const DELAY: Field = field("delay", "Delay", Duration);
    pub const MODE: Field = field("mode", "Mode", Text);
    pub const COPIED: &[Field] = &[ATTEMPTS, INTERVAL, DELAY, MODE];
}

/// A group's `ephemeral_disk` block.
pub mod ephemeral_disk {
    use super::{Field, Kind::*, field};
    pub const SIZE: Field = field("size", "SizeMB", Number);
    pub const COPIED: &[Field] = &[SIZE];
}

/// A group's `volume` block.
pub mod volume {
    use super::{Field, Kind::*, field};
    pub const TYPE: Field = field("type", "Type", Text);
    pub const SOURCE: Field = field("source", "Source", Text);
    pub const ACCESS_MODE: Field = field("access_mode", "AccessMode", Text);
    pub const ATTACHMENT_MODE: Field = field("attachment_mode", "AttachmentMode", Text);
    pub const READ_ONLY: Field = field("read_only", "ReadOnly", Bool);
    pub const PER_ALLOC: Field = field("per_alloc", "PerAlloc", Bool);
    pub const COPIED: &[Field] = &[
        TYPE,
        SOURCE,
        ACCESS_MODE,
        ATTACHMENT_MODE,
        READ_ONLY,
        PER_ALLOC,
    ];
}

/// A `task` block.
pub mod task {
    use super::{Field, Kind::*, field};
    pub const DRIVER: Field = field("driver", "Driver", Text);
    pub const USER: Field = field("user", "User", Text);
    pub const KILL_TIMEOUT: Field = field("kill_timeout", "KillTimeout", Duration);
    pub const SHUTDOWN_DELAY: Field = field("shutdown_delay", "ShutdownDelay", Duration);
    pub const KILL_SIGNAL: Field = field("kill_signal", "KillSignal", Text);
    pub const CONFIG: Field = field("config", "Config", Block);
    pub const ENV: Field = field("env", "Env", Map);
    pub const META: Field = field("meta", "Meta", Map);
    pub const CONSTRAINT: Field = field("constraint", "Constraints", Blocks);
    pub const RESOURCES: Field = field("resources", "Resources", Block);
    pub const LIFECYCLE: Field = field("lifecycle", "Lifecycle", Block);
    pub const VOLUME_MOUNT: Field = field("volume_mount", "VolumeMounts", Blocks);
    pub const TEMPLATE: Field = field("template", "Templates", Blocks);
    pub const DISPATCH_PAYLOAD: Field = field("dispatch_payload", "DispatchPayload", Block);
    pub const LOGS: Field = field("logs", "LogConfig", Block);
    pub const ARTIFACT: Field = field("artifact", "Artifacts", Blocks);
    pub const MAX_RUN_DURATION: Field = field("max_run_duration", "MaxRunDuration", Duration);
    pub const COPIED: &[Field] = &[
        DRIVER,
        USER,
        KILL_TIMEOUT,
        SHUTDOWN_DELAY,
        KILL_SIGNAL,
        MAX_RUN_DURATION,
    ];
}

/// A task's `artifact` block (Nomad's JSON names them `Getter*`).
pub mod artifact {
    use super::{Field, Kind::*, field};
    pub const SOURCE: Field = field("source", "GetterSource", Text);
    pub const DESTINATION: Field = field("destination", "RelativeDest", Text);
    pub const MODE: Field = field("mode", "GetterMode", Text);
    pub const OPTIONS: Field = field("options", "GetterOptions", Map);
    pub const HEADERS: Field = field("headers", "GetterHeaders", Map);
    pub const CHOWN: Field = field("chown", "Chown", Bool);
    pub const COPIED: &[Field] = &[SOURCE, DESTINATION, MODE, CHOWN];
}

/// A task's `resources` block.
pub mod resources {
    use super::{Field, Kind::*, field};
    pub const CPU: Field = field("cpu", "CPU", Number);
    pub const MEMORY: Field = field("memory", "MemoryMB", Number);
    pub const MEMORY_MAX: Field = field("memory_max", "MemoryMaxMB", Positive);
    pub const COPIED: &[Field] = &[CPU, MEMORY, MEMORY_MAX];
}

/// A task's `lifecycle` block.
pub mod lifecycle {
    use super::{Field, Kind::*, field};
    pub const HOOK: Field = field("hook", "Hook", Text);
    pub const SIDECAR: Field = field("sidecar", "Sidecar", Bool);
    pub const COPIED: &[Field] = &[HOOK, SIDECAR];
}

/// A task's `volume_mount` block.
pub mod volume_mount {
    use super::{Field, Kind::*, field};
    pub const VOLUME: Field = field("volume", "Volume", Text);
    pub const DESTINATION: Field = field("destination", "Destination", Text);
    pub const READ_ONLY: Field = field("read_only", "ReadOnly", Bool);
    pub const PROPAGATION_MODE: Field = field("propagation_mode", "PropagationMode", Text);
    pub const COPIED: &[Field] = &[VOLUME, DESTINATION, READ_ONLY, PROPAGATION_MODE];
}

/// A task's `template` block.
pub mod template {
    use super::{Field, Kind::*, field};
    pub const DATA: Field = field("data", "EmbeddedTmpl", Text);
    pub const DESTINATION: Field = field("destination", "DestPath", Text);
    pub const ENV: Field = field("env", "Envvars", Bool);
    pub const PERMS: Field = field("perms", "Perms", Text);
    pub const CHANGE_MODE: Field = field("change_mode", "ChangeMode", Text);
    pub const CHANGE_SIGNAL: Field = field("change_signal", "ChangeSignal", Text);
    pub const CHANGE_SCRIPT: Field = field("change_script", "ChangeScript", Block);
    pub const SPLAY: Field = field("splay", "Splay", Duration);
    pub const WAIT: Field = field("wait", "Wait", Block);
    pub const ONCE: Field = field("once", "Once", Bool);
    pub const UID: Field = field("uid", "Uid", Number);
    pub const GID: Field = field("gid", "Gid", Number);
    pub const LEFT_DELIMITER: Field = field("left_delimiter", "LeftDelim", Text);
    pub const RIGHT_DELIMITER: Field = field("right_delimiter", "RightDelim", Text);
    pub const ERROR_ON_MISSING_KEY: Field = field("error_on_missing_key", "ErrMissingKey", Bool);
    pub const COPIED: &[Field] = &[
        DATA,
        DESTINATION,
        ENV,
        PERMS,
        CHANGE_MODE,
        CHANGE_SIGNAL,
        SPLAY,
        ONCE,
        LEFT_DELIMITER,
        RIGHT_DELIMITER,
        ERROR_ON_MISSING_KEY,
    ];
}

/// A template's `change_script` block.
pub mod change_script {
    use super::{Field, Kind::*, field};
    pub const COMMAND: Field = field("command", "Command", Text);
    pub const ARGS: Field = field("args", "Args", List);
    pub const TIMEOUT: Field = field("timeout", "Timeout", Duration);
    pub const FAIL_ON_ERROR: Field = field("fail_on_error", "FailOnError", Bool);
    pub const COPIED: &[Field] = &[COMMAND, ARGS, TIMEOUT, FAIL_ON_ERROR];
}

/// A template's `wait` block.
pub mod template_wait {
    use super::{Field, Kind::*, field};
    pub const MIN: Field = field("min", "Min", Duration);
    pub const MAX: Field = field("max", "Max", Duration);
    pub const COPIED: &[Field] = &[MIN, MAX];
}

/// A task's `dispatch_payload` block.
pub mod dispatch_payload {
    use super::{Field, Kind::*, field};
    pub const FILE: Field = field("file", "File", Text);
    pub const COPIED: &[Field] = &[FILE];
}

/// A task's `logs` block.
pub mod logs {
    use super::{Field, Kind::*, field};
    pub const MAX_FILES: Field = field("max_files", "MaxFiles", Number);
    pub const MAX_FILE_SIZE: Field = field("max_file_size", "MaxFileSizeMB", Number);
    pub const COPIED: &[Field] = &[MAX_FILES, MAX_FILE_SIZE];
}

/// Every block's table, by the HCL block it describes: what the tests walk.
pub const BLOCKS: &[(&str, &[Field])] = &[
    (
        "job",
        &[
            job::TYPE,
            job::DATACENTERS,
            job::META,
            job::CONSTRAINT,
            job::PERIODIC,
            job::PARAMETERIZED,
            job::GROUP,
        ],
    ),
    (
        "periodic",
        &[
            periodic::CRONS,
            periodic::PROHIBIT_OVERLAP,
            periodic::ENABLED,
        ],
    ),
    ("parameterized", parameterized::COPIED),
    ("constraint", constraint::COPIED),
    (
        "group",
        &[
            group::COUNT,
            group::SHUTDOWN_DELAY,
            group::META,
            group::CONSTRAINT,
            group::RESTART,
            group::EPHEMERAL_DISK,
            group::VOLUME,
            group::TASK,
        ],
    ),
    ("restart", restart::COPIED),
    ("ephemeral_disk", ephemeral_disk::COPIED),
    ("volume", volume::COPIED),
    (
        "task",
        &[
            task::DRIVER,
            task::USER,
            task::KILL_TIMEOUT,
            task::SHUTDOWN_DELAY,
            task::KILL_SIGNAL,
            task::CONFIG,
            task::ENV,
            task::META,
            task::CONSTRAINT,
            task::RESOURCES,
            task::LIFECYCLE,
            task::VOLUME_MOUNT,
            task::TEMPLATE,
            task::DISPATCH_PAYLOAD,
            task::LOGS,
        ],
    ),
    ("resources", resources::COPIED),
    ("lifecycle", lifecycle::COPIED),
    ("volume_mount", volume_mount::COPIED),
    ("template", template::COPIED),
    ("change_script", change_script::COPIED),
    ("wait", template_wait::COPIED),
    ("dispatch_payload", dispatch_payload::COPIED),
    ("logs", logs::COPIED),
];
