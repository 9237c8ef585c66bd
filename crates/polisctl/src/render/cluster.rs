//! The cluster's information, as `cluster info` shows it. May not talk to the cluster.

use proto::api;
use serde_json::json;

use crate::output::{self, Format, escape};

/// `cluster info`: the CA fingerprint, the cluster domain, the curators, the node count.
pub(crate) fn print_cluster_info(info: api::GetClusterInfoResponse, format: Format) {
    let fingerprint = rpc::fingerprint(&info.ca_certificate);
    let domain = info
        .cluster_configuration
        .map(|c| c.cluster_domain)
        .unwrap_or_default();
    let value = json!({
        "ca_fingerprint": fingerprint,
        "cluster_domain": domain,
        "curator_endpoints": info.curator_endpoints,
        "node_count": info.node_count,
    });
    match format {
        Format::Quiet => {}
        Format::Json => println!("{value}"),
        Format::Yaml => print!("{}", output::yaml(&value)),
        Format::Table => {
            println!("CA fingerprint:    SHA256:{fingerprint}");
            println!("Cluster domain:    {}", escape(&domain));
            println!(
                "Curators:          {}",
                escape(&info.curator_endpoints.join(", "))
            );
            println!("Nodes:             {}", info.node_count);
        }
    }
}
