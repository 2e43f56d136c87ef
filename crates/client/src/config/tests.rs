//! The agent config's tests: each block parsed, and each mistake named.

use berth_model::cluster::{ClientCert, EtcdAuth, EtcdTls};
use berth_model::hook::OnFailure;

use super::*;

#[test]
fn etcd_tls_and_auth_parse_and_their_mistakes_name_the_field() {
    let cluster = |body: &str| {
        AgentConfig::parse(
            "agent.hcl",
            &format!("cluster {{\n  store = \"etcd\"\n{body}}}\n"),
        )
    };
    let config = cluster(
        "  endpoints = [\"https://10.0.0.5:2379\"]\n  ca_file = \"/e/ca.pem\"\n  \
         cert_file = \"/e/c.pem\"\n  key_file = \"/e/k.pem\"\n  username = \"berth\"\n  \
         password_file = \"/e/pw\"\n",
    )
    .unwrap();
    let settings = config.cluster;
    assert_eq!(
        settings.tls,
        Some(EtcdTls {
            ca_file: "/e/ca.pem".into(),
            client_cert: Some(ClientCert {
                cert_file: "/e/c.pem".into(),
                key_file: "/e/k.pem".into(),
            }),
        })
    );
    assert_eq!(
        settings.auth,
        Some(EtcdAuth {
            username: "berth".into(),
            password_file: "/e/pw".into(),
        })
    );
    assert!(settings.presents_credentials());
    assert!(!ClusterSettings::default().presents_credentials());
    for (body, expected) in [
        (
            "  endpoints = [\"https://e:2379\"]\n",
            "config.cluster.endpoints: \"https://e:2379\" is a TLS endpoint: set ca_file",
        ),
        (
            "  endpoints = [\"https://e:2379\", \"http://f:2379\"]\n  ca_file = \"/ca\"\n",
            "config.cluster.endpoints: \"http://f:2379\" is plain HTTP, but ca_file is set",
        ),
        (
            "  endpoints = [\"https://e:2379\"]\n  ca_file = \"/ca\"\n  cert_file = \"/c\"\n",
            "config.cluster.cert_file: is set without key_file",
        ),
        (
            "  username = \"berth\"\n  password = \"hunter2\"\n",
            "config.cluster.password: berth takes etcd's password only from a file",
        ),
        (
            "  username = \"berth\"\n",
            "config.cluster.password_file: is needed with username",
        ),
        (
            "  username = \"berth\"\n  password_file = \"pw\"\n",
            "config.cluster.password_file: \"pw\" must be an absolute path",
        ),
    ] {
        let error = cluster(body).unwrap_err().to_string();
        assert!(error.contains(expected), "{body}: {error}");
    }
}

#[test]
fn parses_host_volumes() {
    let config = AgentConfig::parse(
        "agent.hcl",
        "plugin_dir = \"/p\"\nhost_volume \"data\" {\n  path = \"/srv/data\"\n  read_only = true\n}\n",
    )
    .unwrap();
    assert_eq!(config.plugin_dir, Some(PathBuf::from("/p")));
    assert_eq!(
        config.host_volume("data"),
        Some(&HostVolume {
            name: "data".into(),
            path: "/srv/data".into(),
            read_only: true,
            allow_setuid: false,
        })
    );
}

#[test]
fn parses_what_the_node_reserves() {
    let config = AgentConfig::parse(
        "agent.hcl",
        "reserved {\n  cpu = 500\n  memory = 512\n  disk = 1024\n}\n",
    )
    .unwrap();
    assert_eq!(
        config.reserved,
        NodeResources {
            cpu_mhz: 500,
            memory_mb: 512,
            disk_mb: 1024,
        }
    );
    assert_eq!(AgentConfig::default().reserved, NodeResources::default());
    let error = AgentConfig::parse("agent.hcl", "reserved {\n  cores = 2\n}\n").unwrap_err();
    assert!(error.to_string().contains("cores"), "{error}");
}

