//! Nomad's job JSON (the body of `PUT /v1/jobs`) turned into the jobspec HCL berth reads,
//! so a job registered as JSON passes the same front end, checks and messages as one
//! from a file. Strings are written literally (their `${…}` escaped), as Nomad reads
//! JSON jobs: runtime names such as `${NOMAD_TASK_DIR}` are still interpolated when the
//! task starts. A field berth does not take is ignored, as Nomad ignores unknown ones,
//! and named in a warning; fields the server sets (indexes, status) are ignored quietly.

use hcl::expr::{Expression, Object, ObjectKey, TemplateExpr};
use hcl::structure::{Attribute, Block, Body};
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
fn text(value: &str) -> Expression {
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

fn attr(body: &mut Vec<hcl::structure::Structure>, key: &str, value: impl IntoHcl) {
    body.push(Attribute::new(key.to_string(), value.into_hcl()).into());
}

fn string_map(
    body: &mut Vec<hcl::structure::Structure>,
    key: &str,
    map: Option<&Map<String, Value>>,
) {
    if let Some(map) = map.filter(|m| !m.is_empty()) {
        attr(body, key, expression(&Value::Object(map.clone())));
    }
}

fn block(
    name: &str,
    labels: &[&str],
    body: Vec<hcl::structure::Structure>,
) -> hcl::structure::Structure {
    let mut builder = Block::builder(name.to_string());
    for label in labels {
        builder = builder.add_label(label.to_string());
    }
    builder.add_structures(body).build().into()
}

fn constraints(
    fields: &mut Fields,
    body: &mut Vec<hcl::structure::Structure>,
    warnings: &mut Vec<String>,
) -> Result<(), JobJsonError> {
    let path = fields.path.clone();
    for (i, item) in fields.list("Constraints")?.iter().enumerate() {
        let mut c = Fields::new(format!("{path}.Constraints[{i}]"), item)?;
        let mut inner = Vec::new();
        if let Some(a) = c.string("LTarget")? {
            attr(&mut inner, "attribute", a);
        }
        if let Some(o) = c.string("Operand")? {
            attr(&mut inner, "operator", o);
        }
        if let Some(v) = c.string("RTarget")? {
            attr(&mut inner, "value", v);
        }
        c.finish(warnings);
        body.push(block("constraint", &[], inner));
    }
    Ok(())
}

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
    if let Some(job_type) = fields.string("Type")? {
        attr(&mut inner, "type", job_type);
    }
    let datacenters = fields.list("Datacenters")?;
    if !datacenters.is_empty() {
        attr(
            &mut inner,
            "datacenters",
            expression(&Value::Array(datacenters.to_vec())),
        );
    }
    string_map(&mut inner, "meta", fields.object("Meta")?);
    constraints(&mut fields, &mut inner, &mut warnings)?;
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
        if let Some(b) = p.bool("ProhibitOverlap")? {
            attr(&mut body, "prohibit_overlap", b);
        }
        if let Some(b) = p.bool("Enabled")? {
            attr(&mut body, "enabled", b);
        }
        p.string("SpecType")?;
        if p.string("TimeZone")?.is_some_and(|tz| tz != "UTC") {
            warnings.push("Job.Periodic.TimeZone: berth evaluates crons in UTC".into());
        }
        p.finish(&mut warnings);
        inner.push(block("periodic", &[], body));
    }
    if let Some(parameterized) = fields.get("ParameterizedJob") {
        let mut p = Fields::new("Job.ParameterizedJob".into(), parameterized)?;
        let mut body = Vec::new();
        if let Some(payload) = p.string("Payload")? {
            attr(&mut body, "payload", payload);
        }
        for (json, hcl) in [
            ("MetaRequired", "meta_required"),
            ("MetaOptional", "meta_optional"),
        ] {
            let list = p.list(json)?;
            if !list.is_empty() {
                attr(&mut body, hcl, expression(&Value::Array(list.to_vec())));
            }
        }
        p.finish(&mut warnings);
        inner.push(block("parameterized", &[], body));
    }
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
) -> Result<hcl::structure::Structure, JobJsonError> {
    let mut fields = Fields::new(path.to_string(), value)?;
    let name = fields.string("Name")?.unwrap_or("").to_string();
    let mut inner = Vec::new();
    if let Some(count) = fields.number("Count")? {
        attr(&mut inner, "count", count);
    }
    string_map(&mut inner, "meta", fields.object("Meta")?);
    constraints(&mut fields, &mut inner, warnings)?;
    if let Some(restart) = fields.get("RestartPolicy") {
        let mut r = Fields::new(format!("{path}.RestartPolicy"), restart)?;
        let mut body = Vec::new();
        if let Some(n) = r.number("Attempts")? {
            attr(&mut body, "attempts", n);
        }
        if let Some(d) = r.duration("Interval")? {
            attr(&mut body, "interval", d);
        }
        if let Some(d) = r.duration("Delay")? {
            attr(&mut body, "delay", d);
        }
        if let Some(mode) = r.string("Mode")? {
            attr(&mut body, "mode", mode);
        }
        r.bool("RenderTemplates")?;
        r.finish(warnings);
        inner.push(block("restart", &[], body));
    }
    if let Some(disk) = fields.get("EphemeralDisk") {
        let mut d = Fields::new(format!("{path}.EphemeralDisk"), disk)?;
        let mut body = Vec::new();
        if let Some(size) = d.number("SizeMB")? {
            attr(&mut body, "size", size);
        }
        d.bool("Sticky")?;
        d.bool("Migrate")?;
        d.finish(warnings);
        inner.push(block("ephemeral_disk", &[], body));
    }
    if let Some(d) = fields.duration("ShutdownDelay")? {
        attr(&mut inner, "shutdown_delay", d);
    }
    if let Some(volumes) = fields.object("Volumes")? {
        for (name, volume) in volumes {
            let mut v = Fields::new(format!("{path}.Volumes.{name}"), volume)?;
            let mut body = Vec::new();
            v.string("Name")?;
            for (json, hcl) in [
                ("Type", "type"),
                ("Source", "source"),
                ("AccessMode", "access_mode"),
                ("AttachmentMode", "attachment_mode"),
            ] {
                if let Some(s) = v.string(json)? {
                    attr(&mut body, hcl, s);
                }
            }
            for (key, hcl) in [("ReadOnly", "read_only"), ("PerAlloc", "per_alloc")] {
                if let Some(b) = v.bool(key)? {
                    attr(&mut body, hcl, b);
                }
            }
            v.finish(warnings);
            inner.push(block("volume", &[name], body));
        }
    }
    for (i, task) in fields.list("Tasks")?.iter().enumerate() {
        inner.push(self::task(&format!("{path}.Tasks[{i}]"), task, warnings)?);
    }
    fields.finish(warnings);
    Ok(block("group", &[&name], inner))
}

