//! The double's TTL checks: a check registered with `TTL` takes its status from `PUT
//! /v1/agent/check/update/:check_id`, and turns critical when no update came within
//! its TTL, as Consul's agent does.

use super::*;

/// Consul's default `check_output_max_size`.
const CHECK_OUTPUT_MAX: usize = 4096;

/// `PUT /v1/agent/check/update/:check_id`, as Consul's `AgentCheckUpdate` answers it.
pub(super) async fn update_check(
    State(state): State<Shared>,
    Extension(authz): Extension<Authz>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    // Consul's `checkUpdate`: `Status` and `Output`, both strings.
    let update = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(update)) => update,
        Ok(_) => {
            return (
                StatusCode::BAD_REQUEST,
                "Request decode failed: not an object",
            )
                .into_response();
        }
        Err(error) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("Request decode failed: {error}"),
            )
                .into_response();
        }
    };
    let status = update.get("Status").and_then(Value::as_str).unwrap_or("");
    if !["passing", "warning", "critical"].contains(&status) {
        return (
            StatusCode::BAD_REQUEST,
            format!("Invalid check status: '{status}'"),
        )
            .into_response();
    }
    let status = status.to_string();
    let output = update
        .get("Output")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let mut state = state.lock().unwrap();
    let Some(check) = state.checks.get(&id) else {
        return (
            StatusCode::NOT_FOUND,
            format!(
                "Unknown check ID {id:?}. Ensure that the check ID is passed, not the check name."
            ),
        )
            .into_response();
    };
    let service = check["ServiceName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if !authz.policy.may_write(&service) {
        return authz.denied("service:write", Some(&service));
    }
    let Some((ttl, _)) = state.ttls.get(&id).copied() else {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("CheckID {id:?} does not have associated TTL"),
        )
            .into_response();
    };
    let mut output = output;
    if output.len() > CHECK_OUTPUT_MAX {
        let mut end = CHECK_OUTPUT_MAX;
        while !output.is_char_boundary(end) {
            end -= 1;
        }
        output.truncate(end);
        output.push_str(" ... (captured check output exceeded max size)");
    }
    state.ttls.insert(id.clone(), (ttl, Instant::now() + ttl));
    if let Some(check) = state.checks.get_mut(&id) {
        check["Status"] = json!(status);
        check["Output"] = json!(output);
    }
    StatusCode::OK.into_response()
}

/// TTL checks not updated within their TTL turn critical, as Consul's TTL timer does.
pub(super) fn expire_ttls(state: &mut DoubleState) {
    let now = Instant::now();
    let DoubleState { checks, ttls, .. } = state;
    ttls.retain(|id, _| checks.contains_key(id));
    for (id, (ttl, deadline)) in ttls.iter() {
        if now > *deadline
            && let Some(check) = checks.get_mut(id)
        {
            check["Status"] = json!("critical");
            check["Output"] = json!(format!("TTL expired (last update more than {ttl:?} ago)"));
        }
    }
}

/// A Go duration as berth and Nomad write a check's (`41s`, `1500ms`, `1m30s`).
pub(super) fn go_duration(text: &str) -> Option<std::time::Duration> {
    let mut total = std::time::Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_end] {
            "ms" => std::time::Duration::from_millis(number),
            "s" => std::time::Duration::from_secs(number),
            "m" => std::time::Duration::from_secs(number * 60),
            "h" => std::time::Duration::from_secs(number * 3600),
            _ => return None,
        };
        total += unit;
        rest = &rest[unit_end..];
    }
    (!total.is_zero()).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_check_not_updated_within_its_ttl_turns_critical() {
        let mut state = DoubleState::default();
        let check = |status: &str| json!({ "CheckID": "c", "Status": status, "Output": "ok" });
        state.checks.insert("c".into(), check("passing"));
        let ttl = std::time::Duration::from_secs(1);
        state.ttls.insert("c".into(), (ttl, Instant::now() + ttl));
        expire_ttls(&mut state);
        assert_eq!(state.checks["c"]["Status"], json!("passing"));
        let past = Instant::now() - std::time::Duration::from_millis(1);
        state.ttls.insert("c".into(), (ttl, past));
        expire_ttls(&mut state);
        assert_eq!(state.checks["c"]["Status"], json!("critical"));
        assert!(
            state.checks["c"]["Output"]
                .as_str()
                .unwrap()
                .starts_with("TTL expired")
        );
        // A check gone (its service deregistered) takes its timer with it.
        state.checks.clear();
        expire_ttls(&mut state);
        assert!(state.ttls.is_empty());
    }

    #[test]
    fn go_durations_are_read_as_consul_reads_them() {
        let secs = std::time::Duration::from_secs;
        assert_eq!(go_duration("41s"), Some(secs(41)));
        assert_eq!(go_duration("1m30s"), Some(secs(90)));
        assert_eq!(
            go_duration("1500ms"),
            Some(std::time::Duration::from_millis(1500))
        );
        for bad in ["", "0s", "10", "s", "1d", "-1s"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }
}
