//! Nomad's job JSON (the body of `PUT /v1/jobs`) turned into the jobspec HCL berth reads,
//! so a job registered as JSON passes the same front end, checks and messages as one
//! from a file. Strings are written literally (their `${…}` escaped), as Nomad reads
//! JSON jobs: runtime names such as `${NOMAD_TASK_DIR}` are still interpolated when the
//! task starts. A field berth does not take is ignored, as Nomad ignores unknown ones,
//! and named in a warning; fields the server sets (indexes, status) are ignored quietly.

use hcl::expr::{Expression, Object, ObjectKey, TemplateExpr};
use hcl::structure::{Attribute, Block, Body, Structure};
use serde_json::{Map, Value};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JobJsonError {
    #[error("the body has no \"Job\" object")]
    NoJob,
    #[error("{path} must be {expected}")]
    WrongType {
        path: String,
        expected: &'static str,
    },
    #[error("the job has no ID (nor Name)")]
    NoId,
}

/// What a job JSON became: the jobspec, and what of the JSON was ignored.
#[derive(Debug)]
pub struct Converted {
    pub id: String,
    pub hcl: String,
    pub warnings: Vec<String>,
}

/// Fields a server sets or Nomad's defaults: ignored without a warning.
const QUIET: &[&str] = &[
    "Region",
    "Namespace",
    "Priority",
    "AllAtOnce",
    "NodePool",
    "Status",
    "StatusDescription",
    "Stop",
    "Stable",
    "Version",
    "SubmitTime",
    "CreateIndex",
    "ModifyIndex",
    "JobModifyIndex",
    "ParentID",
    "Dispatched",
    "Name",
];

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Reads one JSON object's fields, remembering which were taken.
struct Fields<'a> {
    path: String,
    object: &'a Map<String, Value>,
    taken: Vec<&'static str>,
}

impl<'a> Fields<'a> {
    fn new(path: String, value: &'a Value) -> Result<Fields<'a>, JobJsonError> {
        match value {
            Value::Object(object) => Ok(Fields {
                path,
                object,
                taken: Vec::new(),
            }),
            _ => Err(JobJsonError::WrongType {
                path,
                expected: "an object",
            }),
        }
    }

    fn get(&mut self, name: &'static str) -> Option<&'a Value> {
        self.taken.push(name);
        self.object.get(name).filter(|v| !v.is_null())
    }

    fn wrong(&self, name: &str, expected: &'static str) -> JobJsonError {
        JobJsonError::WrongType {
            path: format!("{}.{name}", self.path),
            expected,
        }
    }

    fn string(&mut self, name: &'static str) -> Result<Option<&'a str>, JobJsonError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str()).filter(|s| !s.is_empty())),
            Some(_) => Err(self.wrong(name, "a string")),
        }
    }

    fn number(&mut self, name: &'static str) -> Result<Option<u64>, JobJsonError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(Some)
                .ok_or_else(|| self.wrong(name, "a whole number of at least 0")),
            Some(_) => Err(self.wrong(name, "a number")),
        }
    }

    fn bool(&mut self, name: &'static str) -> Result<Option<bool>, JobJsonError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.wrong(name, "true or false")),
        }
    }

    fn list(&mut self, name: &'static str) -> Result<&'a [Value], JobJsonError> {
        match self.get(name) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(_) => Err(self.wrong(name, "a list")),
        }
    }

    fn object(
        &mut self,
        name: &'static str,
    ) -> Result<Option<&'a Map<String, Value>>, JobJsonError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(o)),
            Some(_) => Err(self.wrong(name, "an object")),
        }
    }

    /// A nanosecond duration as berth's duration text.
    fn duration(&mut self, name: &'static str) -> Result<Option<String>, JobJsonError> {
        Ok(self.number(name)?.map(|ns| {
            if ns % 1_000_000 == 0 {
                format!("{}ms", ns / 1_000_000)
            } else {
                format!("{}us", ns.div_ceil(1_000))
            }
        }))
    }

    /// Warnings for every field not taken that has a value.
    fn finish(self, warnings: &mut Vec<String>) {
        for (name, value) in self.object {
            if !self.taken.contains(&name.as_str())
                && !QUIET.contains(&name.as_str())
                && !is_empty(value)
            {
                warnings.push(format!(
                    "{}.{name} is not supported by berth and was ignored",
                    self.path
                ));
            }
        }
    }
}