fn task(
    path: &str,
    value: &Value,
    warnings: &mut Vec<String>,
) -> Result<hcl::structure::Structure, JobJsonError> {
    let mut fields = Fields::new(path.to_string(), value)?;
    let name = fields.string("Name")?.unwrap_or("").to_string();
    let mut inner = Vec::new();
    if let Some(driver) = fields.string("Driver")? {
        attr(&mut inner, "driver", driver);
    }
    if let Some(user) = fields.string("User")? {
        attr(&mut inner, "user", user);
    }
    if let Some(config) = fields.object("Config")? {
        let mut body = Vec::new();
        for (key, value) in config {
            attr(&mut body, key, expression(value));
        }
        inner.push(block("config", &[], body));
    }
    string_map(&mut inner, "env", fields.object("Env")?);
    string_map(&mut inner, "meta", fields.object("Meta")?);
    constraints(&mut fields, &mut inner, warnings)?;
    if let Some(resources) = fields.get("Resources") {
        let mut r = Fields::new(format!("{path}.Resources"), resources)?;
        let mut body = Vec::new();
        if let Some(cpu) = r.number("CPU")? {
            attr(&mut body, "cpu", cpu);
        }
        if let Some(memory) = r.number("MemoryMB")? {
            attr(&mut body, "memory", memory);
        }
        if let Some(max) = r.number("MemoryMaxMB")?.filter(|m| *m > 0) {
            attr(&mut body, "memory_max", max);
        }
        r.finish(warnings);
        inner.push(block("resources", &[], body));
    }
    for (json, hcl) in [
        ("KillTimeout", "kill_timeout"),
        ("ShutdownDelay", "shutdown_delay"),
    ] {
        if let Some(d) = fields.duration(json)? {
            attr(&mut inner, hcl, d);
        }
    }
    if let Some(signal) = fields.string("KillSignal")? {
        attr(&mut inner, "kill_signal", signal);
    }
    if let Some(lifecycle) = fields.get("Lifecycle") {
        let mut l = Fields::new(format!("{path}.Lifecycle"), lifecycle)?;
        let mut body = Vec::new();
        if let Some(hook) = l.string("Hook")? {
            attr(&mut body, "hook", hook);
        }
        if let Some(sidecar) = l.bool("Sidecar")? {
            attr(&mut body, "sidecar", sidecar);
        }
        l.finish(warnings);
        inner.push(block("lifecycle", &[], body));
    }
    for (i, mount) in fields.list("VolumeMounts")?.iter().enumerate() {
        let mut m = Fields::new(format!("{path}.VolumeMounts[{i}]"), mount)?;
        let mut body = Vec::new();
        if let Some(v) = m.string("Volume")? {
            attr(&mut body, "volume", v);
        }
        if let Some(d) = m.string("Destination")? {
            attr(&mut body, "destination", d);
        }
        if let Some(b) = m.bool("ReadOnly")? {
            attr(&mut body, "read_only", b);
        }
        if let Some(p) = m.string("PropagationMode")? {
            attr(&mut body, "propagation_mode", p);
        }
        m.string("SELinuxLabel")?;
        m.finish(warnings);
        inner.push(block("volume_mount", &[], body));
    }
    for (i, template) in fields.list("Templates")?.iter().enumerate() {
        let mut t = Fields::new(format!("{path}.Templates[{i}]"), template)?;
        let mut body = Vec::new();
        if let Some(data) = t.string("EmbeddedTmpl")? {
            attr(&mut body, "data", data);
        }
        if let Some(dest) = t.string("DestPath")? {
            attr(&mut body, "destination", dest);
        }
        if let Some(env) = t.bool("Envvars")? {
            attr(&mut body, "env", env);
        }
        if let Some(perms) = t.string("Perms")? {
            attr(&mut body, "perms", perms);
        }
        for quiet in [
            "ChangeMode",
            "ChangeSignal",
            "Splay",
            "LeftDelim",
            "RightDelim",
        ] {
            t.taken.push(quiet);
        }
        t.finish(warnings);
        inner.push(block("template", &[], body));
    }
    if let Some(payload) = fields.get("DispatchPayload") {
        let mut p = Fields::new(format!("{path}.DispatchPayload"), payload)?;
        let mut body = Vec::new();
        if let Some(file) = p.string("File")? {
            attr(&mut body, "file", file);
        }
        p.finish(warnings);
        inner.push(block("dispatch_payload", &[], body));
    }
    if let Some(logs) = fields.get("LogConfig") {
        let mut l = Fields::new(format!("{path}.LogConfig"), logs)?;
        let mut body = Vec::new();
        if let Some(n) = l.number("MaxFiles")? {
            attr(&mut body, "max_files", n);
        }
        if let Some(n) = l.number("MaxFileSizeMB")? {
            attr(&mut body, "max_file_size", n);
        }
        l.bool("Disabled")?;
        l.finish(warnings);
        inner.push(block("logs", &[], body));
    }
    fields.finish(warnings);
    Ok(block("task", &[&name], inner))
}
