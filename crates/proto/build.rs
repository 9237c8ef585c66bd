fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/polis/config.proto",
        "proto/polis/state.proto",
        "proto/polis/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("polis_descriptor.bin"))
        .build_server(true)
        .build_client(true)
        // Every WatchNode stream sends the CRL with every update: one buffer shared by
        // all of them (a reference count per message, not a copy per stream).
        .bytes(".polis.api.WatchNodeUpdate.cluster_crl")
        // The same for the trusted CAs and their CRLs.
        .bytes(".polis.api.WatchNodeUpdate.cluster_cas")
        .bytes(".polis.api.WatchNodeUpdate.cluster_crls")
        .bytes(".polis.api.WatchNodeUpdate.etcd_peer_cas")
        .compile_protos(&protos, &["proto"])?;
    Ok(())
}
