//! Client plumbing: a tonic channel over our own rustls configuration.

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint};

use crate::RpcError;
use crate::tls::{Credentials, ServerTrust, client_config};

/// Default port of the curator.
pub const CURATOR_PORT: u16 = 7835;

/// Parses `HOST` or `HOST:PORT` (IP addresses; curators are addressed by IP).
pub fn parse_endpoint(endpoint: &str) -> Result<SocketAddr, RpcError> {
    if let Ok(addr) = endpoint.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Ok(ip) = endpoint
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        return Ok(SocketAddr::new(ip, CURATOR_PORT));
    }
    Err(RpcError::BadEndpoint {
        endpoint: endpoint.to_string(),
    })
}

/// Connects to a curator at `endpoint` over TLS and HTTP/2.
pub async fn connect(
    endpoint: SocketAddr,
    trust: &ServerTrust,
    client: Option<&Credentials>,
) -> Result<Channel, RpcError> {
    let connector = tokio_rustls::TlsConnector::from(client_config(trust, client)?);
    let server_name = ServerName::IpAddress(endpoint.ip().into());
    let uri = format!("http://{endpoint}");
    Endpoint::from_shared(uri.clone())
        .map_err(|_| RpcError::BadEndpoint { endpoint: uri })?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .connect_with_connector(tower::service_fn(move |_| {
            let (connector, server_name) = (connector.clone(), server_name.clone());
            async move {
                let tcp = tokio::net::TcpStream::connect(endpoint).await?;
                tcp.set_nodelay(true)?;
                let tls = connector.connect(server_name, tcp).await?;
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| RpcError::Connect {
            endpoint,
            reason: supervisor::error_chain(&e),
        })
}

/// The curator leader's endpoint, as the curator behind `channel` knows it.
pub async fn leader_endpoint(channel: Channel) -> Option<SocketAddr> {
    let leader = proto::api::curator_local_client::CuratorLocalClient::new(channel)
        .get_current_leader(proto::api::GetCurrentLeaderRequest {})
        .await
        .ok()?
        .into_inner();
    leader.leader_endpoint.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            parse_endpoint("127.0.0.2").unwrap(),
            "127.0.0.2:7835".parse().unwrap()
        );
        assert_eq!(
            parse_endpoint("127.0.0.2:9000").unwrap(),
            "127.0.0.2:9000".parse().unwrap()
        );
        assert_eq!(
            parse_endpoint("[::1]:7835").unwrap(),
            "[::1]:7835".parse().unwrap()
        );
        assert_eq!(
            parse_endpoint("::1").unwrap(),
            "[::1]:7835".parse().unwrap()
        );
        assert!(parse_endpoint("example.com").is_err());
        assert!(parse_endpoint("").is_err());
    }
}
