//! Workload identities across a cluster: a task on node `a` gets its JWT in its env and
//! in `secrets/`; node `b` serves the cluster's JWKS with no token, and PyJWT (a JWT
//! library people use) verifies `a`'s token against it, with Nomad's claims. The key
//! rotates (a short `root_key_rotation_threshold`), the file's token is renewed before
//! its `ttl` under the new key, and the first token still verifies: keys are kept.

use std::time::{Duration, Instant};

use berth_harness::AgentProcess;
use berth_model::status::ClientStatus;
use berth_testkit::etcd::EtcdServer;
use serde_json::Value;

const VERIFY: &str = r#"
import json, sys, jwt
jwks = json.loads(sys.argv[1])
token = sys.argv[2].strip()
keys = jwt.PyJWKSet.from_dict(jwks)
kid = jwt.get_unverified_header(token)["kid"]
key = next(k for k in keys.keys if k.key_id == kid)
# A few seconds of leeway: the 3s tokens here may age past their exp on a loaded
# machine between their read and this check.
claims = jwt.decode(token, key=key.key, algorithms=["EdDSA"], audience=sys.argv[3],
                    options={"verify_exp": sys.argv[4] == "1"}, leeway=10)
print(json.dumps({"kid": kid, "claims": claims}))
"#;

/// The claims of `token` as PyJWT verifies them against `jwks`, with its `kid`.
fn verified(jwks: &str, token: &str, audience: &str, check_expiry: bool) -> Value {
    let output = std::process::Command::new("python3")
        .args(["-c", VERIFY, jwks, token, audience])
        .arg(if check_expiry { "1" } else { "0" })
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "PyJWT refused the token: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// `GET /.well-known/jwks.json` over TCP with curl, and no token.
fn jwks_of(port: u16) -> String {
    let output = std::process::Command::new("curl")
        .args([
            "-sSf",
            &format!("http://127.0.0.1:{port}/.well-known/jwks.json"),
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tasks_identity_verifies_against_another_nodes_jwks_and_is_renewed_as_keys_rotate() {
    let etcd = EtcdServer::start();
    let node = |name: &'static str, datacenter: &'static str| {
        let endpoint = etcd.endpoint();
        AgentProcess::production(move |port, dir| {
            format!(
                "name = \"{name}\"\ndatacenter = \"{datacenter}\"\n\
                 cluster {{\n  store = \"etcd\"\n  endpoints = [\"{endpoint}\"]\n  \
                 prefix = \"/identity\"\n}}\n\
                 keyring {{\n  root_key_rotation_threshold = \"4s\"\n}}\n\
                 http {{\n  address = \"127.0.0.1:{port}\"\n  token_file = \"{}/api-token\"\n}}\n",
                dir.display()
            )
        })
    };
    let mut a = node("a", "id");
    let mut b = node("b", "other");
    a.start().await;
    b.start().await;
    let submitted = b
        .submit(
            "identity.hcl",
            r#"job "identity" {
  datacenters = ["id"]
  group "g" {
    task "t" {
      driver = "exec"
      identity {
        env  = true
        file = true
        aud  = ["berth.test"]
        ttl  = "3s"
      }
      identity {
        name = "vault"
        aud  = ["vault.io"]
        file = true
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo \"token $NOMAD_TOKEN\"; stat -c 'file %u %a' secrets/nomad_token; echo \"me $(id -u)\"; sleep 300"]
      }
    }
  }
}
"#,
        )
        .await
        .unwrap();
    let alloc = submitted.alloc_ids[0].clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    let stdout = loop {
        let stdout = a.task_stdout(&alloc, "t");
        if stdout.contains("\nme ") {
            break stdout;
        }
        assert!(Instant::now() < deadline, "{stdout}\n{}", a.output());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let line = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("{prefix}: {stdout}"))
            .to_string()
    };
    let env_token = line("token ");
    let me = line("me ");
    assert_eq!(
        line("file "),
        format!("{me} 600"),
        "the task's own, and only its"
    );
    let secrets = a
        .path()
        .join("data/allocs")
        .join(&alloc)
        .join("tasks/t/secrets");
    let file_token = std::fs::read_to_string(secrets.join("nomad_token")).unwrap();
    assert_eq!(file_token, env_token, "one token for the start");

    // Node b's JWKS, read with no token, verifies node a's token.
    let jwks = jwks_of(b.port());
    let first = verified(&jwks, &env_token, "berth.test", true);
    let published: Value = serde_json::from_str(&jwks).unwrap();
    assert!(
        published["keys"].as_array().unwrap().len() >= 2,
        "the next period's key is published before it signs: {published:#}"
    );
    let claims = &first["claims"];
    assert_eq!(claims["nomad_job_id"], "identity");
    assert_eq!(claims["nomad_allocation_id"], alloc.as_str());
    assert_eq!(claims["nomad_task"], "t");
    assert_eq!(claims["nomad_namespace"], "default");
    assert_eq!(claims["sub"], "global:default:identity:g:t:default");
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
        3
    );
    let vault = std::fs::read_to_string(secrets.join("nomad_vault.jwt")).unwrap();
    let named = verified(&jwks, &vault, "vault.io", true);
    assert_eq!(named["claims"]["sub"], "global:default:identity:g:t:vault");
    // Another audience is refused.
    let wrong = std::process::Command::new("python3")
        .args(["-c", VERIFY, &jwks, &env_token, "vault.io", "1"])
        .output()
        .unwrap();
    assert!(!wrong.status.success());

    // Renewed before its ttl, and, past a rotation, under the next key.
    // Expiry is not checked here: on a loaded machine a 3s token can expire between its
    // read and PyJWT's check (the first token's was checked above).
    let deadline = Instant::now() + Duration::from_secs(20);
    let renewed = loop {
        let now = std::fs::read_to_string(secrets.join("nomad_token")).unwrap();
        if now != env_token {
            // Right after the renewal, from either node.
            let renewed = verified(&jwks_of(b.port()), &now, "berth.test", false);
            let jwks = jwks_of(a.port());
            verified(&jwks, &now, "berth.test", false);
            assert_eq!(
                renewed["claims"]["exp"].as_u64().unwrap()
                    - renewed["claims"]["iat"].as_u64().unwrap(),
                3,
                "a renewed token has the same ttl"
            );
            if renewed["kid"] != first["kid"] {
                break (renewed, jwks);
            }
        }
        assert!(Instant::now() < deadline, "never renewed under a new key");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let (renewed, jwks) = renewed;
    assert_eq!(renewed["claims"]["nomad_allocation_id"], alloc.as_str());
    let keys: Value = serde_json::from_str(&jwks).unwrap();
    assert!(keys["keys"].as_array().unwrap().len() >= 2, "{keys:#}");
    // The first token (expired by now) still has its key.
    verified(&jwks, &env_token, "berth.test", false);
    assert_eq!(
        a.alloc(&alloc).await.client_status,
        ClientStatus::Running,
        "renewing left the task running (change_mode noop)"
    );
}