#[test]
fn parses_hooks_with_their_limits() {
    let config = AgentConfig::parse(
        "agent.hcl",
        "hook \"policy\" {\n  path = \"/h/policy.wasm\"\n  config = { deny = \"raw_exec\" }\n  timeout = \"250ms\"\n  memory_max = \"16MiB\"\n  on_failure = \"ignore\"\n  all_tasks = true\n}\nhook \"env\" {\n  path = \"/h/env.wasm\"\n}\n",
    )
    .unwrap();
    let policy = &config.hooks[0];
    assert_eq!(policy.name, "policy");
    assert_eq!(policy.config, vec![("deny".into(), "raw_exec".into())]);
    assert_eq!(policy.timeout, std::time::Duration::from_millis(250));
    assert_eq!(policy.memory_max, 16 << 20);
    assert_eq!(policy.on_failure, OnFailure::Ignore);
    assert!(policy.all_tasks);
    let env = &config.hooks[1];
    assert_eq!(env.timeout, HookSpec::DEFAULT_TIMEOUT);
    assert_eq!(env.on_failure, OnFailure::Fail);
    assert!(!env.all_tasks);
}

#[test]
fn bad_hook_settings_are_named() {
    let error = AgentConfig::parse(
        "agent.hcl",
        "hook \"h\" {\n  path = \"h.wasm\"\n  memory_max = \"lots\"\n  on_failure = \"retry\"\n}\n",
    )
    .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains("config.hook.h.path: \"h.wasm\" must be an absolute path"),
        "{text}"
    );
    assert!(
        text.contains("config.hook.h.memory_max: \"lots\" is not a size: unknown unit \"lots\""),
        "{text}"
    );
    assert!(text.contains("unknown on_failure \"retry\""), "{text}");
}

#[test]
fn absurd_sizes_and_durations_are_errors_not_panics() {
    let error = AgentConfig::parse(
        "agent.hcl",
        "hook \"h\" {\n  path = \"/h.wasm\"\n  memory_max = \"99999999999999GiB\"\n  timeout = \"9999999999999999h\"\n}\nhook \"small\" {\n  path = \"/s.wasm\"\n  memory_max = \"512KiB\"\n}\n",
    )
    .unwrap_err()
    .to_string();
    for expected in [
        "agent.hcl:3:",
        "config.hook.h.memory_max: \"99999999999999GiB\" is not a size: is too large (at most 8EiB)",
        "agent.hcl:4:",
        "config.hook.h.timeout: \"9999999999999999h\" is not a duration: is too large (at most 876000h)",
        "config.hook.small.memory_max: must be at least 1MiB and at most 4GiB",
    ] {
        assert!(
            error.contains(expected),
            "missing {expected:?} in:\n{error}"
        );
    }
}

