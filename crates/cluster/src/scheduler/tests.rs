//! The scheduler's plan on snapshots built by hand.

use super::*;

pub(crate) mod tests_support {
    use super::*;
    use crate::{NodeRecord, NodeView};

    pub fn node(name: &str, cpu_mhz: u64, memory_mb: u64) -> NodeView {
        let mut attributes = BTreeMap::new();
        attributes.insert("attr.kernel.name".into(), "linux".into());
        attributes.insert("node.unique.name".into(), name.into());
        NodeView {
            record: NodeRecord {
                id: format!("id-{name}"),
                name: name.into(),
                datacenter: "dc1".into(),
                node_pool: "default".into(),
                node_class: String::new(),
                http_addr: None,
                attributes,
                drivers: [("exec".to_string(), true)].into_iter().collect(),
                host_volumes: Vec::new(),
                host_volume_paths: Default::default(),
                eligibility: "eligible".into(),
                drain: false,
                cpu_mhz,
                memory_mb,
                disk_mb: 0,
                reserved: Default::default(),
                reserved_ports: Vec::new(),
                registered_ms: 0,
            },
            status: "ready",
        }
    }

    pub fn job(id: &str, count: u32, extra: &str) -> (ClusterJob, i64) {
        let source = format!(
            "job \"{id}\" {{\n  group \"g\" {{\n    count = {count}\n    {extra}\n    task \"t\" {{\n      driver = \"exec\"\n      config {{\n        command = \"/bin/true\"\n      }}\n      resources {{\n        cpu = 100\n        memory = 100\n      }}\n    }}\n  }}\n}}\n"
        );
        (
            ClusterJob {
                id: id.into(),
                source_name: format!("{id}.hcl"),
                source,
                variables: Default::default(),
                submitted_ms: 0,
                stopped: false,
                may_run_plugins: false,
                child_of: None,
                by_operator: false,
                owner: None,
                typed: None,
            },
            7,
        )
    }

    /// Alloc `alloc_id` of `job("web", 1, "")` (its `g[0]`) placed on node `a` for job
    /// version `job_version`.
    pub fn web_placement(alloc_id: &str, job_version: i64) -> Placement {
        Placement {
            alloc_id: alloc_id.into(),
            job_id: "web".into(),
            job_version,
            group: "g".into(),
            group_index: 0,
            alloc_index: 0,
            name: "web.g[0]".into(),
            node_id: "id-a".into(),
            cpu_mhz: 100,
            memory_mb: 100,
            disk_mb: 0,
            static_ports: Vec::new(),
            replaces: None,
            placed_ms: 0,
            reschedule_events: Vec::new(),
            stop_requested: false,
        }
    }
}

mod placement {
    use super::tests_support::*;
    use super::*;

