//! Compiles the protocol definitions with tonic/prost. The `.proto` files are parsed by
//! protox, a protobuf compiler written in Rust, so the build needs no system `protoc`.

const PROTOS: &[&str] = &[
    "berth/bench/v1/plugin.proto",
    "csi/v1/csi.proto",
    "grpc/health/v1/health.proto",
];

/// etcd's v3 API, under its own include root (its files import each other as `etcd/...`).
const ETCD_ROOT: &str = "etcd-v3";
const ETCD_PROTOS: &[&str] = &[
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for (protos, root) in [(PROTOS, "."), (ETCD_PROTOS, ETCD_ROOT)] {
        let descriptors = protox::compile(protos, [root])?;
        tonic_prost_build::configure()
            // The agent is a gRPC client only; servers exist for test plugins and benches.
            .server_mod_attribute(".", "#[cfg(feature = \"server\")]")
            .compile_fds(descriptors)?;
    }
    println!("cargo:rerun-if-changed=berth");
    println!("cargo:rerun-if-changed=csi");
    println!("cargo:rerun-if-changed=grpc");
    println!("cargo:rerun-if-changed={ETCD_ROOT}");
    Ok(())
}
