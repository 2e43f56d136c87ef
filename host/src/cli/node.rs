//! `berth node status|eligibility|drain`: the cluster's nodes, through Nomad's node
//! endpoints, in Nomad's words. On an agent with no cluster block there is one node.

use std::process::ExitCode;

use serde_json::Value;

use super::nomad_shapes::typed;
use super::output::{one_line, print_line};
use berth_api::client::Client;
use berth_nomad_api::allocs::AllocationListStub;
use berth_nomad_api::nodes::{
    DrainSpec, Node, NodeDrainRequest, NodeEligibilityRequest, NodeListStub,
};

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
        let nodes: Vec<NodeListStub> = typed(nodes)?;
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
            let full_id = one_line(&node.id);
            let shown_id = if verbose {
                &*full_id
            } else {
                full_id.get(..8).unwrap_or(&full_id)
            };
            print_line!(
                "{:<36}  {:<8} {:<20} {:<8} {:<11} {:<8}",
                shown_id,
                one_line(&node.datacenter),
                one_line(&node.name),
                node.drain,
                one_line(&node.scheduling_eligibility),
                one_line(&node.status)
            );
        }
        return Ok(ExitCode::SUCCESS);
    };
    let node: Value = client.get(&format!("/v1/node/{id}")).await?;
    if json {
        super::output::print_json(&node)?;
        return Ok(ExitCode::SUCCESS);
    }
    let node: Node = typed(node)?;
    let stub = &node.stub;
    print_line!("ID          = {}", one_line(&stub.id));
    print_line!("Name        = {}", one_line(&stub.name));
    print_line!("DC          = {}", one_line(&stub.datacenter));
    print_line!("Pool        = {}", one_line(&stub.node_pool));
    print_line!("Drain       = {}", stub.drain);
    print_line!("Eligibility = {}", one_line(&stub.scheduling_eligibility));
    print_line!("Status      = {}", one_line(&stub.status));
    if !stub.drivers.is_empty() {
        let names: Vec<&str> = stub.drivers.keys().map(String::as_str).collect();
        print_line!("Drivers     = {}", one_line(&names.join(",")));
    }
    let node_id = if stub.id.is_empty() { id } else { &stub.id };
    let allocs: Vec<AllocationListStub> = client
        .get(&format!("/v1/node/{node_id}/allocations"))
        .await?;
    print_line!("\nAllocations");
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
            let alloc_id = one_line(&alloc.id);
            print_line!(
                "{:<10} {:<24} {:<8} {:<10}",
                alloc_id.get(..8).unwrap_or(&alloc_id),
                one_line(&alloc.name),
                one_line(&alloc.desired_status),
                one_line(&alloc.client_status)
            );
        }
    }
    if verbose && !node.attributes.is_empty() {
        print_line!("\nAttributes");
        for (key, value) in &node.attributes {
            print_line!("{} = {}", one_line(key), one_line(value));
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
            &NodeEligibilityRequest {
                node_id: node.clone(),
                eligibility: eligibility.into(),
            },
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
        NodeDrainRequest {
            node_id: node.clone(),
            drain_spec: Some(DrainSpec {
                deadline: nanos,
                ignore_system_jobs: false,
            }),
            mark_eligible: false,
        }
    } else {
        NodeDrainRequest {
            node_id: node.clone(),
            drain_spec: None,
            mark_eligible: true,
        }
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
    let nodes: Vec<NodeListStub> = client.get("/v1/nodes").await?;
    let matching: Vec<String> = nodes
        .into_iter()
        .filter(|n| n.id.starts_with(id) || n.name == id)
        .map(|n| n.id)
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