#[test]
fn inline_secrets_in_a_readable_config_are_warned_about() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agent.hcl");
    let text = "http {\n  address = \"127.0.0.1:4646\"\n  token \"ci\" {\n    secret = \"ci-secret-0123456789\"\n    scope = \"submit\"\n  }\n}\n";
    std::fs::write(&path, text).unwrap();
    let config = AgentConfig::parse_file(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let warning = config.exposed_secrets_warning(&path).unwrap();
    assert!(
        warning.contains("holds http token secrets and other users can read it (mode 644)"),
        "{warning}"
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(config.exposed_secrets_warning(&path), None);
    // No inline secret, nothing to say.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(AgentConfig::default().exposed_secrets_warning(&path), None);
}

#[test]
fn only_the_operator_lets_a_driver_run_unconfined() {
    let config = AgentConfig::parse(
        "agent.hcl",
        "plugin \"exec\" {\n  allow_unconfined = false\n}\nplugin \"vendor\" {\n  path = \"/p/vendor.wasm\"\n  allow_unconfined = true\n}\n",
    )
    .unwrap();
    let vendor = Path::new("/p/vendor.wasm");
    assert!(!config.allows_unconfined("exec", None));
    assert!(config.allows_unconfined("vendor", Some(vendor)));
    // Another file that reports the name gets nothing of the grant.
    assert!(!config.allows_unconfined("vendor", Some(Path::new("/p/squatter.wasm"))));
    assert!(!config.allows_unconfined("unlisted", Some(vendor)));
    assert!(
        !config.allows_unconfined("raw_exec", None),
        "raw_exec needs enabled = true"
    );
    // A file reporting raw_exec is not the built-in raw_exec.
    let enabled = AgentConfig::parse(
        "agent.hcl",
        "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
    )
    .unwrap();
    assert!(enabled.allows_unconfined("raw_exec", None));
    assert!(!enabled.allows_unconfined("raw_exec", Some(vendor)));
    let unnamed = AgentConfig::parse(
        "agent.hcl",
        "plugin \"vendor\" {\n  allow_unconfined = true\n}\n",
    )
    .unwrap_err();
    assert!(
        unnamed
            .to_string()
            .contains("allow_unconfined names no file"),
        "{unnamed}"
    );
}

/// A job's `kill_timeout` is capped at `max_kill_timeout` (Nomad's 30 s unless set),
/// and the disk's inodes per MB are the operator's to set.
#[test]
fn kill_timeouts_are_capped_and_inodes_per_mb_read() {
    use std::time::Duration;
    let unset = AgentConfig::parse("agent.hcl", "").unwrap();
    assert_eq!(
        unset.kill_timeout_of(Duration::from_secs(3600)),
        Duration::from_secs(30)
    );
    assert_eq!(
        unset.kill_timeout_of(Duration::from_secs(5)),
        Duration::from_secs(5)
    );
    let set = AgentConfig::parse(
        "agent.hcl",
        "max_kill_timeout = \"2m\"\nephemeral_disk_inodes_per_mb = 64\n",
    )
    .unwrap();
    assert_eq!(
        set.kill_timeout_of(Duration::from_secs(3600)),
        Duration::from_secs(120)
    );
    assert_eq!(set.ephemeral_disk_inodes_per_mb, Some(64));
    let bad = AgentConfig::parse("agent.hcl", "max_kill_timeout = \"soon\"\n").unwrap_err();
    assert!(bad.to_string().contains("max_kill_timeout"), "{bad}");
}

/// A dynamic range holds only ids setuid(2) and chown(2) take as ids: never -1
/// (attack review: "1-4294967295" hung the alloc on a panic in the task runner).
#[test]
fn a_dynamic_range_past_2_pow_31_is_refused() {
    let parse = |range: &str| {
        AgentConfig::parse(
            "agent.hcl",
            &format!("user {{\n  dynamic_range = \"{range}\"\n}}\n"),
        )
    };
    assert_eq!(
        parse("80000-89999").unwrap().users.dynamic_range,
        80_000..=89_999
    );
    for bad in ["4294967290-4294967295", "1-2147483648", "0-10", "20-10"] {
        let error = parse(bad).unwrap_err().to_string();
        assert!(error.contains("is not a range of uids"), "{bad}: {error}");
    }
    let wide = "user {\n  dynamic_range = \"1-2147483647\"\n}\nimage {\n  userns = \"host\"\n}\n";
    assert!(AgentConfig::parse("agent.hcl", wide).is_ok());
}

/// Each dynamic uid's block of 65536 subordinate ids (a task on an image's, in its own
/// user namespace) must fit below 2^31 and beside the dynamic range.
#[test]
fn subordinate_ids_follow_the_dynamic_range_and_must_fit() {
    let parse = |text: &str| AgentConfig::parse("agent.hcl", text);
    let defaults = parse("").unwrap();
    assert!(defaults.image.private_user_namespaces);
    assert_eq!(
        defaults.users.subordinate_ids(),
        Some(1_000_000_000..=1_655_359_999)
    );
    assert_eq!(
        defaults.users.subordinate_block(80_000),
        Some(1_000_000_000)
    );
    assert_eq!(
        defaults.users.subordinate_block(80_002),
        Some(1_000_131_072)
    );
    assert_eq!(defaults.users.subordinate_block(79_999), None);
    assert_eq!(defaults.users.subordinate_block(90_000), None);
    let error = parse("user {\n  dynamic_range = \"80000-199999\"\n}\n")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("each of the 120000 ids of dynamic_range gets a block of 65536")
            && error.contains("image { userns = \"host\" }"),
        "{error}"
    );
    let overlapping = parse("user {\n  subordinate_base = 50000\n}\n").unwrap_err();
    assert!(
        overlapping.to_string().contains("subordinate_base"),
        "{overlapping}"
    );
    let moved = parse("user {\n  subordinate_base = 100000\n}\n").unwrap();
    assert_eq!(moved.users.subordinate_block(80_001), Some(165_536));
    let host = parse("image {\n  userns = \"host\"\n}\n").unwrap();
    assert!(!host.image.private_user_namespaces);
    let bad = parse("image {\n  userns = \"shared\"\n}\n").unwrap_err();
    assert!(
        bad.to_string()
            .contains("\"shared\" is no user namespace mode"),
        "{bad}"
    );
}