/// A JSON string as an HCL string that means exactly it: escapes, and every `${` and
/// `%{` doubled so no template is evaluated. Written here, not left to the printer:
/// hcl-primitives 0.1.13's `escape_markers` misses a marker right after a `$` or `%`
/// (`%${3*7}` stays live), which would let a JSON job run HCL expressions on the agent.
pub(crate) fn text(value: &str) -> Expression {
    let chars: Vec<char> = value.chars().collect();
    let mut out = String::with_capacity(value.len() + 2);
    for (i, c) in chars.iter().enumerate() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(*c))),
            '$' | '%' if chars.get(i + 1) == Some(&'{') => {
                out.push(*c);
                out.push(*c);
            }
            c => out.push(*c),
        }
    }
    Expression::TemplateExpr(Box::new(TemplateExpr::QuotedString(out)))
}

/// What an attribute's value can be made from.
trait IntoHcl {
    fn into_hcl(self) -> Expression;
}

impl IntoHcl for &str {
    fn into_hcl(self) -> Expression {
        text(self)
    }
}

impl IntoHcl for &String {
    fn into_hcl(self) -> Expression {
        text(self)
    }
}

impl IntoHcl for String {
    fn into_hcl(self) -> Expression {
        text(&self)
    }
}

impl IntoHcl for u64 {
    fn into_hcl(self) -> Expression {
        Expression::from(self)
    }
}

impl IntoHcl for bool {
    fn into_hcl(self) -> Expression {
        Expression::Bool(self)
    }
}

impl IntoHcl for Expression {
    fn into_hcl(self) -> Expression {
        self
    }
}

fn expression(value: &Value) -> Expression {
    match value {
        Value::Null => Expression::Null,
        Value::Bool(b) => Expression::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Expression::from(i),
            (None, Some(u), _) => Expression::from(u),
            (_, _, Some(f)) => Expression::from(f),
            _ => Expression::Null,
        },
        Value::String(s) => text(s),
        Value::Array(items) => Expression::Array(items.iter().map(expression).collect()),
        Value::Object(fields) => {
            let mut object = Object::new();
            for (key, value) in fields {
                object.insert(ObjectKey::Expression(text(key)), expression(value));
            }
            Expression::Object(object)
        }
    }
}

fn attr(body: &mut Vec<Structure>, key: &str, value: impl IntoHcl) {
    body.push(Attribute::new(key.to_string(), value.into_hcl()).into());
}

fn string_map(body: &mut Vec<Structure>, key: &str, map: Option<&Map<String, Value>>) {
    if let Some(map) = map.filter(|m| !m.is_empty()) {
        attr(body, key, expression(&Value::Object(map.clone())));
    }
}

fn block(name: &str, labels: &[&str], body: Vec<hcl::structure::Structure>) -> Structure {
    let mut builder = Block::builder(name.to_string());
    for label in labels {
        builder = builder.add_label(label.to_string());
    }
    builder.add_structures(body).build().into()
}

/// How a JSON field becomes an HCL attribute.
#[derive(Debug, Clone, Copy)]
enum As {
    Text,
    Number,
    /// A number where 0 means "not set" (Nomad's `MemoryMaxMB`).
    Positive,
    Bool,
    /// Nanoseconds, written as berth's duration text.
    Duration,
    /// A list, as it is.
    List,
}

/// One JSON field (`json`) and the attribute it becomes (`hcl`).
type Field = (&'static str, &'static str, As);

impl Fields<'_> {
    /// Copies each field of `table` that has a value into `body`.
    fn copy(&mut self, body: &mut Vec<Structure>, table: &[Field]) -> Result<(), JobJsonError> {
        for &(json, hcl, kind) in table {
            match kind {
                As::Text => {
                    if let Some(v) = self.string(json)? {
                        attr(body, hcl, v);
                    }
                }
                As::Number => {
                    if let Some(v) = self.number(json)? {
                        attr(body, hcl, v);
                    }
                }
                As::Positive => {
                    if let Some(v) = self.number(json)?.filter(|v| *v > 0) {
                        attr(body, hcl, v);
                    }
                }
                As::Bool => {
                    if let Some(v) = self.bool(json)? {
                        attr(body, hcl, v);
                    }
                }
                As::Duration => {
                    if let Some(v) = self.duration(json)? {
                        attr(body, hcl, v);
                    }
                }
                As::List => {
                    let list = self.list(json)?;
                    if !list.is_empty() {
                        attr(body, hcl, expression(&Value::Array(list.to_vec())));
                    }
                }
            }
        }
        Ok(())
    }

    /// Fields read elsewhere or of no effect here: taken without a warning.
    fn accept(&mut self, names: &[&'static str]) {
        self.taken.extend_from_slice(names);
    }
}