    fn per_node(plan: &Plan) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for p in &plan.place {
            *counts.entry(p.node_id.clone()).or_default() += 1;
        }
        counts
    }

    #[test]
    fn a_groups_count_spreads_over_equal_nodes_and_packs_when_one_is_full() {
        let snapshot = Snapshot {
            jobs: vec![job("web", 6, "")],
            nodes: vec![
                node("a", 4000, 4096),
                node("b", 4000, 4096),
                node("c", 4000, 4096),
            ],
            ..Snapshot::default()
        };
        let plan = plan(&snapshot, 1);
        assert_eq!(
            per_node(&plan).values().copied().collect::<Vec<_>>(),
            [2, 2, 2],
            "{plan:#?}"
        );
        // Indexes 0..6, each once, for the job's current version.
        let mut indexes: Vec<u32> = plan.place.iter().map(|p| p.alloc_index).collect();
        indexes.sort();
        assert_eq!(indexes, [0, 1, 2, 3, 4, 5]);
        assert!(plan.place.iter().all(|p| p.job_version == 7));
        // Room for only one alloc on a (memory): the rest go where they fit.
        let snapshot = Snapshot {
            jobs: vec![job("web", 6, "")],
            nodes: vec![node("a", 4000, 150), node("b", 4000, 4096)],
            ..Snapshot::default()
        };
        let counts = per_node(&plan_of(&snapshot));
        assert_eq!(counts.get("id-a"), Some(&1), "{counts:?}");
        assert_eq!(counts.get("id-b"), Some(&5), "{counts:?}");
    }

    fn plan_of(snapshot: &Snapshot) -> Plan {
        plan(snapshot, 1)
    }

    /// A node takes allocs against its totals less what it reserves, disk (its data
    /// dir's filesystem, against `ephemeral_disk`) included, as Nomad places them.
    #[test]
    fn allocs_are_placed_against_what_the_node_does_not_reserve_disk_included() {
        let mut roomy = node("a", 4000, 4096);
        roomy.record.reserved.memory_mb = 3896;
        let (mut web, version) = job("web", 3, "");
        // Each alloc: 100 MHz, 100 MB memory, 300 MB disk.
        web.source = web.source.replace(
            "    task \"t\"",
            "    ephemeral_disk {\n      size = 300\n    }\n    task \"t\"",
        );
        let plan = plan_of(&Snapshot {
            jobs: vec![(web.clone(), version)],
            nodes: vec![roomy],
            ..Snapshot::default()
        });
        // 200 MB of memory left: two allocs of 100.
        assert_eq!(plan.place.len(), 2, "{plan:#?}");
        // Said as Nomad's "Resources exhausted", with what the node had left.
        assert_eq!(
            plan.blocked[0].why, "1 node(s) evaluated: Resources exhausted: memory (0 MiB free)",
            "{plan:#?}"
        );

        let mut small_disk = node("a", 4000, 4096);
        small_disk.record.disk_mb = 1000;
        small_disk.record.reserved.disk_mb = 300;
        let plan = plan_of(&Snapshot {
            jobs: vec![(web, version)],
            nodes: vec![small_disk],
            ..Snapshot::default()
        });
        // 700 MB of disk left: two allocs of 300.
        assert_eq!(plan.place.len(), 2, "{plan:#?}");
        assert!(plan.place.iter().all(|p| p.disk_mb == 300));
        assert_eq!(
            plan.blocked[0].why, "1 node(s) evaluated: Resources exhausted: disk (100 MiB free)",
            "{plan:#?}"
        );
        assert_eq!(plan.blocked[0].reasons["disk exhausted"], 1);
    }

    /// A job whose stored record cannot be read (a damaged typed job) keeps its allocs
    /// and what they hold; nothing is stopped for it, and the other jobs are placed.
    #[test]
    fn a_job_whose_record_cannot_be_read_keeps_its_allocs() {
        let (mut damaged, version) = job("damaged", 1, "");
        damaged.typed = Some(crate::typed::TypedJob {
            schema: crate::typed::JOB_SCHEMA,
            job: serde_json::json!({"groups": 7}),
        });
        // Placed while its record still read: 3,900 of the node's 4,096 MB.
        let (readable, _) = job("damaged", 1, "");
        let mut placed = plan_of(&Snapshot {
            jobs: vec![(readable, version)],
            nodes: vec![node("a", 4000, 4096)],
            ..Snapshot::default()
        })
        .place;
        placed[0].memory_mb = 3900;
        let plan = plan_of(&Snapshot {
            jobs: vec![(damaged, version), job("web", 2, "")],
            nodes: vec![node("a", 4000, 4096)],
            placements: placed,
            ..Snapshot::default()
        });
        assert!(plan.stop.is_empty(), "{plan:#?}");
        assert!(plan.place.iter().all(|p| p.job_id == "web"), "{plan:#?}");
        // What it holds still counts: room for one web alloc of 100 MB, not two.
        assert_eq!(plan.place.len(), 1, "{plan:#?}");
    }

    /// A static port is one alloc's on a node: a group of two allocs with one static
    /// port places one per node, and waits for a second node.
    #[test]
    fn a_static_port_takes_one_alloc_per_node() {
        let port = "network {\n      port \"http\" {\n        static = 8080\n      }\n    }";
        let plan = plan_of(&Snapshot {
            jobs: vec![job("web", 2, port)],
            nodes: vec![node("a", 4000, 4096)],
            ..Snapshot::default()
        });
        assert_eq!(plan.place.len(), 1, "{plan:#?}");
        assert_eq!(plan.place[0].static_ports, [8080]);
        assert_eq!(plan.blocked[0].reasons["port 8080 in use"], 1, "{plan:#?}");
        let plan = plan_of(&Snapshot {
            jobs: vec![job("web", 2, port)],
            nodes: vec![node("a", 4000, 4096), node("b", 4000, 4096)],
            ..Snapshot::default()
        });
        assert_eq!(per_node(&plan).len(), 2, "{plan:#?}");
    }

    /// A job submitted again takes the room its old allocs leave before a job that was
    /// waiting for it: jobs with pending evaluations are placed first, oldest first.
    #[test]
    fn a_resubmitted_job_keeps_its_port_before_a_waiting_job_takes_it() {
        let port = "network {\n      port \"http\" {\n        static = 8080\n      }\n    }";
        let (holder, _) = job("holder", 1, port);
        let old = plan_of(&Snapshot {
            jobs: vec![(holder.clone(), 7)],
            nodes: vec![node("a", 4000, 4096)],
            ..Snapshot::default()
        })
        .place;
        let mut eval = crate::evals::Evaluation::pending("holder", "job-register");
        eval.create_revision = 9;
        let snapshot = Snapshot {
            // "a-waiter" sorts first, and waits for the port.
            jobs: vec![job("a-waiter", 1, port), (holder, 9)],
            nodes: vec![node("a", 4000, 4096)],
            placements: old,
            evals: vec![eval],
            ..Snapshot::default()
        };
        let plan = plan_of(&snapshot);
        assert_eq!(plan.place.len(), 1, "{plan:#?}");
        assert_eq!(plan.place[0].job_id, "holder", "{plan:#?}");
        assert_eq!(plan.blocked[0].job_id, "a-waiter", "{plan:#?}");
        // Without the pending evaluation, by name: the waiter first.
        let plan = plan_of(&Snapshot {
            evals: Vec::new(),
            ..snapshot
        });
        assert_eq!(plan.place[0].job_id, "a-waiter", "{plan:#?}");
    }

    /// Nodes outside a job's datacenters are not evaluated (a glob, as Nomad's), and a
    /// job whose datacenters have no node waits, saying so.
    #[test]
    fn only_nodes_in_the_jobs_datacenters_are_evaluated() {
        let mut west = node("w", 4000, 4096);
        west.record.datacenter = "eu-west-1a".into();
        let mut east = node("e", 4000, 4096);
        east.record.datacenter = "eu-east-1a".into();
        let small = node("s", 4000, 4096);
        let (mut web, version) = job("web", 4, "");
        web.source = web
            .source
            .replacen("  group", "  datacenters = [\"eu-*\"]\n  group", 1);
        let plan = plan_of(&Snapshot {
            jobs: vec![(web.clone(), version)],
            nodes: vec![west.clone(), east, small.clone()],
            ..Snapshot::default()
        });
        assert_eq!(
            per_node(&plan),
            [("id-e".to_string(), 2), ("id-w".to_string(), 2)].into(),
            "{plan:#?}"
        );
        // Full where it may run: two nodes evaluated, not three.
        let (mut big, version) = job("big", 1, "");
        big.source = big
            .source
            .replacen("  group", "  datacenters = [\"eu-west-*\"]\n  group", 1)
            .replace("memory = 100", "memory = 5000");
        let plan = plan_of(&Snapshot {
            jobs: vec![(big.clone(), version)],
            nodes: vec![west, small.clone()],
            ..Snapshot::default()
        });
        assert_eq!(plan.blocked[0].nodes_evaluated, 1, "{plan:#?}");
        assert_eq!(
            plan.blocked[0].why,
            "1 node(s) evaluated: Resources exhausted: memory (4096 MiB free)"
        );
        let plan = plan_of(&Snapshot {
            jobs: vec![(big, version)],
            nodes: vec![small],
            ..Snapshot::default()
        });
        assert_eq!(plan.blocked[0].nodes_evaluated, 0, "{plan:#?}");
        assert_eq!(
            plan.blocked[0].why,
            "no node is ready in datacenters \"eu-west-*\""
        );
    }

    /// Constraints see meta merged down to them, job then group then task, on a
    /// cluster as on a lone agent (one check, `jobspec::constraint::unmet`): a task's
    /// constraint on its own meta holds, and a group's meta wins over the job's.
    #[test]
    fn constraints_see_the_meta_merged_down_to_them_as_a_lone_agent_does() {
        let (mut cluster_job, version) = job("meta", 1, "");
        cluster_job.source = r#"job "meta" {
  meta { tier = "bronze" }
  group "g" {
    meta { tier = "gold" }
    constraint {
      attribute = "${meta.tier}"
      value     = "gold"
    }
    task "t" {
      driver = "exec"
      meta { rack = "r1" }
      constraint {
        attribute = "${meta.rack}"
        value     = "r1"
      }
      config {
        command = "/bin/true"
      }
    }
  }
}
"#
        .into();
        let parsed = cluster_job.spec().unwrap();
        let attributes = &node("a", 4000, 4096).record.attributes;
        for group in [None, Some(&parsed.groups[0])] {
            let unmet = berth_jobspec::constraint::unmet(&parsed, group, attributes);
            assert!(unmet.is_empty(), "{unmet:?}");
        }
        let snapshot = Snapshot {
            jobs: vec![(cluster_job, version)],
            nodes: vec![node("a", 4000, 4096)],
            ..Snapshot::default()
        };
        let plan = plan_of(&snapshot);
        assert_eq!(plan.place.len(), 1, "{plan:#?}");
    }

    #[test]
    fn a_job_that_fits_nowhere_says_what_ruled_out_how_many_nodes() {
        let snapshot = Snapshot {
            jobs: vec![job(
                "big",
                1,
                "constraint {\n      attribute = \"${attr.kernel.name}\"\n      value = \"windows\"\n    }",
            )],
            nodes: vec![node("a", 4000, 4096), node("b", 4000, 50)],
            ..Snapshot::default()
        };
        let plan = plan_of(&snapshot);
        assert!(plan.place.is_empty());
        assert_eq!(plan.blocked.len(), 1);
        let why = &plan.blocked[0].why;
        assert!(
            why.starts_with("2 node(s) evaluated")
                && why.contains("constraint ${attr.kernel.name} = \"windows\" (2)"),
            "{why}"
        );
    }

    #[test]
    fn allocs_of_a_down_node_are_lost_and_replaced_and_a_done_batch_alloc_is_not() {
        let (web, version) = job("web", 2, "");
        let placed = |index: u32, node: &str| Placement {
            alloc_id: format!("alloc-{index}"),
            job_id: "web".into(),
            job_version: version,
            group: "g".into(),
            group_index: 0,
            alloc_index: index,
            name: format!("web.g[{index}]"),
            node_id: format!("id-{node}"),
            cpu_mhz: 100,
            memory_mb: 100,
            disk_mb: 0,
            static_ports: Vec::new(),
            replaces: None,
            placed_ms: 0,
            reschedule_events: Vec::new(),
            stop_requested: false,
        };
        let snapshot = Snapshot {
            jobs: vec![(web, version)],
            // Node "gone" has no key any more: its lease expired.
            nodes: vec![node("a", 4000, 4096)],
            placements: vec![placed(0, "a"), placed(1, "gone")],
            ..Snapshot::default()
        };
        let plan = plan_of(&snapshot);
        assert_eq!(plan.lost.len(), 1);
        assert_eq!(plan.lost[0].alloc_id, "alloc-1");
        assert_eq!(plan.lost[0].client_status, ClientStatus::Lost);
        assert_eq!(plan.stop, [("id-gone".to_string(), "alloc-1".to_string())]);
        assert_eq!(plan.place.len(), 1);
        assert_eq!(plan.place[0].alloc_index, 1);
        assert_eq!(plan.place[0].node_id, "id-a");
        assert_eq!(plan.place[0].replaces.as_deref(), Some("alloc-1"));
        // A batch alloc that completed on the node before it went: done, not placed again.
        let mut done = snapshot.clone();
        done.reports.push(AllocReport {
            alloc_id: "alloc-1".into(),
            job_id: "web".into(),
            name: "web.g[1]".into(),
            node_id: "id-gone".into(),
            node_name: "gone".into(),
            client_status: ClientStatus::Complete,
            description: String::new(),
            updated_ms: 0,
            tasks: Default::default(),
        });
        let plan = plan_of(&done);
        assert!(plan.lost.is_empty() && plan.place.is_empty(), "{plan:#?}");
        // ... nor in any later round: its placement stays, the record that it is done.
        assert!(
            !plan.stop.iter().any(|(_, alloc)| alloc == "alloc-1"),
            "{plan:#?}"
        );
        let mut next = done.clone();
        next.placements
            .retain(|p| !plan.stop.iter().any(|(_, alloc)| *alloc == p.alloc_id));
        let plan = plan_of(&next);
        assert!(plan.place.is_empty(), "{plan:#?}");
    }

    #[test]
    fn a_new_version_replaces_every_alloc_and_a_stopped_job_keeps_none() {
        let (web, _) = job("web", 1, "");
        let old = web_placement("old", 3);
        let snapshot = Snapshot {
            jobs: vec![(web.clone(), 7)],
            nodes: vec![node("a", 4000, 4096)],
            placements: vec![old.clone()],
            ..Snapshot::default()
        };
        let plan = plan_of(&snapshot);
        assert_eq!(plan.stop, [("id-a".to_string(), "old".to_string())]);
        assert_eq!(plan.place.len(), 1);
        let mut stopped = web;
        stopped.stopped = true;
        let snapshot = Snapshot {
            jobs: vec![(stopped, 7)],
            placements: vec![Placement {
                job_version: 7,
                ..old
            }],
            ..snapshot
        };
        let plan = plan_of(&snapshot);
        assert_eq!(plan.stop.len(), 1);
        assert!(plan.place.is_empty());
    }

    /// Nomad's `alloc stop`: the marked alloc is removed (its node stops it) and its
    /// group's alloc placed again, naming the one it replaces; its room is held this
    /// round, so a replacement needing its static port waits for the next.
    #[test]
    fn an_alloc_asked_to_stop_is_stopped_and_replaced() {
        let (web, _) = job("web", 1, "");
        let running = web_placement("asked", 7);
        let snapshot = Snapshot {
            jobs: vec![(web.clone(), 7)],
            nodes: vec![node("a", 4000, 4096)],
            placements: vec![running.clone()],
            ..Snapshot::default()
        };
        // Unmarked, it stays.
        let plan = plan_of(&snapshot);
        assert!(plan.stop.is_empty() && plan.place.is_empty(), "{plan:#?}");
        let asked = Placement {
            stop_requested: true,
            ..running.clone()
        };
        let snapshot = Snapshot {
            placements: vec![asked.clone()],
            ..snapshot
        };
        let plan = plan_of(&snapshot);
        assert_eq!(plan.stop, [("id-a".to_string(), "asked".to_string())]);
        assert_eq!(plan.place.len(), 1, "{plan:#?}");
        assert_eq!(plan.place[0].replaces.as_deref(), Some("asked"));
        assert_ne!(plan.place[0].alloc_id, "asked");
        // With a static port on the only node: not placed beside it this round.
        let ported = Placement {
            static_ports: vec![8080],
            ..asked
        };
        let snapshot = Snapshot {
            jobs: vec![(
                job(
                    "web",
                    1,
                    "network {\n      port \"http\" {\n        static = 8080\n      }\n    }",
                )
                .0,
                7,
            )],
            placements: vec![ported],
            ..snapshot
        };
        let plan = plan_of(&snapshot);
        assert_eq!(plan.stop.len(), 1, "{plan:#?}");
        assert!(plan.place.is_empty(), "{plan:#?}");
    }

    #[test]
    fn a_draining_or_ineligible_node_gets_nothing_new() {
        let mut drained = node("a", 4000, 4096);
        drained.record.drain = true;
        let mut ineligible = node("b", 4000, 4096);
        ineligible.record.eligibility = "ineligible".into();
        let snapshot = Snapshot {
            jobs: vec![job("web", 2, "")],
            nodes: vec![drained, ineligible, node("c", 4000, 4096)],
            ..Snapshot::default()
        };
        let counts = per_node(&plan_of(&snapshot));
        assert_eq!(
            counts.into_iter().collect::<Vec<_>>(),
            [("id-c".to_string(), 2)]
        );
    }
}

