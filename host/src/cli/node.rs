//! `berth node status|eligibility|drain`: the cluster's nodes, through Nomad's node
//! endpoints, in Nomad's words. On an agent with no cluster block there is one node.

use std::process::ExitCode;

use serde_json::Value;

use super::output::print_line;
use berth_api::client::Client;

pub(super) async fn status(
    client: &Client,
    id: Option<&str>,
    verbose: bool,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let Some(id) = id else {
        let nodes: Value = client.get("/v1/nodes").await?;
        if json {
            super::output::print_json(&nodes)?;
            return Ok(ExitCode::SUCCESS);
        }
        let nodes = nodes.as_array().cloned().unwrap_or_default();
        if nodes.is_empty() {
            print_line!("No nodes registered");
            return Ok(ExitCode::SUCCESS);
        }
        print_line!(
            "{:<36}  {:<8} {:<20} {:<8} {:<11} {:<8}",
            "ID",
            "DC",
            "Name",
            "Drain",
            "Eligibility",
            "Status"
        );
        for node in nodes {
            let text = |k: &str| super::output::one_line(node[k].as_str().unwrap_or_default());
            let full_id = text("ID").to_string();
            let shown_id = if verbose {
                full_id.as_str()
            } else {
                full_id.get(..8).unwrap_or(&full_id)
            };
            print_line!(
                "{:<36}  {:<8} {:<20} {:<8} {:<11} {:<8}",
                shown_id,
                text("Datacenter"),
                text("Name"),
                node["Drain"].as_bool().unwrap_or(false),
                text("SchedulingEligibility"),
                text("Status")
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let node: Value = client.get(&format!("/v1/node/{id}")).await?;
    if json {
        super::output::print_json(&node)?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = |k: &str| super::output::one_line(node[k].as_str().unwrap_or_default());
    print_line!("ID          = {}", text("ID"));
    print_line!("Name        = {}", text("Name"));
    print_line!("DC          = {}", text("Datacenter"));
    print_line!("Pool        = {}", text("NodePool"));
    print_line!("Drain       = {}", node["Drain"].as_bool().unwrap_or(false));
    print_line!("Eligibility = {}", text("SchedulingEligibility"));
    print_line!("Status      = {}", text("Status"));
    if let Some(drivers) = node["Drivers"].as_object() {
        let names: Vec<&str> = drivers.keys().map(String::as_str).collect();
        print_line!(
            "Drivers     = {}",
            super::output::one_line(&names.join(","))
        );
    }
    let allocs: Value = client
        .get(&format!(
            "/v1/node/{}/allocations",
            node["ID"].as_str().unwrap_or(id)
        ))
        .await?;
    print_line!("\nAllocations");
    let allocs = allocs.as_array().cloned().unwrap_or_default();
    if allocs.is_empty() {
        print_line!("No allocations placed");
    } else {
        print_line!(
            "{:<10} {:<24} {:<8} {:<10}",
            "ID",
            "Name",
            "Desired",
            "Status"
        );
        for alloc in allocs {
            let text = |k: &str| super::output::one_line(alloc[k].as_str().unwrap_or_default());
            let alloc_id = text("ID").to_string();
            print_line!(
                "{:<10} {:<24} {:<8} {:<10}",
                alloc_id.get(..8).unwrap_or(&alloc_id),
                text("Name"),
                text("DesiredStatus"),
                text("ClientStatus")
            );
        }
    }
    if verbose && let Some(attributes) = node["Attributes"].as_object() {
        print_line!("\nAttributes");
        for (key, value) in attributes {
            print_line!(
                "{} = {}",
                super::output::one_line(key),
                super::output::one_line(value.as_str().unwrap_or_default())
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn eligibility(
    client: &Client,
    id: &str,
    enable: bool,
) -> anyhow::Result<ExitCode> {
    let node = full_id(client, id).await?;
    let eligibility = if enable { "eligible" } else { "ineligible" };
    let _: Value = client
        .post(
            &format!("/v1/node/{node}/eligibility"),
            &serde_json::json!({"NodeID": node, "Eligibility": eligibility}),
        )
        .await?;
    print_line!(
        "Node {:?} scheduling eligibility set: {} for scheduling",
        node,
        eligibility
    );
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn drain(
    client: &Client,
    id: &str,
    enable: bool,
    deadline: Option<std::time::Duration>,
) -> anyhow::Result<ExitCode> {
    let node = full_id(client, id).await?;
    let body = if enable {
        let nanos = deadline.map_or(3_600_000_000_000i64, |d| {
            i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
        });
        serde_json::json!({"NodeID": node, "DrainSpec": {"Deadline": nanos, "IgnoreSystemJobs": false}})
    } else {
        serde_json::json!({"NodeID": node, "DrainSpec": null, "MarkEligible": true})
    };
    let _: Value = client
        .post(&format!("/v1/node/{node}/drain"), &body)
        .await?;
    if enable {
        print_line!(
            "Node {:?} drain strategy set: its allocs are moved to other nodes",
            node
        );
    } else {
        print_line!(
            "Node {:?} drain strategy unset: the node is eligible again",
            node
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A node's full id from a prefix (as Nomad's CLI resolves it), or its name.
async fn full_id(client: &Client, id: &str) -> anyhow::Result<String> {
    let nodes: Value = client.get("/v1/nodes").await?;
    let matching: Vec<String> = nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| {
            n["ID"].as_str().is_some_and(|i| i.starts_with(id)) || n["Name"].as_str() == Some(id)
        })
        .filter_map(|n| n["ID"].as_str().map(str::to_string))
        .collect();
    match matching.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(anyhow::format_err!("no node matches {id:?}")),
        many => Err(anyhow::format_err!(
            "{id:?} matches {} nodes: give more of the id",
            many.len()
        )),
    }
}
