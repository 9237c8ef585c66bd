fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/polis/config.proto",
        "proto/polis/state.proto",
        "proto/polis/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