mod bounded_tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn what_fits_nowhere_is_one_small_record_per_group_however_big_the_job() {
        let long = "w".repeat(10_000);
        let snapshot = Snapshot {
            jobs: vec![job(
                "big",
                10_000,
                &format!(
                    "constraint {{\n      attribute = \"${{attr.kernel.name}}\"\n      value = \"{long}\"\n    }}"
                ),
            )],
            nodes: vec![node("a", 4000, 4096), node("b", 4000, 4096)],
            ..Snapshot::default()
        };
        let plan = plan(&snapshot, 1);
        assert!(plan.place.is_empty());
        assert_eq!(plan.blocked.len(), 1, "one record for the group");
        assert_eq!(plan.blocked[0].coalesced, 9_999);
        let size = serde_json::to_vec(&plan.blocked).unwrap().len();
        assert!(size < 2_000, "{size} bytes");
    }
}

mod forgetting_tests {
    use super::tests_support::*;
    use super::*;

    #[test]
    fn reports_of_purged_jobs_and_old_ends_are_forgotten_and_live_ones_kept() {
        let report = |alloc: &str, job: &str, updated_ms: u64| AllocReport {
            alloc_id: alloc.into(),
            job_id: job.into(),
            name: format!("{job}.g[0]"),
            node_id: "id-a".into(),
            node_name: "a".into(),
            client_status: ClientStatus::Complete,
            description: String::new(),
            updated_ms,
            tasks: Default::default(),
        };
        let now = 10 * REPORTS_KEPT_MS;
        let snapshot = Snapshot {
            jobs: vec![job("web", 0, "")],
            nodes: vec![node("a", 4000, 4096)],
            reports: vec![
                report("purged", "gone", now),
                report("recent", "web", now - 1000),
                report("old", "web", now - 2 * REPORTS_KEPT_MS),
            ],
            ..Snapshot::default()
        };
        let mut snapshot = snapshot;
        let forgotten = plan(&snapshot, now);
        assert_eq!(forgotten.forget, ["purged", "old"]);
        // A report a CSI claim names stays: the claim of a lost alloc is released from
        // it, and a purged job's lost alloc would otherwise hold its volume for good.
        snapshot.csi.claimed_allocs.insert("purged".into());
        assert_eq!(plan(&snapshot, now).forget, ["old"]);
    }
}

