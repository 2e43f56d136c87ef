//! Compiles the protocol definitions with tonic/prost. The `.proto` files are parsed by
//! protox, a protobuf compiler written in Rust, so the build needs no system `protoc`.

const PROTOS: &[&str] = &["berth/bench/v1/plugin.proto", "csi/v1/csi.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(PROTOS, ["."])?;
    tonic_prost_build::configure()
        // The agent is a gRPC client only; servers exist for test plugins and benches.
        .server_mod_attribute(".", "#[cfg(feature = \"server\")]")
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=berth");
    println!("cargo:rerun-if-changed=csi");
    Ok(())
}