/// A JSON object as an HCL block `name "label" { ... }`: its fields by `table`, the
/// rest named in warnings.
fn object_block(
    path: String,
    value: &Value,
    name: &str,
    labels: &[&str],
    table: &[Field],
    accepted: &[&'static str],
    warnings: &mut Vec<String>,
) -> Result<Structure, JobJsonError> {
    let mut fields = Fields::new(path, value)?;
    let mut body = Vec::new();
    fields.copy(&mut body, table)?;
    fields.accept(accepted);
    fields.finish(warnings);
    Ok(block(name, labels, body))
}

/// Each object of the list field `json`, as a block `name`.
fn list_blocks(
    fields: &mut Fields,
    json: &'static str,
    name: &str,
    table: &[Field],
    accepted: &[&'static str],
    body: &mut Vec<Structure>,
    warnings: &mut Vec<String>,
) -> Result<(), JobJsonError> {
    let path = fields.path.clone();
    for (i, item) in fields.list(json)?.iter().enumerate() {
        let path = format!("{path}.{json}[{i}]");
        body.push(object_block(
            path,
            item,
            name,
            &[],
            table,
            accepted,
            warnings,
        )?);
    }
    Ok(())
}

/// The object field `json`, when set, as a block `name`.
fn optional_block(
    fields: &mut Fields,
    json: &'static str,
    name: &str,
    table: &[Field],
    accepted: &[&'static str],
    body: &mut Vec<Structure>,
    warnings: &mut Vec<String>,
) -> Result<(), JobJsonError> {
    if let Some(value) = fields.get(json) {
        let path = format!("{}.{json}", fields.path);
        body.push(object_block(
            path,
            value,
            name,
            &[],
            table,
            accepted,
            warnings,
        )?);
    }
    Ok(())
}

const CONSTRAINT: &[Field] = &[
    ("LTarget", "attribute", As::Text),
    ("Operand", "operator", As::Text),
    ("RTarget", "value", As::Text),
];

/// `{"Job": {...}}` (or the job object itself) to jobspec HCL.
pub fn job_hcl(body: &Value) -> Result<Converted, JobJsonError> {
    let job = match body.get("Job") {
        Some(job) => job,
        None if body.get("TaskGroups").is_some() => body,
        None => return Err(JobJsonError::NoJob),
    };
    let mut warnings = Vec::new();
    let mut fields = Fields::new("Job".into(), job)?;
    let id = match fields.string("ID")? {
        Some(id) => id.to_string(),
        None => fields
            .object
            .get("Name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or(JobJsonError::NoId)?
            .to_string(),
    };
    let mut inner = Vec::new();
    fields.copy(
        &mut inner,
        &[
            ("Type", "type", As::Text),
            ("Datacenters", "datacenters", As::List),
        ],
    )?;
    string_map(&mut inner, "meta", fields.object("Meta")?);
    list_blocks(
        &mut fields,
        "Constraints",
        "constraint",
        CONSTRAINT,
        &[],
        &mut inner,
        &mut warnings,
    )?;
    if let Some(periodic) = fields.get("Periodic") {
        let mut p = Fields::new("Job.Periodic".into(), periodic)?;
        let mut body = Vec::new();
        let mut specs: Vec<Value> = p.list("Specs")?.to_vec();
        if let Some(spec) = p.string("Spec")?
            && specs.is_empty()
        {
            specs.push(Value::String(spec.to_string()));
        }
        attr(&mut body, "crons", expression(&Value::Array(specs)));
        p.copy(
            &mut body,
            &[
                ("ProhibitOverlap", "prohibit_overlap", As::Bool),
                ("Enabled", "enabled", As::Bool),
            ],
        )?;
        p.accept(&["SpecType"]);
        if p.string("TimeZone")?.is_some_and(|tz| tz != "UTC") {
            warnings.push("Job.Periodic.TimeZone: berth evaluates crons in UTC".into());
        }
        p.finish(&mut warnings);
        inner.push(block("periodic", &[], body));
    }
    optional_block(
        &mut fields,
        "ParameterizedJob",
        "parameterized",
        &[
            ("Payload", "payload", As::Text),
            ("MetaRequired", "meta_required", As::List),
            ("MetaOptional", "meta_optional", As::List),
        ],
        &[],
        &mut inner,
        &mut warnings,
    )?;
    for (i, group) in fields.list("TaskGroups")?.iter().enumerate() {
        inner.push(task_group(
            &format!("Job.TaskGroups[{i}]"),
            group,
            &mut warnings,
        )?);
    }
    fields.finish(&mut warnings);
    let body = Body::builder()
        .add_structure(block("job", &[&id], inner))
        .build();
    let hcl = hcl::to_string(&body).map_err(|_| JobJsonError::WrongType {
        path: "Job".into(),
        expected: "a job HCL can express",
    })?;
    Ok(Converted { id, hcl, warnings })
}

fn task_group(
    path: &str,
    value: &Value,
    warnings: &mut Vec<String>,
) -> Result<Structure, JobJsonError> {
    let mut fields = Fields::new(path.to_string(), value)?;
    let name = fields.string("Name")?.unwrap_or("").to_string();
    let mut inner = Vec::new();
    fields.copy(
        &mut inner,
        &[
            ("Count", "count", As::Number),
            ("ShutdownDelay", "shutdown_delay", As::Duration),
        ],
    )?;
    string_map(&mut inner, "meta", fields.object("Meta")?);
    list_blocks(
        &mut fields,
        "Constraints",
        "constraint",
        CONSTRAINT,
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        "RestartPolicy",
        "restart",
        &[
            ("Attempts", "attempts", As::Number),
            ("Interval", "interval", As::Duration),
            ("Delay", "delay", As::Duration),
            ("Mode", "mode", As::Text),
        ],
        &["RenderTemplates"],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        "EphemeralDisk",
        "ephemeral_disk",
        &[("SizeMB", "size", As::Number)],
        &["Sticky", "Migrate"],
        &mut inner,
        warnings,
    )?;
    if let Some(volumes) = fields.object("Volumes")? {
        for (name, volume) in volumes {
            inner.push(object_block(
                format!("{path}.Volumes.{name}"),
                volume,
                "volume",
                &[name],
                &[
                    ("Type", "type", As::Text),
                    ("Source", "source", As::Text),
                    ("AccessMode", "access_mode", As::Text),
                    ("AttachmentMode", "attachment_mode", As::Text),
                    ("ReadOnly", "read_only", As::Bool),
                    ("PerAlloc", "per_alloc", As::Bool),
                ],
                &["Name"],
                warnings,
            )?);
        }
    }
    for (i, task) in fields.list("Tasks")?.iter().enumerate() {
        inner.push(self::task(&format!("{path}.Tasks[{i}]"), task, warnings)?);
    }
    fields.finish(warnings);
    Ok(block("group", &[&name], inner))
}

fn task(path: &str, value: &Value, warnings: &mut Vec<String>) -> Result<Structure, JobJsonError> {
    let mut fields = Fields::new(path.to_string(), value)?;
    let name = fields.string("Name")?.unwrap_or("").to_string();
    let mut inner = Vec::new();
    fields.copy(
        &mut inner,
        &[
            ("Driver", "driver", As::Text),
            ("User", "user", As::Text),
            ("KillTimeout", "kill_timeout", As::Duration),
            ("ShutdownDelay", "shutdown_delay", As::Duration),
            ("KillSignal", "kill_signal", As::Text),
        ],
    )?;
    if let Some(config) = fields.object("Config")? {
        let mut body = Vec::new();
        for (key, value) in config {
            attr(&mut body, key, expression(value));
        }
        inner.push(block("config", &[], body));
    }
    string_map(&mut inner, "env", fields.object("Env")?);
    string_map(&mut inner, "meta", fields.object("Meta")?);
    list_blocks(
        &mut fields,
        "Constraints",
        "constraint",
        CONSTRAINT,
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        "Resources",
        "resources",
        &[
            ("CPU", "cpu", As::Number),
            ("MemoryMB", "memory", As::Number),
            ("MemoryMaxMB", "memory_max", As::Positive),
        ],
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        "Lifecycle",
        "lifecycle",
        &[("Hook", "hook", As::Text), ("Sidecar", "sidecar", As::Bool)],
        &[],
        &mut inner,
        warnings,
    )?;
    list_blocks(
        &mut fields,
        "VolumeMounts",
        "volume_mount",
        &[
            ("Volume", "volume", As::Text),
            ("Destination", "destination", As::Text),
            ("ReadOnly", "read_only", As::Bool),
            ("PropagationMode", "propagation_mode", As::Text),
        ],
        &["SELinuxLabel"],
        &mut inner,
        warnings,
    )?;
    list_blocks(
        &mut fields,
        "Templates",
        "template",
        &[
            ("EmbeddedTmpl", "data", As::Text),
            ("DestPath", "destination", As::Text),
            ("Envvars", "env", As::Bool),
            ("Perms", "perms", As::Text),
        ],
        // Re-rendering on change: what berth renders does not change while a task runs.
        &[
            "ChangeMode",
            "ChangeSignal",
            "Splay",
            "LeftDelim",
            "RightDelim",
        ],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        "DispatchPayload",
        "dispatch_payload",
        &[("File", "file", As::Text)],
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        "LogConfig",
        "logs",
        &[
            ("MaxFiles", "max_files", As::Number),
            ("MaxFileSizeMB", "max_file_size", As::Number),
        ],
        &["Disabled"],
        &mut inner,
        warnings,
    )?;
    fields.finish(warnings);
    Ok(block("task", &[&name], inner))
}