mod drain_tests {
    use super::tests_support::*;
    use super::*;
    use crate::state::NodeSettings;

    #[test]
    fn a_drained_alloc_stops_once_its_replacement_runs_or_the_deadline_passes() {
        let (web, version) = job("web", 1, "");
        let mut draining = node("a", 4000, 4096);
        draining.record.drain = true;
        let old = Placement {
            alloc_id: "old".into(),
            job_id: "web".into(),
            job_version: version,
            group: "g".into(),
            group_index: 0,
            alloc_index: 0,
            name: "web.g[0]".into(),
            node_id: "id-a".into(),
            cpu_mhz: 100,
            memory_mb: 100,
            disk_mb: 0,
            static_ports: Vec::new(),
            replaces: None,
            placed_ms: 0,
            reschedule_events: Vec::new(),
            stop_requested: false,
        };
        let running = |alloc: &str, node: &str| AllocReport {
            alloc_id: alloc.into(),
            job_id: "web".into(),
            name: "web.g[0]".into(),
            node_id: format!("id-{node}"),
            node_name: node.into(),
            client_status: ClientStatus::Running,
            description: String::new(),
            updated_ms: 0,
            tasks: Default::default(),
        };
        let mut snapshot = Snapshot {
            jobs: vec![(web, version)],
            nodes: vec![draining, node("b", 4000, 4096)],
            placements: vec![old.clone()],
            reports: vec![running("old", "a")],
            ..Snapshot::default()
        };
        // Round 1: the replacement is placed on b; the old alloc keeps running.
        let first = plan(&snapshot, 1);
        assert!(first.stop.is_empty(), "{first:#?}");
        assert_eq!(first.place.len(), 1);
        assert_eq!(first.place[0].node_id, "id-b");
        assert_eq!(first.place[0].replaces.as_deref(), Some("old"));
        // Round 2: placed, not yet running: nothing changes.
        let new = first.place[0].clone();
        snapshot.placements.push(new.clone());
        let second = plan(&snapshot, 2);
        assert!(
            second.stop.is_empty() && second.place.is_empty(),
            "{second:#?}"
        );
        // Round 3: the replacement runs: the old one stops.
        let mut replaced = snapshot.clone();
        replaced.reports.push(running(&new.alloc_id, "b"));
        let third = plan(&replaced, 3);
        assert_eq!(third.stop, [("id-a".to_string(), "old".to_string())]);
        // Or the deadline passed, replacement running or not.
        snapshot.node_settings.push((
            "id-a".into(),
            NodeSettings {
                ineligible: false,
                drain: true,
                drain_deadline_ms: 10,
            },
        ));
        assert!(plan(&snapshot, 9).stop.is_empty());
        assert_eq!(plan(&snapshot, 10).stop.len(), 1);
    }
}

