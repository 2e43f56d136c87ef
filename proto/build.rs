//! Compiles the protocol definitions with tonic/prost (needs `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure()
        .compile_protos(&["berth/bench/v1/plugin.proto", "csi/v1/csi.proto"], &["."])?;
    println!("cargo:rerun-if-changed=berth");
    println!("cargo:rerun-if-changed=csi");
    Ok(())
}
