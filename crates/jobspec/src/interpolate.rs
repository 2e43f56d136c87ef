//! Nomad's run-time interpolation: `${NOMAD_ALLOC_DIR}`, `${attr.kernel.name}`,
//! `${meta.owner}`, `${node.unique.name}`, `${env["HOME"]}`, replaced when the task
//! starts, in its env, driver config and volume mount destinations. A name nothing
//! defines is left as written, as Nomad leaves it (a shell script's own `${x}` survives).

/// `text` with each `${name}` that `lookup` knows replaced. `lookup` gets the name as
/// written, trimmed, with `env["X"]` and `env.X` turned into `X`.
pub fn interpolate(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let written = &after[..end];
        match lookup(&key_of(written)) {
            Some(value) => out.push_str(&value),
            None => {
                out.push_str("${");
                out.push_str(written);
                out.push('}');
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Every string in `value` (not object keys) interpolated.
pub fn interpolate_json(
    value: &serde_json::Value,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> serde_json::Value {
    match value {
        serde_json::Value::String(s) => serde_json::Value::String(interpolate(s, lookup)),
        serde_json::Value::Array(items) => items
            .iter()
            .map(|item| interpolate_json(item, lookup))
            .collect(),
        serde_json::Value::Object(fields) => fields
            .iter()
            .map(|(k, v)| (k.clone(), interpolate_json(v, lookup)))
            .collect(),
        other => other.clone(),
    }
}

fn key_of(written: &str) -> String {
    let name = written.trim();
    if let Some(inner) = name
        .strip_prefix("env[")
        .and_then(|rest| rest.strip_suffix(']'))
    {
        return inner.trim().trim_matches(['"', '\'']).to_string();
    }
    if let Some(inner) = name.strip_prefix("env.") {
        return inner.to_string();
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(name: &str) -> Option<String> {
        match name {
            "NOMAD_ALLOC_DIR" => Some("/alloc".into()),
            "attr.kernel.name" => Some("linux".into()),
            "HOME" => Some("/home/t".into()),
            _ => None,
        }
    }

    #[test]
    fn known_names_are_replaced_and_unknown_ones_kept() {
        assert_eq!(
            interpolate(
                "${NOMAD_ALLOC_DIR}/x-${ attr.kernel.name }-${env[\"HOME\"]}-${nope}-${",
                &lookup
            ),
            "/alloc/x-linux-/home/t-${nope}-${"
        );
        assert_eq!(
            interpolate_json(
                &serde_json::json!({"args": ["${NOMAD_ALLOC_DIR}", 5], "${HOME}": "k"}),
                &lookup
            ),
            serde_json::json!({"args": ["/alloc", 5], "${HOME}": "k"})
        );
    }
}