#[test]
fn the_instance_pool_is_sized_by_the_operator() {
    let unset = AgentConfig::parse("agent.hcl", "").unwrap();
    assert_eq!(unset.max_plugin_instances, None);
    let set = AgentConfig::parse("agent.hcl", "max_plugin_instances = 2048\n").unwrap();
    assert_eq!(set.max_plugin_instances, Some(2048));
    let tiny = AgentConfig::parse("agent.hcl", "max_plugin_instances = 1\n").unwrap();
    assert_eq!(
        tiny.max_plugin_instances,
        Some(16),
        "a floor that loading needs"
    );
    let error = AgentConfig::parse("agent.hcl", "max_plugin_instances = 9999999\n")
        .unwrap_err()
        .to_string();
    assert!(error.contains("agent.hcl:1:"), "{error}");
}

#[test]
fn cgroup_settings_have_defaults_and_checked_values() {
    let defaults = AgentConfig::parse("agent.hcl", "").unwrap().cgroups;
    assert_eq!(defaults, CgroupSettings::default());
    let set = AgentConfig::parse(
        "agent.hcl",
        "cgroups {\n  parent = \"ops/berth\"\n  pids_max = 512\n  allow_missing_controllers = true\n  \
         favor_dynmods = true\n}\n",
    )
    .unwrap()
    .cgroups;
    assert_eq!(
        set,
        CgroupSettings {
            parent: "ops/berth".into(),
            pids_max: 512,
            all_tasks_pids_max: None,
            job_pids_max: None,
            allow_missing_controllers: true,
            favor_dynmods: true,
        }
    );
    let error = AgentConfig::parse(
        "agent.hcl",
        "cgroups {\n  parent = \"../escape\"\n  pids_max = 2\n}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("agent.hcl:2:"), "{error}");
    assert!(
        error.contains(
            "\"../escape\" is not a cgroup path berth can use: names of letters, digits, \
             '.', '_' and '-', separated by '/'"
        ),
        "{error}"
    );
    assert!(error.contains("agent.hcl:3:"), "{error}");
    assert!(
        error.contains("2 is too few processes for any task (at least 8)"),
        "{error}"
    );
    let share = AgentConfig::parse(
        "agent.hcl",
        "cgroups {\n  all_tasks_pids_max = 9000\n  job_pids_max = 5000\n}\n",
    )
    .unwrap()
    .cgroups;
    assert_eq!(share.job_pids_max, Some(5000));
    let error = AgentConfig::parse(
        "agent.hcl",
        "cgroups {\n  pids_max = 100\n  all_tasks_pids_max = 200\n  job_pids_max = 300\n}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains(
            "300 is more processes than all tasks together may have \
             (all_tasks_pids_max = 200)"
        ),
        "{error}"
    );
    let error = AgentConfig::parse(
        "agent.hcl",
        "cgroups {\n  pids_max = 100\n  job_pids_max = 50\n}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("50 is fewer processes than one task may have (pids_max = 100)"),
        "{error}"
    );
}