mod busy {
    use super::tests_support::*;
    use super::*;

    /// An agent too busy to evaluate a job (its evaluating threads full, as a flood of
    /// reads made them in an attack review) defers the round: the job's allocs are not
    /// stopped as if it were unreadable, and it is planned again soon.
    #[test]
    fn a_job_the_agent_is_too_busy_to_evaluate_defers_the_round_and_stops_nothing() {
        let (web, version) = job("web", 2, "");
        let mut snapshot = Snapshot {
            revision: 10,
            jobs: vec![(web.clone(), version)],
            nodes: vec![node("a", 4000, 4000)],
            ..Snapshot::default()
        };
        let placed = plan(&snapshot, 1_000);
        assert_eq!(placed.place.len(), 2);
        snapshot.placements = placed.place;
        let busy = |_: &ClusterJob| {
            Err(berth_jobspec::JobspecError {
                file: "web.hcl".into(),
                problems: vec![berth_hcl::Problem {
                    path: "jobspec".into(),
                    at: None,
                    message: berth_jobspec::pool::PoolError::Busy.to_string(),
                }],
            })
        };
        let deferred = plan_with(&snapshot, 2_000, busy, &BTreeMap::new());
        assert!(deferred.deferred);
        assert!(
            deferred.stop.is_empty() && deferred.place.is_empty(),
            "{deferred:?}"
        );
        assert_eq!(deferred.wake_at_ms, Some(2_000 + DEFERRED_RETRY_MS));
        // A job that really cannot be evaluated is another matter: not deferred.
        let unreadable = |_: &ClusterJob| {
            Err(berth_jobspec::JobspecError {
                file: "web.hcl".into(),
                problems: vec![berth_hcl::Problem {
                    path: "job".into(),
                    at: None,
                    message: "a real problem".into(),
                }],
            })
        };
        assert!(!plan_with(&snapshot, 2_000, unreadable, &BTreeMap::new()).deferred);
    }
}
