//! Nomad's job JSON (the body of `PUT /v1/jobs`) turned into the jobspec HCL berth reads,
//! so a job registered as JSON passes the same front end, checks and messages as one
//! from a file. Strings are written literally (their `${…}` escaped), as Nomad reads
//! JSON jobs: runtime names such as `${NOMAD_TASK_DIR}` are still interpolated when the
//! task starts. A field berth does not take is ignored, as Nomad ignores unknown ones,
//! and named in a warning; fields the server sets (indexes, status) are ignored quietly.
//! Which JSON field becomes which HCL attribute is the jobspec's field table
//! (`berth_jobspec::fields`), which the decoder reads by too.

use hcl::expr::{Expression, Object, ObjectKey, TemplateExpr};
use hcl::structure::{Attribute, Block, Body, Structure};
use serde_json::{Map, Value};

use berth_jobspec::fields::{
    Field, Kind, artifact, change_script, constraint, dispatch_payload, dns, ephemeral_disk, group,
    job, lifecycle, logs, network, parameterized, periodic, port, resources, restart, task,
    template, template_wait, volume, volume_mount,
};

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

impl Fields<'_> {
    /// Copies each field of `table` that has a value into `body`.
    fn copy(&mut self, body: &mut Vec<Structure>, table: &[Field]) -> Result<(), JobJsonError> {
        for &Field { json, hcl, kind } in table {
            match kind {
                Kind::Text => {
                    if let Some(v) = self.string(json)? {
                        attr(body, hcl, v);
                    }
                }
                Kind::Number => {
                    if let Some(v) = self.number(json)? {
                        attr(body, hcl, v);
                    }
                }
                Kind::Positive => {
                    if let Some(v) = self.number(json)?.filter(|v| *v > 0) {
                        attr(body, hcl, v);
                    }
                }
                Kind::Bool => {
                    if let Some(v) = self.bool(json)? {
                        attr(body, hcl, v);
                    }
                }
                Kind::Duration => {
                    if let Some(v) = self.duration(json)? {
                        attr(body, hcl, v);
                    }
                }
                Kind::List => {
                    let list = self.list(json)?;
                    if !list.is_empty() {
                        attr(body, hcl, expression(&Value::Array(list.to_vec())));
                    }
                }
                // Maps and blocks are read by the function of their block.
                Kind::Map | Kind::Block | Kind::Blocks => {}
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

/// A `Templates` item as a `template` block, with its `Wait` and `ChangeScript`.
fn template_block(
    path: String,
    value: &Value,
    warnings: &mut Vec<String>,
) -> Result<Structure, JobJsonError> {
    let mut fields = Fields::new(path, value)?;
    let mut body = Vec::new();
    fields.copy(&mut body, template::COPIED)?;
    // Nomad's -1 (or null) is "the task's user".
    for id in [template::UID, template::GID] {
        match fields.get(id.json) {
            None => {}
            Some(Value::Number(n)) if n.as_i64() == Some(-1) => {}
            Some(_) => {
                if let Some(n) = fields.number(id.json)? {
                    attr(&mut body, id.hcl, n);
                }
            }
        }
    }
    optional_block(
        &mut fields,
        template::WAIT,
        template_wait::COPIED,
        &[],
        &mut body,
        warnings,
    )?;
    optional_block(
        &mut fields,
        template::CHANGE_SCRIPT,
        change_script::COPIED,
        &[],
        &mut body,
        warnings,
    )?;
    // A template file: the decoder refuses `source` and says why.
    if let Some(source) = fields.string("SourcePath")? {
        attr(&mut body, "source", source);
    }
    // What Nomad writes with no effect here: no Vault.
    fields.accept(&["VaultGrace"]);
    fields.finish(warnings);
    Ok(block("template", &[], body))
}

/// An `Artifacts` item as an `artifact` block, with its `options` and `headers`.
fn artifact_block(
    path: String,
    value: &Value,
    warnings: &mut Vec<String>,
) -> Result<Structure, JobJsonError> {
    let mut fields = Fields::new(path, value)?;
    let mut body = Vec::new();
    fields.copy(&mut body, artifact::COPIED)?;
    for map in [artifact::OPTIONS, artifact::HEADERS] {
        string_map(&mut body, map.hcl, fields.object(map.json)?);
    }
    // Nomad's per-artifact TLS switch: berth always verifies.
    fields.accept(&["GetterInsecure"]);
    fields.finish(warnings);
    Ok(block(task::ARTIFACT.hcl, &[], body))
}

/// Each object of the list field `block.json`, as a block `block.hcl`.
fn list_blocks(
    fields: &mut Fields,
    block: Field,
    table: &[Field],
    accepted: &[&'static str],
    body: &mut Vec<Structure>,
    warnings: &mut Vec<String>,
) -> Result<(), JobJsonError> {
    let path = fields.path.clone();
    for (i, item) in fields.list(block.json)?.iter().enumerate() {
        let path = format!("{path}.{}[{i}]", block.json);
        body.push(object_block(
            path,
            item,
            block.hcl,
            &[],
            table,
            accepted,
            warnings,
        )?);
    }
    Ok(())
}

/// The object field `block.json`, when set, as a block `block.hcl`.
fn optional_block(
    fields: &mut Fields,
    block: Field,
    table: &[Field],
    accepted: &[&'static str],
    body: &mut Vec<Structure>,
    warnings: &mut Vec<String>,
) -> Result<(), JobJsonError> {
    if let Some(value) = fields.get(block.json) {
        let path = format!("{}.{}", fields.path, block.json);
        body.push(object_block(
            path,
            value,
            block.hcl,
            &[],
            table,
            accepted,
            warnings,
        )?);
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
    fields.copy(&mut inner, job::COPIED)?;
    string_map(&mut inner, job::META.hcl, fields.object(job::META.json)?);
    list_blocks(
        &mut fields,
        job::CONSTRAINT,
        constraint::COPIED,
        &[],
        &mut inner,
        &mut warnings,
    )?;
    if let Some(periodic) = fields.get(job::PERIODIC.json) {
        let mut p = Fields::new("Job.Periodic".into(), periodic)?;
        let mut body = Vec::new();
        let mut specs: Vec<Value> = p.list(periodic::CRONS.json)?.to_vec();
        if let Some(spec) = p.string("Spec")?
            && specs.is_empty()
        {
            specs.push(Value::String(spec.to_string()));
        }
        attr(
            &mut body,
            periodic::CRONS.hcl,
            expression(&Value::Array(specs)),
        );
        p.copy(&mut body, periodic::COPIED)?;
        p.accept(&["SpecType"]);
        if p.string("TimeZone")?.is_some_and(|tz| tz != "UTC") {
            warnings.push("Job.Periodic.TimeZone: berth evaluates crons in UTC".into());
        }
        p.finish(&mut warnings);
        inner.push(block(job::PERIODIC.hcl, &[], body));
    }
    optional_block(
        &mut fields,
        job::PARAMETERIZED,
        parameterized::COPIED,
        &[],
        &mut inner,
        &mut warnings,
    )?;
    for (i, group) in fields.list(job::GROUP.json)?.iter().enumerate() {
        inner.push(task_group(
            &format!("Job.{}[{i}]", job::GROUP.json),
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
    fields.copy(&mut inner, group::COPIED)?;
    string_map(
        &mut inner,
        group::META.hcl,
        fields.object(group::META.json)?,
    );
    list_blocks(
        &mut fields,
        group::CONSTRAINT,
        constraint::COPIED,
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        group::RESTART,
        restart::COPIED,
        &["RenderTemplates"],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        group::EPHEMERAL_DISK,
        ephemeral_disk::COPIED,
        &["Sticky", "Migrate"],
        &mut inner,
        warnings,
    )?;
    if let Some(volumes) = fields.object(group::VOLUME.json)? {
        for (name, value) in volumes {
            inner.push(object_block(
                format!("{path}.{}.{name}", group::VOLUME.json),
                value,
                group::VOLUME.hcl,
                &[name],
                volume::COPIED,
                &["Name"],
                warnings,
            )?);
        }
    }
    for (i, value) in fields.list(group::NETWORK.json)?.iter().enumerate() {
        let at = format!("{path}.{}[{i}]", group::NETWORK.json);
        inner.push(self::network(&at, value, warnings)?);
    }
    for (i, task) in fields.list(group::TASK.json)?.iter().enumerate() {
        let at = format!("{path}.{}[{i}]", group::TASK.json);
        inner.push(self::task(&at, task, warnings)?);
    }
    fields.finish(warnings);
    Ok(block("group", &[&name], inner))
}

/// A group's `NetworkResource` as its `network` block: mode, host name, `dns`, and a
/// `port` block per static (`ReservedPorts`) and dynamic (`DynamicPorts`) port. Where
/// a server placed the alloc (`IP`, `CIDR`, `Device`, a dynamic port's `Value`) is not
/// the job's: ignored quietly.
fn network(
    path: &str,
    value: &Value,
    warnings: &mut Vec<String>,
) -> Result<Structure, JobJsonError> {
    let mut fields = Fields::new(path.to_string(), value)?;
    let mut inner = Vec::new();
    fields.copy(&mut inner, network::COPIED)?;
    optional_block(
        &mut fields,
        network::DNS,
        dns::COPIED,
        &[],
        &mut inner,
        warnings,
    )?;
    for (list, is_static) in [
        (network::RESERVED_PORTS, true),
        (network::DYNAMIC_PORTS, false),
    ] {
        for (i, value) in fields.list(list.json)?.iter().enumerate() {
            let mut p = Fields::new(format!("{path}.{}[{i}]", list.json), value)?;
            let label = p
                .string(port::LABEL.json)?
                .ok_or_else(|| p.wrong(port::LABEL.json, "a port label"))?
                .to_string();
            let mut body = Vec::new();
            if is_static {
                if let Some(number) = p.number(port::STATIC.json)? {
                    attr(&mut body, port::STATIC.hcl, number);
                }
            } else {
                p.accept(&[port::STATIC.json]);
            }
            match p.get(port::TO.json) {
                None => {}
                Some(Value::Number(n)) => match n.as_i64() {
                    Some(0) => {}
                    Some(to) if (-1..=i64::from(u16::MAX)).contains(&to) => {
                        attr(&mut body, port::TO.hcl, Expression::from(to));
                    }
                    _ => return Err(p.wrong(port::TO.json, "a port number, or -1")),
                },
                Some(_) => return Err(p.wrong(port::TO.json, "a number")),
            }
            // Nomad's default host network is every address, as berth's forwards are.
            if p.string("HostNetwork")?.is_some_and(|n| n != "default") {
                warnings.push(format!(
                    "{}.HostNetwork is not supported by berth and was ignored: berth forwards ports from every host address",
                    p.path
                ));
            }
            p.finish(warnings);
            inner.push(block("port", &[&label], body));
        }
    }
    fields.accept(&["IP", "CIDR", "Device"]);
    fields.finish(warnings);
    Ok(block("network", &[], inner))
}

fn task(path: &str, value: &Value, warnings: &mut Vec<String>) -> Result<Structure, JobJsonError> {
    let mut fields = Fields::new(path.to_string(), value)?;
    let name = fields.string("Name")?.unwrap_or("").to_string();
    let mut inner = Vec::new();
    fields.copy(&mut inner, task::COPIED)?;
    if let Some(config) = fields.object(task::CONFIG.json)? {
        let mut body = Vec::new();
        for (key, value) in config {
            attr(&mut body, key, expression(value));
        }
        inner.push(block(task::CONFIG.hcl, &[], body));
    }
    string_map(&mut inner, task::ENV.hcl, fields.object(task::ENV.json)?);
    string_map(&mut inner, task::META.hcl, fields.object(task::META.json)?);
    list_blocks(
        &mut fields,
        task::CONSTRAINT,
        constraint::COPIED,
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        task::RESOURCES,
        resources::COPIED,
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        task::LIFECYCLE,
        lifecycle::COPIED,
        &[],
        &mut inner,
        warnings,
    )?;
    list_blocks(
        &mut fields,
        task::VOLUME_MOUNT,
        volume_mount::COPIED,
        &["SELinuxLabel"],
        &mut inner,
        warnings,
    )?;
    let path = fields.path.clone();
    for (i, item) in fields.list(task::TEMPLATE.json)?.iter().enumerate() {
        let path = format!("{path}.{}[{i}]", task::TEMPLATE.json);
        inner.push(template_block(path, item, warnings)?);
    }
    for (i, item) in fields.list(task::ARTIFACT.json)?.iter().enumerate() {
        let path = format!("{path}.{}[{i}]", task::ARTIFACT.json);
        inner.push(artifact_block(path, item, warnings)?);
    }
    optional_block(
        &mut fields,
        task::DISPATCH_PAYLOAD,
        dispatch_payload::COPIED,
        &[],
        &mut inner,
        warnings,
    )?;
    optional_block(
        &mut fields,
        task::LOGS,
        logs::COPIED,
        &["Disabled"],
        &mut inner,
        warnings,
    )?;
    fields.finish(warnings);
    Ok(block("task", &[&name], inner))
}