#[test]
fn mock_is_off_unless_the_operator_turns_it_on_and_other_drivers_are_on() {
    let off = AgentConfig::parse("agent.hcl", "").unwrap();
    assert!(!off.driver_enabled("mock"));
    assert!(off.driver_enabled("exec"));
    assert!(off.driver_enabled("vendor"));
    let on = AgentConfig::parse(
        "agent.hcl",
        "plugin \"mock\" {\n  config {\n    enabled = true\n  }\n}\n",
    )
    .unwrap();
    assert!(on.driver_enabled("mock"));
    assert!(!on.raw_exec_enabled(), "enabling mock enabled raw_exec");
    // Enabling mock lets it run; it never lets anything spawn unconfined.
    assert!(!on.allows_unconfined("mock", None));
}

#[test]
fn raw_exec_is_off_unless_the_operator_turns_it_on() {
    let off = AgentConfig::parse("agent.hcl", "").unwrap();
    assert!(!off.raw_exec_enabled());
    let on = AgentConfig::parse(
        "agent.hcl",
        "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n",
    )
    .unwrap();
    assert!(on.raw_exec_enabled());
    let explicit_off = AgentConfig::parse(
        "agent.hcl",
        "plugin \"raw_exec\" {\n  config {\n    enabled = false\n  }\n}\n",
    )
    .unwrap();
    assert!(!explicit_off.raw_exec_enabled());
    let error = AgentConfig::parse(
        "agent.hcl",
        "plugin \"raw_exec\" {\n  config {\n    enabled = \"yes\"\n    volumes = true\n  }\n}\n",
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("agent.hcl:3:"), "{error}");
    assert!(
        error.contains(
            "config.plugin.raw_exec.config.enabled: expected true or false, found a string"
        ),
        "{error}"
    );
    assert!(error.contains("unknown field \"volumes\""), "{error}");
}

#[test]
fn relative_host_volume_paths_are_refused() {
    let error =
        AgentConfig::parse("agent.hcl", "host_volume \"d\" {\n  path = \"srv\"\n}\n").unwrap_err();
    assert_eq!(
        error.problems[0].to_string(),
        "2:10: config.host_volume.d.path: \"srv\" must be an absolute path"
    );
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    const REAL: &str = include_str!("../../../../examples/csi/agent.hcl");

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Arbitrary text, and a real config with a stretch replaced, either parse or
        /// fail with problems: never a panic.
        #[test]
        fn any_text_or_edit(
            source in "\\PC{0,300}",
            at in any::<usize>(),
            patch in "[{}\"=a-z0-9 \n._-]{0,8}",
        ) {
            let _ = AgentConfig::parse("fuzz.hcl", &source);
            let mut at = at % (REAL.len() + 1);
            while !REAL.is_char_boundary(at) {
                at -= 1;
            }
            let edited = format!("{}{patch}{}", &REAL[..at], &REAL[at..]);
            if let Err(error) = AgentConfig::parse("fuzz.hcl", &edited) {
                prop_assert!(!error.problems.is_empty());
            }
        }
    }
}

#[test]
fn token_scopes_are_read_by_name_and_an_unknown_one_is_named() {
    let config = |scope: &str| {
        AgentConfig::parse(
            "agent.hcl",
            &format!(
                "http {{\n  address = \"127.0.0.1:4646\"\n  token \"t\" {{\n    secret = \"t-secret-0123456789\"\n    scope = \"{scope}\"\n  }}\n}}\n"
            ),
        )
    };
    for (name, scope) in [
        ("read", TokenScope::Read),
        ("submit", TokenScope::Submit),
        ("alloc-exec", TokenScope::AllocExec),
        ("plugin", TokenScope::Plugin),
    ] {
        let parsed = config(name).unwrap();
        assert_eq!(parsed.http.tokens[0].scope, scope, "{name}");
    }
    let refused = config("exec").unwrap_err().to_string();
    assert!(
        refused.contains(
            "unknown scope \"exec\" (use \"read\", \"submit\", \"alloc-exec\" or \"plugin\")"
        ),
        "{refused}"
    );
}
